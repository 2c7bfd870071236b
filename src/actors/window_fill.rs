//! What one partition holds between the Kafka side and its window, shared by the two: the Kafka
//! side counts what it hands over and pauses the partition the moment that fills its window;
//! the partition actor counts what leaves its queue for the window and, once the window has
//! drained to half with nothing queued, asks the Kafka side to resume.
//!
//! The window (`pipeline.max_in_flight_per_partition`) is at least the instance's whole budget
//! of records, so a healthy partition — however few the partitions — never fills it: the
//! budget is the brake. It fills when a record at its head does not resolve (an event the
//! database rejects) while the records behind it do: then the partition alone is paused, and
//! the others keep the budget. Were the pause decided by the actor, it would come only after
//! the actor ran, and every record handed over until then would wait in its queue; so the
//! Kafka side decides, at hand-over. Only the Kafka side pauses and resumes, so the two never
//! disagree about the state.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub struct WindowFill {
    /// `pipeline.max_in_flight_per_partition`.
    limit: usize,
    /// Handed to the partition actor and not yet admitted to the window: in its mailbox, its
    /// queue, or an admission on its way.
    queued: AtomicUsize,
    /// The window's length as the partition actor last saw it.
    window: AtomicUsize,
    /// Fetching of the partition is paused because of its window. Changed by the Kafka side
    /// only.
    paused: AtomicBool,
}

impl std::fmt::Debug for WindowFill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowFill")
            .field("limit", &self.limit)
            .field("queued", &self.queued())
            .field("window", &self.window.load(Ordering::Acquire))
            .field("paused", &self.is_paused())
            .finish()
    }
}

impl WindowFill {
    pub fn new(limit: usize) -> Self {
        WindowFill {
            limit: limit.max(1),
            queued: AtomicUsize::new(0),
            window: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
        }
    }

    /// Kafka side: `count` records were handed to the partition actor. True when the
    /// partition is now full and was not paused yet: the caller pauses its fetching.
    pub fn handed_over(&self, count: usize) -> bool {
        let queued = self.queued.fetch_add(count, Ordering::AcqRel) + count;
        let full = queued + self.window.load(Ordering::Acquire) >= self.limit;
        full && !self.paused.swap(true, Ordering::AcqRel)
    }

    /// Partition actor: `count` queued records were admitted to the window (whose new length
    /// it reports with [`WindowFill::window`]).
    pub fn admitted(&self, count: usize) {
        self.queued.fetch_sub(count, Ordering::AcqRel);
    }

    /// Partition actor: the window now holds `window` records.
    pub fn window(&self, window: usize) {
        self.window.store(window, Ordering::Release);
    }

    /// Paused, with nothing queued and the window drained to half: time to fetch again.
    pub fn drained(&self) -> bool {
        self.paused.load(Ordering::Acquire)
            && self.queued.load(Ordering::Acquire) == 0
            && self.window.load(Ordering::Acquire) <= self.limit / 2
    }

    /// Kafka side, when the actor asked for the resume: true (and no longer paused) if it is
    /// still drained; false if records arrived meanwhile or it was resumed already.
    pub fn resume(&self) -> bool {
        self.drained() && self.paused.swap(false, Ordering::AcqRel)
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Records handed over and not yet admitted.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_pauses_once_when_what_it_holds_reaches_the_limit() {
        let window_fill = WindowFill::new(10);
        assert!(!window_fill.handed_over(4));
        window_fill.window(4);
        window_fill.admitted(4);
        assert!(!window_fill.handed_over(5), "9 held: room for one more");
        assert!(window_fill.handed_over(1), "10 held: full");
        assert!(!window_fill.handed_over(7), "already paused");
        assert!(window_fill.is_paused());
        assert_eq!(window_fill.queued(), 13);
    }

    #[test]
    fn records_still_queued_count_against_the_limit_before_they_reach_the_window() {
        let window_fill = WindowFill::new(10);
        assert!(
            window_fill.handed_over(10),
            "a burst fills it before the actor ran"
        );
    }

    #[test]
    fn it_resumes_only_when_nothing_is_queued_and_the_window_is_at_half() {
        let window_fill = WindowFill::new(10);
        assert!(window_fill.handed_over(12));
        window_fill.window(10);
        window_fill.admitted(10);
        assert!(!window_fill.drained(), "two still queued");
        window_fill.window(8);
        window_fill.admitted(2);
        assert!(!window_fill.drained(), "window above half");
        window_fill.window(5);
        assert!(window_fill.drained());
        assert!(window_fill.resume());
        assert!(!window_fill.is_paused());
        assert!(!window_fill.resume(), "a second request finds it resumed");
    }

    #[test]
    fn a_resume_request_overtaken_by_new_records_leaves_it_paused() {
        let window_fill = WindowFill::new(10);
        assert!(window_fill.handed_over(10));
        window_fill.window(0);
        window_fill.admitted(10);
        assert!(window_fill.drained(), "the actor asks for the resume");
        assert!(
            !window_fill.handed_over(3),
            "handed over before the request was served"
        );
        assert!(!window_fill.resume());
        assert!(window_fill.is_paused());
    }

    #[test]
    fn an_unpaused_partition_is_never_drained() {
        let window_fill = WindowFill::new(10);
        assert!(!window_fill.drained());
        assert!(!window_fill.resume());
    }
}
