//! How many events a writer puts into its next transaction. A batch that did not finish within
//! its deadline (`database.statement_timeout_ms`) would, sent again whole, most likely time out
//! again — on a database that writes fewer rows per second than the batch holds per deadline
//! (a slow disk, triggers of the user's own, a loaded server), for ever, with no record written.
//! So a timed-out batch is halved, and later batches stay that small until the database writes
//! them quickly again: one that takes less than a quarter of the deadline lets the size grow back
//! by an eighth, up to `pipeline.batch_max_events`. Pure: the writer reports what happened.

use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) struct BatchSize {
    max: usize,
    current: usize,
    deadline: Duration,
}

impl BatchSize {
    pub(crate) fn new(max: usize, deadline: Duration) -> Self {
        let max = max.max(1);
        BatchSize {
            max,
            current: max,
            deadline,
        }
    }

    /// The most events the next batch may hold.
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// A batch of `attempted` events did not finish within the deadline: returns how many of
    /// them to write again now (half, at least one); the size of later batches drops with it.
    pub(crate) fn timed_out(&mut self, attempted: usize) -> usize {
        let half = (attempted / 2).max(1);
        self.current = self.current.min(half);
        half
    }

    /// A batch of `written` events took `took`. Only a full batch says the size may grow: a
    /// small one written quickly says nothing about a larger one.
    pub(crate) fn written(&mut self, written: usize, took: Duration) {
        if written >= self.current && took < self.deadline / 4 {
            self.current = (self.current + self.current.div_ceil(8)).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);

    #[test]
    fn a_timed_out_batch_is_halved_down_to_one_event() {
        let mut size = BatchSize::new(1000, DEADLINE);
        assert_eq!(size.timed_out(1000), 500);
        assert_eq!(size.current(), 500);
        assert_eq!(size.timed_out(500), 250);
        assert_eq!(size.timed_out(3), 1);
        assert_eq!(size.timed_out(1), 1);
        assert_eq!(size.current(), 1);
    }

    #[test]
    fn a_small_batch_timing_out_does_not_raise_the_size() {
        let mut size = BatchSize::new(1000, DEADLINE);
        size.timed_out(1000);
        assert_eq!(size.timed_out(900), 450);
        assert_eq!(size.current(), 450);
    }

    #[test]
    fn only_full_batches_written_quickly_let_the_size_grow_back_to_the_max() {
        let mut size = BatchSize::new(1000, DEADLINE);
        size.timed_out(1000);
        size.timed_out(500);
        // Too slow to grow: it took more than a quarter of the deadline.
        size.written(250, Duration::from_secs(3));
        assert_eq!(size.current(), 250);
        // Not full: says nothing.
        size.written(10, Duration::from_millis(5));
        assert_eq!(size.current(), 250);
        size.written(250, Duration::from_millis(500));
        assert_eq!(size.current(), 282);
        let mut rounds = 0;
        while size.current() < 1000 {
            size.written(size.current(), Duration::from_millis(500));
            rounds += 1;
        }
        assert_eq!(size.current(), 1000);
        assert!(rounds <= 12, "{rounds} rounds to grow back");
        size.written(1000, Duration::from_millis(1));
        assert_eq!(size.current(), 1000);
    }
}
