//! How long the record stream waits for room in the budget before it pauses the whole
//! instance. The pause exists for a database that is *away* — hung, down, a lock held for
//! minutes — because librdkafka serves rebalance callbacks only while it is polled. A database
//! that is merely *slow* frees room at a pace of its own (a batch every 0.7 s, say), and
//! pausing it at every batch would throw away what the client prefetched, refetch it, and cut
//! the partitions' turns short, for no rebalance at all.
//!
//! So the wait is measured against the pace room came at lately: [`FACTOR`] times the longest
//! wait of the last [`RECENT`] (however it ended: a wait the instance paused for still counts
//! until the room it waited for), never shorter than the least the caller sets — a healthy
//! database frees room in milliseconds, so one that stops is paused for as soon as before — and
//! never longer than the most, which bounds what a rebalance waits for this member. Pure: the
//! caller measures the waits and tells the time.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A wait this many times the longest recent one is no longer the database's pace.
pub(crate) const FACTOR: u32 = 3;
/// How far back the waits are remembered: long enough to span a few slow batches, short enough
/// that a database that recovered is judged by its healthy pace again soon.
pub(crate) const RECENT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub(crate) struct RoomPatience {
    least: Duration,
    most: Duration,
    /// The recent waits that no later wait outlasted, longest first: the front is the longest
    /// of the last [`RECENT`] (a sliding maximum, so each wait is looked at a bounded number of
    /// times).
    longest: VecDeque<(Instant, Duration)>,
}

impl RoomPatience {
    pub(crate) fn new(least: Duration, most: Duration) -> Self {
        RoomPatience {
            least,
            most: most.max(least),
            longest: VecDeque::new(),
        }
    }

    /// A wait for room that ended at `now` after `waited`.
    pub(crate) fn waited(&mut self, now: Instant, waited: Duration) {
        while self
            .longest
            .back()
            .is_some_and(|&(_, longer)| longer <= waited)
        {
            self.longest.pop_back();
        }
        self.longest.push_back((now, waited));
        self.forget_before(now);
    }

    /// How long a wait for room beginning at `now` lasts before the instance pauses.
    pub(crate) fn limit(&mut self, now: Instant) -> Duration {
        self.forget_before(now);
        let longest = self.longest.front().map_or(Duration::ZERO, |&(_, w)| w);
        longest.saturating_mul(FACTOR).clamp(self.least, self.most)
    }

    fn forget_before(&mut self, now: Instant) {
        while self
            .longest
            .front()
            .is_some_and(|&(at, _)| now.saturating_duration_since(at) > RECENT)
        {
            self.longest.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const LEAST: Duration = Duration::from_millis(500);
    const MOST: Duration = Duration::from_secs(2);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_healthy_pace_keeps_the_least_wait() {
        let start = Instant::now();
        let mut patience = RoomPatience::new(LEAST, MOST);
        assert_eq!(patience.limit(start), LEAST);
        for n in 0..100 {
            patience.waited(start + ms(n * 20), ms(15));
        }
        assert_eq!(patience.limit(start + ms(2_000)), LEAST);
    }

    #[test]
    fn a_slow_pace_stretches_the_wait_within_the_most() {
        let start = Instant::now();
        let mut patience = RoomPatience::new(LEAST, MOST);
        patience.waited(start, ms(400));
        patience.waited(start + ms(400), ms(300));
        assert_eq!(patience.limit(start + ms(700)), ms(1_200));
        patience.waited(start + ms(1_400), ms(700));
        assert_eq!(patience.limit(start + ms(1_400)), MOST);
    }

    #[test]
    fn a_slow_pace_is_forgotten_after_the_recent_past() {
        let start = Instant::now();
        let mut patience = RoomPatience::new(LEAST, MOST);
        patience.waited(start, ms(600));
        patience.waited(start + ms(5_000), ms(250));
        assert_eq!(patience.limit(start + RECENT), ms(1_800));
        // The long wait is older than RECENT now; the shorter one, later, is not.
        assert_eq!(patience.limit(start + RECENT + ms(1)), ms(750));
        assert_eq!(patience.limit(start + ms(5_000) + RECENT + ms(1)), LEAST);
    }

    proptest! {
        /// Against the plain definition: the longest wait of the last RECENT, times FACTOR,
        /// within the least and the most.
        #[test]
        fn the_limit_follows_the_longest_recent_wait(
            waits in prop::collection::vec((0u64..3_000, 0u64..3_000), 0..60),
            probe in 0u64..3_000,
        ) {
            let start = Instant::now();
            let mut patience = RoomPatience::new(LEAST, MOST);
            let mut at = start;
            let mut seen = Vec::new();
            for (gap, waited) in waits {
                at += ms(gap);
                patience.waited(at, ms(waited));
                seen.push((at, ms(waited)));
            }
            let now = at + ms(probe);
            let longest = seen
                .iter()
                .filter(|(when, _)| now.duration_since(*when) <= RECENT)
                .map(|(_, waited)| *waited)
                .max()
                .unwrap_or(Duration::ZERO);
            prop_assert_eq!(patience.limit(now), (longest * FACTOR).clamp(LEAST, MOST));
        }
    }
}
