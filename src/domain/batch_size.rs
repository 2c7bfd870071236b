//! How many events a writer puts into its next transaction.
//!
//! **Deadline.** A batch that did not finish within its deadline (`database.statement_timeout_ms`)
//! would, sent again whole, most likely time out again — on a database that writes fewer rows
//! per second than the batch holds per deadline (a slow disk, triggers of the user's own, a
//! loaded server), for ever, with no record written. So a timed-out batch is halved, and later
//! batches stay that small until the database writes them quickly again: one that takes less
//! than a quarter of the deadline lets the size grow back by an eighth, up to
//! `pipeline.batch_max_events`.
//!
//! **Aim** (`pipeline.batch_aim_ms`). An event waits for the transaction under way on its
//! writer, then lasts its own: on a database ten times slower than usual a full batch of a
//! thousand takes 400 ms, and a quiet partition's new event, arriving among a backlog, waits a
//! second and more. Where the database's time goes to rows (a trigger, an index, a slow disk),
//! a smaller batch is as quick per row, so full batches slower than the aim are made smaller,
//! towards it; where it goes to each commit (a flush, a distant server), a smaller batch only
//! writes fewer rows per second. So a shrink is judged: the time per row of the smaller
//! batches, measured over a few, must stay within a tenth of what it was before the shrinks
//! began, or the size goes back and stays for a while ([`HOLD`] batches). Full batches well
//! within the aim let the size grow back. Pure: the writer reports what happened.

use std::time::Duration;

/// Full batches whose times are averaged before the size moves: one batch's time is noisy.
const SAMPLES: u32 = 4;

/// How much slower per row the smaller batches may be than the batches before the shrinks
/// began: beyond it the rows per second lost are not worth the shorter transactions.
const ROW_COST_TOLERANCE: f64 = 1.10;

/// Full batches written at the restored size before another shrink is tried, after one that
/// cost too much per row.
pub(crate) const HOLD: u32 = 64;

/// The smallest batch the aim shrinks to (a timeout still halves down to one event).
const AIM_LEAST: usize = 16;

#[derive(Debug, Clone)]
pub(crate) struct BatchSize {
    max: usize,
    current: usize,
    deadline: Duration,
    aim: Option<Duration>,
    /// The full batches written at `current` since it last moved.
    samples: Samples,
    /// The time per row (seconds) of full batches before the aim's shrinks began: what a
    /// shrink is judged against. Cleared when the size is back at the max.
    reference: Option<f64>,
    /// The size before the last shrink, while that shrink is being judged.
    before_shrink: Option<usize>,
    /// Full batches still to write before another shrink may be tried.
    hold: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Samples {
    count: u32,
    rows: u64,
    seconds: f64,
}

impl Samples {
    fn per_row(&self) -> f64 {
        self.seconds / self.rows.max(1) as f64
    }

    fn mean(&self) -> Duration {
        Duration::from_secs_f64(self.seconds / f64::from(self.count.max(1)))
    }
}

/// What a change of size was, for the writer's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resized {
    /// Full batches lasted longer than the aim: smaller ones, towards it.
    Shrunk {
        from: usize,
        to: usize,
        took: Duration,
    },
    /// The smaller batches cost more per row than the tolerance: back to the size before.
    Restored { from: usize, to: usize },
    /// Full batches were quick: larger ones.
    Grown { from: usize, to: usize },
}

