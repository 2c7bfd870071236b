//! When a writer writes what it has gathered: at once when a batch is full or lingering is off,
//! otherwise once the batch has lingered its time, so that a trickle of records still shares
//! transactions. Pure: the caller passes the time and arms the timer, so the decision is tested
//! on any clock (the instant type is generic; the writer uses tokio's).

use std::ops::Add;
use std::time::Duration;

/// What to do with the jobs gathered so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<I> {
    /// Nothing gathered: nothing to write, nothing to wait for.
    Idle,
    /// Write a batch now.
    WriteNow,
    /// Wait for more jobs until this instant, then write whatever is there.
    WaitUntil(I),
}

/// The lingering of the batch being gathered: since when it waits, if it does.
#[derive(Debug, Clone, Copy)]
pub struct Linger<I> {
    batch_max: usize,
    linger: Duration,
    since: Option<I>,
}

impl<I: Copy + Ord + Add<Duration, Output = I>> Linger<I> {
    pub fn new(batch_max: usize, linger: Duration) -> Self {
        Linger {
            batch_max,
            linger,
            since: None,
        }
    }

    /// The decision for `gathered` jobs at `now`. The first call with jobs starts the batch's
    /// lingering; later calls (more jobs, the timer firing) keep its deadline.
    pub fn decide(&mut self, gathered: usize, now: I) -> Decision<I> {
        if gathered == 0 {
            self.since = None;
            return Decision::Idle;
        }
        if gathered >= self.batch_max || self.linger.is_zero() {
            return Decision::WriteNow;
        }
        let deadline = *self.since.get_or_insert(now) + self.linger;
        if now >= deadline {
            Decision::WriteNow
        } else {
            Decision::WaitUntil(deadline)
        }
    }

    /// A batch was taken for writing: what is gathered next lingers from its own start.
    pub fn taken(&mut self) {
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Times since an origin stand in for instants: the decision needs no clock.
    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn nothing_gathered_is_idle() {
        let mut linger = Linger::new(10, ms(5));
        assert_eq!(linger.decide(0, ms(0)), Decision::Idle);
    }

    #[test]
    fn a_full_batch_is_written_at_once() {
        let mut linger = Linger::new(10, ms(5));
        assert_eq!(linger.decide(3, ms(0)), Decision::WaitUntil(ms(5)));
        assert_eq!(linger.decide(10, ms(1)), Decision::WriteNow);
        assert_eq!(linger.decide(25, ms(1)), Decision::WriteNow);
    }

    #[test]
    fn without_lingering_any_job_is_written_at_once() {
        let mut linger = Linger::new(10, Duration::ZERO);
        assert_eq!(linger.decide(1, ms(0)), Decision::WriteNow);
    }

    #[test]
    fn the_deadline_is_kept_as_jobs_arrive_and_reached_at_linger() {
        let mut linger = Linger::new(10, ms(5));
        assert_eq!(linger.decide(1, ms(100)), Decision::WaitUntil(ms(105)));
        assert_eq!(linger.decide(4, ms(103)), Decision::WaitUntil(ms(105)));
        assert_eq!(linger.decide(4, ms(104)), Decision::WaitUntil(ms(105)));
        assert_eq!(linger.decide(4, ms(105)), Decision::WriteNow);
    }

    #[test]
    fn after_a_batch_is_taken_the_next_lingers_from_its_own_start() {
        let mut linger = Linger::new(10, ms(5));
        linger.decide(2, ms(0));
        linger.taken();
        assert_eq!(linger.decide(1, ms(50)), Decision::WaitUntil(ms(55)));
    }

    #[test]
    fn an_emptied_buffer_forgets_the_deadline() {
        let mut linger = Linger::new(10, ms(5));
        linger.decide(2, ms(0));
        assert_eq!(linger.decide(0, ms(3)), Decision::Idle);
        assert_eq!(linger.decide(1, ms(4)), Decision::WaitUntil(ms(9)));
    }
}