impl BatchSize {
    /// `aim`: how long a full batch's transaction is aimed to last; `None` writes full batches
    /// of `max` whatever they take (short of the deadline).
    pub(crate) fn new(max: usize, deadline: Duration, aim: Option<Duration>) -> Self {
        let max = max.max(1);
        BatchSize {
            max,
            current: max,
            deadline,
            aim,
            samples: Samples::default(),
            reference: None,
            before_shrink: None,
            hold: 0,
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
        // A timeout says smaller is needed: no shrink of the aim's is undone over it.
        self.before_shrink = None;
        if half < self.current {
            self.resize(half);
        }
        half
    }

    /// A batch of `written` events took `took`; returns how the size changed, if it did. A small
    /// batch written quickly says nothing about a larger one; a small one slower than the aim
    /// does (the budget may keep every batch short of the size: records of tens of kilobytes).
    pub(crate) fn written(&mut self, written: usize, took: Duration) -> Option<Resized> {
        let full = written >= self.current;
        let Some(aim) = self.aim else {
            if full && took < self.deadline / 4 && self.current < self.max {
                return Some(self.grow());
            }
            return None;
        };
        if !full && took <= aim {
            return None;
        }
        self.hold = self.hold.saturating_sub(1);
        self.samples.count += 1;
        self.samples.rows += written as u64;
        self.samples.seconds += took.as_secs_f64();
        if self.samples.count < SAMPLES {
            return None;
        }
        let per_row = self.samples.per_row();
        let mean = self.samples.mean();
        if let Some(before) = self.before_shrink.take() {
            let reference = self.reference.unwrap_or(per_row);
            if per_row > reference * ROW_COST_TOLERANCE {
                let from = self.current;
                self.resize(before);
                self.hold = HOLD;
                if before >= self.max {
                    self.reference = None;
                }
                return Some(Resized::Restored { from, to: before });
            }
        }
        if mean > aim && self.hold == 0 && self.current > AIM_LEAST {
            let from = self.current;
            let rows = self.samples.rows as f64 / f64::from(self.samples.count);
            let towards = (rows * aim.as_secs_f64() / mean.as_secs_f64()) as usize;
            let to = towards.clamp(from / 2, from - 1).max(AIM_LEAST.min(from));
            self.reference.get_or_insert(per_row);
            self.before_shrink = Some(from);
            self.resize(to);
            return Some(Resized::Shrunk {
                from,
                to,
                took: mean,
            });
        }
        let quick = mean < aim.mul_f64(0.75) && took < self.deadline / 4;
        if quick && self.current < self.max {
            return Some(self.grow());
        }
        self.samples = Samples::default();
        None
    }

    fn grow(&mut self) -> Resized {
        let from = self.current;
        let to = (from + from.div_ceil(8)).min(self.max);
        self.resize(to);
        if to >= self.max {
            self.reference = None;
        }
        Resized::Grown { from, to }
    }

    fn resize(&mut self, to: usize) {
        self.current = to;
        self.samples = Samples::default();
        self.before_shrink = self.before_shrink.filter(|before| *before > to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);
    const AIM: Duration = Duration::from_millis(200);

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// Writes full batches on a database whose transaction lasts `fixed` plus `per_row` for
    /// each row, until the size settles (or `rounds` batches); returns the size.
    fn settle(size: &mut BatchSize, fixed: Duration, per_row: Duration, rounds: usize) -> usize {
        for _ in 0..rounds {
            let rows = size.current();
            size.written(rows, fixed + per_row * rows as u32);
        }
        size.current()
    }

    #[test]
    fn a_timed_out_batch_is_halved_down_to_one_event() {
        let mut size = BatchSize::new(1000, DEADLINE, None);
        assert_eq!(size.timed_out(1000), 500);
        assert_eq!(size.current(), 500);
        assert_eq!(size.timed_out(500), 250);
        assert_eq!(size.timed_out(3), 1);
        assert_eq!(size.timed_out(1), 1);
        assert_eq!(size.current(), 1);
    }

    #[test]
    fn a_small_batch_timing_out_does_not_raise_the_size() {
        let mut size = BatchSize::new(1000, DEADLINE, None);
        size.timed_out(1000);
        assert_eq!(size.timed_out(900), 450);
        assert_eq!(size.current(), 450);
    }

    #[test]
    fn only_full_batches_written_quickly_let_the_size_grow_back_to_the_max() {
        let mut size = BatchSize::new(1000, DEADLINE, None);
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

    #[test]
    fn without_an_aim_slow_full_batches_keep_their_size() {
        let mut size = BatchSize::new(1000, DEADLINE, None);
        assert_eq!(
            settle(&mut size, ms(5), Duration::from_micros(400), 100),
            1000
        );
    }

    #[test]
    fn on_a_database_slow_per_row_full_batches_shrink_to_the_aim() {
        // 0.4 ms a row: a thousand take 405 ms; 200 ms is about 490 rows.
        let mut size = BatchSize::new(1000, DEADLINE, Some(AIM));
        let settled = settle(&mut size, ms(5), Duration::from_micros(400), 200);
        let took = ms(5) + Duration::from_micros(400) * settled as u32;
        assert!((400..=500).contains(&settled), "{settled}");
        assert!(took <= AIM, "{took:?}");
    }

    #[test]
    fn on_a_database_slow_per_commit_the_size_goes_back_and_holds() {
        // 300 ms a commit, 20 µs a row: a smaller batch is hardly quicker, and far slower per row.
        let mut size = BatchSize::new(1000, DEADLINE, Some(AIM));
        let (fixed, per_row) = (ms(300), Duration::from_micros(20));
        let mut smaller = 0;
        for _ in 0..(10 * HOLD as usize) {
            let rows = size.current();
            smaller += usize::from(rows < 1000);
            size.written(rows, fixed + per_row * rows as u32);
        }
        assert_eq!(size.current(), 1000);
        // A try costs its judging batches once per hold: a few in a hundred.
        assert!(
            smaller * 100 <= 10 * HOLD as usize * 8,
            "{smaller} smaller batches"
        );
    }

    #[test]
    fn a_shrink_that_costs_more_than_a_tenth_per_row_is_undone() {
        // 100 ms a commit and 0.3 ms a row: 400 ms a thousand, but 250 ms for 500 is a fifth
        // fewer rows per second.
        let mut size = BatchSize::new(1000, DEADLINE, Some(AIM));
        let (fixed, per_row) = (ms(100), Duration::from_micros(300));
        for _ in 0..SAMPLES {
            size.written(1000, fixed + per_row * 1000);
        }
        let shrunk = size.current();
        assert!(shrunk < 1000);
        let mut restored = None;
        for _ in 0..SAMPLES {
            restored = size.written(shrunk, fixed + per_row * shrunk as u32);
        }
        assert_eq!(
            restored,
            Some(Resized::Restored {
                from: shrunk,
                to: 1000
            })
        );
    }

    #[test]
    fn when_the_database_is_quick_again_the_size_grows_back_to_the_max() {
        let mut size = BatchSize::new(1000, DEADLINE, Some(AIM));
        assert!(settle(&mut size, ms(5), Duration::from_micros(400), 200) < 600);
        assert_eq!(
            settle(&mut size, ms(5), Duration::from_micros(30), 400),
            1000
        );
    }

    #[test]
    fn partial_batches_within_the_aim_say_nothing() {
        let mut size = BatchSize::new(1000, DEADLINE, Some(AIM));
        for _ in 0..100 {
            assert_eq!(size.written(999, ms(150)), None);
        }
        assert_eq!(size.current(), 1000);
    }

    #[test]
    fn partial_batches_slower_than_the_aim_shrink_the_size_too() {
        // The budget holds 300 records of tens of kilobytes: no batch is ever full.
        let mut size = BatchSize::new(1000, DEADLINE, Some(AIM));
        let per_row = Duration::from_micros(1500);
        for _ in 0..100 {
            let rows = size.current().min(300);
            size.written(rows, ms(5) + per_row * rows as u32);
        }
        let took = ms(5) + per_row * size.current().min(300) as u32;
        assert!(took <= AIM, "{} events take {took:?}", size.current());
        assert!(size.current() >= 100, "{}", size.current());
    }
}
