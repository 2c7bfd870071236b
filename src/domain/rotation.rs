//! Backlogged partitions taking turns for the client's part of the budget when their record
//! batches are too large for every partition to hold one at once.
//!
//! A broker returns a partition's first record batch whole: with a megabyte per batch (what
//! librdkafka's producers write a backlog in) the client's part of the default budget holds
//! a batch for about half of 24 partitions. Taken in fetch order, the partitions are then
//! written one run of a batch after another — under a slow database one at a time, the others
//! waiting tens of seconds. Instead, at most `seats` backlogged partitions fetch at once, each
//! for a `slice` of time; the rest wait, paused, in the order they began to wait. A partition
//! whose slice ended gives its seat to the one that waited longest and waits in turn: the
//! client drops what it had fetched of it beyond what was taken, and fetches it again from
//! there when its turn comes. Pure: the caller pauses and resumes the partitions.
//!
//! The rotation costs a healthy drain what it re-reads (and the memory that churns), and
//! there fetch order comes round to every partition within a second or two anyway. So it runs
//! only while fetch order would not: from when [`Pace`] says, twice in a row, that a round of
//! one fetched batch of every backlogged partition, at the rate records are done with, lasts
//! longer than [`ROUND_ENGAGES`] (within the 5 s in which every partition is to get its share;
//! a healthy drain on a busy machine measures a round of two or three seconds), until it lasts
//! less than half that. From the turns' end until the first measurement, a quarter of a second
//! later ([`FIRST_MEASUREMENT`]), it runs provisionally, with turns of the least quantum
//! ([`Pace::rotates`]): in fetch order, those first seconds went to the partitions whose
//! batches were fetched first (7,464 and 6,439 rows of two partitions in the first 5 s of
//! `bench --fairness`, none of a third's); a healthy drain pays a quarter of a second of turns,
//! which it did not show (docs/benchmarks.md).
//!
//! A turn is a quantum of records ([`Pace::quantum`]): as many as make a round of every
//! backlogged partition's turn last [`ROUND_AIMED`] at the pace records are handed over, so
//! that every 5 s window holds a whole turn of each, however slow the database (a fixed 500
//! records made rounds of 5–7 s at 2,000–3,000 events/s) — and a turn counted in records
//! gives each seat the same, where one counted in time gets whatever burst of room falls into
//! it. A turn lasts at least [`TURN_LEAST`], so that a quick pace's turns do not re-read most
//! of every fetched batch, and a seat's slice at most — or ends, however short, at the most
//! records of a turn ([`Rotation::limit_turns`]: the partition's share of the budget, or the
//! quantum if that is more), since a turn takes what room frees in it and the room frees in
//! bursts: the whole budget at once when the rotation begins.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A round of fetch order longer than this, measured twice in a row, starts the rotation.
pub(crate) const ROUND_ENGAGES: Duration = Duration::from_secs(4);

/// The shortest turn of a seat, whatever was handed over in it.
pub(crate) const TURN_LEAST: Duration = Duration::from_millis(250);

/// How long a round of the seats is aimed to last: half the 5 s in which every partition is to
/// get its share, so that every such window holds a whole turn of each backlogged partition.
pub(crate) const ROUND_AIMED: Duration = Duration::from_millis(2_500);

/// The fewest records of a turn: fewer would re-read a fetched batch for little.
pub(crate) const QUANTUM_LEAST: u64 = 100;

/// How long the first measurement of the pace lasts: long enough for a writer's batch or two
/// to be done with under a slow database, short enough that a healthy drain's provisional
/// turns (which churn the seats) end soon.
pub(crate) const FIRST_MEASUREMENT: Duration = Duration::from_millis(250);

/// How fast records are done with (written, or otherwise released from the budget) — the pace
/// at which room frees to hand more over — measured over a second or more, the first time a
/// quarter of one ([`FIRST_MEASUREMENT`]): the last two measurements. Counted as released,
/// not as taken: the first moments take the budget's whole room at once, which would measure
/// any database as quick.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pace {
    since: Option<(Instant, u64)>,
    per_second: Option<f64>,
    per_second_before: Option<f64>,
}

impl Pace {
    /// `released` records were released in all by `now`.
    pub(crate) fn sample(&mut self, now: Instant, released: u64) {
        let Some((then, before)) = self.since else {
            self.since = Some((now, released));
            return;
        };
        let elapsed = now.saturating_duration_since(then);
        let span = if self.per_second.is_some() {
            Duration::from_secs(1)
        } else {
            FIRST_MEASUREMENT
        };
        if elapsed >= span {
            self.per_second_before = self.per_second;
            self.per_second = Some(released.saturating_sub(before) as f64 / elapsed.as_secs_f64());
            self.since = Some((now, released));
        }
    }

    /// How long fetch order takes to hand over one batch of `batch_records` records of each of
    /// `backlogged` partitions at this pace; unknown before it was first measured.
    pub(crate) fn round(&self, backlogged: usize, batch_records: u64) -> Option<Duration> {
        Some(round_at(self.per_second?, backlogged, batch_records))
    }

    /// How many records a seat hands over in its turn so that the turns of `backlogged`
    /// partitions come round in [`ROUND_AIMED`] at this pace: the seats share the pace, so a
    /// round of turns of a quantum each lasts `backlogged × quantum ÷ pace`, however many
    /// seats there are. [`QUANTUM_LEAST`] at least, and a batch of `batch_records` at most (a
    /// turn of a whole batch re-reads nothing); a batch before the pace is known. The pace of
    /// the last two seconds: room frees in bursts of a writer's batch, a few a second, so one
    /// second's count swings by a third.
    pub(crate) fn quantum(&self, backlogged: usize, batch_records: u64) -> u64 {
        let most = batch_records.max(QUANTUM_LEAST);
        let Some(last) = self.per_second else {
            return most;
        };
        let per_second = self
            .per_second_before
            .map_or(last, |before| (last + before) / 2.0);
        let aimed = per_second * ROUND_AIMED.as_secs_f64() / backlogged.max(1) as f64;
        (aimed.min(most as f64) as u64).max(QUANTUM_LEAST)
    }

    /// Whether anything was measured yet.
    pub(crate) fn is_measured(&self) -> bool {
        self.per_second.is_some()
    }

    /// Whether the rotation runs, given whether it ran: it starts when a round lasts longer
    /// than [`ROUND_ENGAGES`] by the last two measurements (one second of records taken in a
    /// burst, as the budget frees, does not start it) and stops when it lasts less than half
    /// that by the last. Before anything is measured it keeps what it did: the caller begins
    /// it provisionally at the turns' end, so that a slow database's first seconds are not
    /// fetch order's. A rotation with only one measurement behind it was begun so, and goes on
    /// only if a round lasts longer than [`ROUND_ENGAGES`] — as one begun by the measurements
    /// would — so that a healthy drain on a busy machine (rounds of 2–3 s) does not keep it.
    pub(crate) fn rotates(&self, rotating: bool, backlogged: usize, batch_records: u64) -> bool {
        let Some(round) = self.round(backlogged, batch_records) else {
            return rotating;
        };
        let before = self
            .per_second_before
            .map(|per_second| round_at(per_second, backlogged, batch_records));
        match (rotating, before) {
            (true, Some(_)) => round >= ROUND_ENGAGES / 2,
            (true, None) => round > ROUND_ENGAGES,
            (false, before) => {
                round > ROUND_ENGAGES && before.is_some_and(|before| before > ROUND_ENGAGES)
            }
        }
    }
}

/// How long `backlogged` batches of `batch_records` take at `per_second` records a second.
fn round_at(per_second: f64, backlogged: usize, batch_records: u64) -> Duration {
    let records = backlogged as f64 * batch_records as f64;
    Duration::from_secs_f64((records / per_second.max(1e-3)).min(1e6))
}

/// Which partitions hold a seat, since when, and which wait for one.
#[derive(Debug, Clone)]
pub(crate) struct Rotation<K> {
    /// Each seated partition, when its seat began and how many records it handed over since.
    seated: Vec<(K, Instant, u64)>,
    waiting: VecDeque<K>,
    /// The most records of a turn, however short ([`Self::limit_turns`]).
    most: u64,
}

impl<K> Default for Rotation<K> {
    fn default() -> Self {
        Rotation {
            seated: Vec::new(),
            waiting: VecDeque::new(),
            most: u64::MAX,
        }
    }
}

/// The seats changing hands at one look: the partitions to pause and those to resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Swaps<K> {
    pub(crate) leave: Vec<K>,
    pub(crate) enter: Vec<K>,
}

impl<K> Default for Swaps<K> {
    fn default() -> Self {
        Swaps {
            leave: Vec::new(),
            enter: Vec::new(),
        }
    }
}

impl<K: Eq + Clone> Rotation<K> {
    pub(crate) fn seated(&self) -> impl Iterator<Item = &K> {
        self.seated.iter().map(|(partition, _, _)| partition)
    }

    pub(crate) fn waiting(&self) -> impl Iterator<Item = &K> {
        self.waiting.iter()
    }

    /// The partitions seated or waiting.
    pub(crate) fn len(&self) -> usize {
        self.seated.len() + self.waiting.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    pub(crate) fn contains(&self, partition: &K) -> bool {
        self.is_seated(partition) || self.is_waiting(partition)
    }

    pub(crate) fn is_seated(&self, partition: &K) -> bool {
        self.seated.iter().any(|(seated, _, _)| seated == partition)
    }

    pub(crate) fn is_waiting(&self, partition: &K) -> bool {
        self.waiting.contains(partition)
    }

    /// A backlogged partition joins, fetching: its slice begins `now`.
    pub(crate) fn seat(&mut self, partition: K, now: Instant) {
        self.remove(&partition);
        self.seated.push((partition, now, 0));
    }

    /// A seated partition handed a record over. Returns whether that ended its turn: the
    /// most records of a turn handed over ([`Self::limit_turns`]), so that the seats are to be
    /// looked at now rather than at the next look, by which it would take what room there is.
    pub(crate) fn handed(&mut self, partition: &K) -> bool {
        let most = self.most;
        self.seated
            .iter_mut()
            .find(|(seated, _, _)| seated == partition)
            .is_some_and(|(_, _, handed)| {
                *handed += 1;
                *handed == most
            })
    }

    /// A turn ends, however short, once its seat handed over `most` records: a turn of the
    /// least time takes whatever room frees in it, and room frees in bursts — the whole budget
    /// at once when the rotation begins with it empty (the first three seats of
    /// `bench --fairness` took 2,400–2,900 records each in their first turns, a fair share of
    /// the first 5 s being 700).
    pub(crate) fn limit_turns(&mut self, most: u64) {
        self.most = most.max(1);
    }

    /// A backlogged partition joins, paused, behind those already waiting.
    pub(crate) fn wait(&mut self, partition: K) {
        self.remove(&partition);
        self.waiting.push_back(partition);
    }

    /// The partition leaves the rotation (revoked, or caught up with its log); returns
    /// whether it was waiting (and so is still paused for its turn).
    pub(crate) fn remove(&mut self, partition: &K) -> bool {
        self.seated.retain(|(seated, _, _)| seated != partition);
        let waited = self.waiting.contains(partition);
        self.waiting.retain(|waiting| waiting != partition);
        waited
    }

    /// The seats at `now`, with `seats` of them: seated partitions over the count give theirs up
    /// (the longest seated first); then each whose turn ended — `quantum` records handed over
    /// in at least `least` of time, the most of a turn ([`Self::limit_turns`]) in any time, or
    /// a `slice` of time (for one with little to give) — gives its seat to the partition that
    /// waited longest, while one waits that was waiting before this look (a partition is not
    /// paused and resumed in one look); then free seats are taken in the waiting order. A turn
    /// is counted in records because records are taken in bursts, as the budget frees: a turn
    /// of time would give a partition whatever burst fell into it.
    pub(crate) fn turn(
        &mut self,
        now: Instant,
        seats: usize,
        quantum: u64,
        least: Duration,
        slice: Duration,
    ) -> Swaps<K> {
        let seats = seats.max(1);
        let mut swaps = Swaps::default();
        // Longest seated first.
        self.seated.sort_by_key(|&(_, since, _)| since);
        let waited_before = self.waiting.len();
        let mut entered = 0;
        while self.seated.len() > seats {
            let (partition, _, _) = self.seated.remove(0);
            self.waiting.push_back(partition.clone());
            swaps.leave.push(partition);
        }
        let most = self.most;
        let ended = |&(_, since, handed): &(K, Instant, u64)| {
            let seated_for = now.saturating_duration_since(since);
            (handed >= quantum && seated_for >= least) || handed >= most || seated_for >= slice
        };
        let mut at = 0;
        while at < self.seated.len() && entered < waited_before {
            if !ended(&self.seated[at]) {
                at += 1;
                continue;
            }
            let (partition, _, _) = self.seated.remove(at);
            let next = self
                .waiting
                .pop_front()
                .expect("one waited before this look");
            entered += 1;
            self.waiting.push_back(partition.clone());
            swaps.leave.push(partition);
            // Appended: not looked at again in this look.
            self.seated.push((next.clone(), now, 0));
            swaps.enter.push(next);
        }
        while self.seated.len() < seats && entered < waited_before {
            let Some(next) = self.waiting.pop_front() else {
                break;
            };
            entered += 1;
            self.seated.push((next.clone(), now, 0));
            swaps.enter.push(next);
        }
        swaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SLICE: Duration = Duration::from_secs(1);

    fn rotation(seated: &[u8], waiting: &[u8], at: Instant) -> Rotation<u8> {
        let mut rotation = Rotation::default();
        for &partition in seated {
            rotation.seat(partition, at);
        }
        for &partition in waiting {
            rotation.wait(partition);
        }
        rotation
    }

    #[test]
    fn free_seats_are_taken_in_the_order_the_partitions_began_to_wait() {
        let start = Instant::now();
        let mut rotation = rotation(&[], &[3, 1, 2], start);
        let swaps = rotation.turn(start, 2, u64::MAX, Duration::ZERO, SLICE);
        assert_eq!(swaps.enter, vec![3, 1]);
        assert!(swaps.leave.is_empty());
        assert_eq!(rotation.waiting().copied().collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn a_seat_changes_hands_when_its_slice_ends_and_not_before() {
        let start = Instant::now();
        let mut rotation = rotation(&[0, 1], &[2, 3], start);
        assert_eq!(
            rotation.turn(start + SLICE / 2, 2, u64::MAX, Duration::ZERO, SLICE),
            Swaps::default()
        );
        let swaps = rotation.turn(start + SLICE, 2, u64::MAX, Duration::ZERO, SLICE);
        assert_eq!(swaps.leave, vec![0, 1]);
        assert_eq!(swaps.enter, vec![2, 3]);
        assert_eq!(rotation.waiting().copied().collect::<Vec<_>>(), vec![0, 1]);
        // The newly seated keep their seats for a whole slice.
        assert_eq!(
            rotation.turn(
                start + SLICE + SLICE / 2,
                2,
                u64::MAX,
                Duration::ZERO,
                SLICE
            ),
            Swaps::default()
        );
        let swaps = rotation.turn(start + 2 * SLICE, 2, u64::MAX, Duration::ZERO, SLICE);
        assert_eq!(swaps.enter, vec![0, 1]);
    }

    #[test]
    fn a_seat_changes_hands_when_its_quantum_of_records_was_handed_over() {
        let start = Instant::now();
        let mut rotation = rotation(&[0, 1], &[2], start);
        for _ in 0..99 {
            rotation.handed(&1);
        }
        assert_eq!(
            rotation.turn(start, 2, 100, Duration::ZERO, SLICE),
            Swaps::default()
        );
        rotation.handed(&1);
        rotation.handed(&2); // waiting: not counted
        let swaps = rotation.turn(start, 2, 100, Duration::ZERO, SLICE);
        assert_eq!(swaps.leave, vec![1]);
        assert_eq!(swaps.enter, vec![2]);
        // 2's count starts at nothing.
        for _ in 0..99 {
            rotation.handed(&2);
        }
        assert_eq!(
            rotation.turn(start, 2, 100, Duration::ZERO, SLICE),
            Swaps::default()
        );
    }

    #[test]
    fn a_quantum_handed_over_quickly_keeps_the_seat_for_the_least_turn() {
        let start = Instant::now();
        let least = SLICE / 2;
        let mut rotation = rotation(&[0], &[1], start);
        for _ in 0..100 {
            rotation.handed(&0);
        }
        assert_eq!(
            rotation.turn(start + least / 2, 1, 100, least, SLICE),
            Swaps::default()
        );
        let swaps = rotation.turn(start + least, 1, 100, least, SLICE);
        assert_eq!((swaps.leave, swaps.enter), (vec![0], vec![1]));
    }

    #[test]
    fn nobody_waiting_leaves_every_seat_as_it_is() {
        let start = Instant::now();
        let mut rotation = rotation(&[0, 1], &[], start);
        assert_eq!(
            rotation.turn(start + 10 * SLICE, 2, u64::MAX, Duration::ZERO, SLICE),
            Swaps::default()
        );
        assert_eq!(rotation.seated().count(), 2);
    }

    #[test]
    fn fewer_seats_send_the_longest_seated_to_wait() {
        let start = Instant::now();
        let mut rotation = rotation(&[0], &[], start);
        rotation.seat(1, start + SLICE / 4);
        rotation.seat(2, start + SLICE / 2);
        let swaps = rotation.turn(start + SLICE / 2, 1, u64::MAX, Duration::ZERO, SLICE);
        assert_eq!(swaps.leave, vec![0, 1]);
        assert!(swaps.enter.is_empty(), "{swaps:?}");
        assert_eq!(rotation.seated().copied().collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn a_partition_is_not_sent_to_wait_and_seated_again_in_one_look() {
        let start = Instant::now();
        // One waits; both seated ones' slices ended: one swap only.
        let mut rotation = rotation(&[0, 1], &[2], start);
        let swaps = rotation.turn(start + SLICE, 2, u64::MAX, Duration::ZERO, SLICE);
        assert_eq!(swaps.leave, vec![0]);
        assert_eq!(swaps.enter, vec![2]);
        assert!(swaps.leave.iter().all(|left| !swaps.enter.contains(left)));
    }

    #[test]
    fn the_rotation_starts_on_two_long_rounds_in_a_row_and_stops_on_a_short_one() {
        let start = Instant::now();
        let second = |n: u64| start + Duration::from_secs(n);
        let mut pace = Pace::default();
        pace.sample(start, 0);
        assert!(!pace.rotates(false, 23, 5_000), "no pace measured yet");
        assert!(pace.rotates(true, 23, 5_000), "no pace measured yet");
        // 5,000 records a second: 23 batches of 5,000 take 23 s; once is not enough.
        pace.sample(second(1), 5_000);
        assert_eq!(pace.round(23, 5_000), Some(Duration::from_secs(23)));
        assert!(!pace.rotates(false, 23, 5_000));
        pace.sample(second(2), 10_000);
        assert!(pace.rotates(false, 23, 5_000));
        // A healthy database, 100,000 a second: 1.15 s.
        pace.sample(second(3), 110_000);
        assert!(!pace.rotates(false, 23, 5_000));
        assert!(!pace.rotates(true, 23, 5_000));
        // A long round after a short one does not start it.
        pace.sample(second(4), 115_000);
        assert!(!pace.rotates(false, 23, 5_000));
        // Between the two thresholds the rotation keeps what it did: 3 s, twice.
        pace.sample(second(5), 153_333);
        pace.sample(second(6), 191_666);
        assert!(pace.rotates(true, 23, 5_000));
        assert!(!pace.rotates(false, 23, 5_000));
        // Nothing handed over (the database away): a round never ends.
        pace.sample(second(7), 191_666);
        pace.sample(second(8), 191_666);
        assert!(pace.rotates(false, 2, 5_000));
        // Nothing backlogged: no round.
        assert!(!pace.rotates(true, 0, 5_000));
        // Samples less than a second apart are folded into the next.
        pace.sample(start + Duration::from_millis(8_500), 300_000);
        assert!(pace.rotates(false, 2, 5_000));
    }

    #[test]
    fn a_provisional_rotation_holds_until_the_first_measurement_then_only_for_a_long_round() {
        let start = Instant::now();
        let slow = |handed: u64| {
            let mut pace = Pace::default();
            pace.sample(start, 0);
            assert!(!pace.is_measured());
            assert!(pace.rotates(true, 23, 5_000), "not measured yet");
            assert!(!pace.rotates(false, 23, 5_000), "not begun by nothing");
            pace.sample(start + Duration::from_millis(200), handed / 5);
            assert!(pace.rotates(true, 23, 5_000), "under a quarter second");
            assert!(!pace.is_measured());
            pace.sample(start + Duration::from_secs(1), handed);
            assert!(pace.is_measured());
            pace.rotates(true, 23, 5_000)
        };
        // 5,000 a second: a round of 23 s. Once is enough for what already runs.
        assert!(slow(5_000));
        // A busy machine's healthy drain, 40,000 a second: 2.9 s, under the 4 s that begins a
        // rotation (though over the 2 s that would stop one).
        assert!(!slow(40_000));
        assert!(!slow(100_000));
    }

    #[test]
    fn a_turn_ends_at_its_most_records_however_short_and_the_record_that_ends_it_says_so() {
        let start = Instant::now();
        let least = Duration::from_millis(250);
        let mut rotation = rotation(&[0], &[1], start);
        rotation.limit_turns(3);
        assert!(!rotation.handed(&0));
        assert!(!rotation.handed(&0));
        assert_eq!(
            rotation.turn(start, 1, 2, least, SLICE),
            Swaps::default(),
            "the quantum handed over, but not in the least time"
        );
        assert!(rotation.handed(&0), "the third ends the turn");
        assert!(!rotation.handed(&0), "said once");
        assert!(!rotation.handed(&1), "not seated");
        let swaps = rotation.turn(start, 1, 2, least, SLICE);
        assert_eq!(swaps.leave, vec![0]);
        assert_eq!(swaps.enter, vec![1]);
    }

    #[test]
    fn the_first_measurement_takes_a_quarter_second_and_the_next_ones_a_second() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut pace = Pace::default();
        pace.sample(at(0), 0);
        pace.sample(at(249), 1_000);
        assert!(!pace.is_measured());
        pace.sample(at(250), 1_000);
        assert_eq!(pace.round(1, 4_000), Some(Duration::from_secs(1)));
        pace.sample(at(1_249), 100_000);
        assert_eq!(pace.round(1, 4_000), Some(Duration::from_secs(1)));
        pace.sample(at(1_250), 9_000);
        assert_eq!(pace.round(1, 8_000), Some(Duration::from_secs(1)));
    }

    #[test]
    fn a_turns_quantum_makes_a_round_of_every_backlogged_partition_last_the_aimed_time() {
        let start = Instant::now();
        let mut pace = Pace::default();
        assert_eq!(
            pace.quantum(23, 5_300),
            5_300,
            "a batch before the pace is known"
        );
        pace.sample(start, 0);
        pace.sample(start + Duration::from_secs(1), 2_300);
        // 2,300 records a second, 23 partitions: 250 each make a round of 2.5 s.
        let quantum = pace.quantum(23, 5_300);
        assert_eq!(quantum, 250);
        let round = 23.0 * quantum as f64 / 2_300.0;
        assert!((round - ROUND_AIMED.as_secs_f64()).abs() < 0.01, "{round}");
        // Fewer partitions backlogged: longer turns, the same round.
        assert_eq!(pace.quantum(5, 5_300), 1_150);
        // Never more than a batch (re-read nothing), never fewer than the least.
        assert_eq!(pace.quantum(1, 1_000), 1_000);
        assert_eq!(pace.quantum(200, 5_300), QUANTUM_LEAST);
        // The pace of the last two seconds: 2,300 then 4,600.
        pace.sample(start + Duration::from_secs(2), 6_900);
        assert_eq!(pace.quantum(23, 5_300), 375);
        // Nothing handed over (the database away) for two seconds: the least.
        pace.sample(start + Duration::from_secs(3), 6_900);
        pace.sample(start + Duration::from_secs(4), 6_900);
        assert_eq!(pace.quantum(23, 5_300), QUANTUM_LEAST);
    }

    proptest! {
        /// Whatever the looks, every partition is seated or waiting, once; never more seated
        /// than the seats; and every backlogged partition is seated at least once in every
        /// (partitions ÷ seats + 1) slices, each as long as the looks make it.
        #[test]
        fn every_partition_gets_a_seat_within_a_round_of_slices(
            partitions in 1u8..40,
            seats in 1usize..16,
            looks_per_slice in 1u32..8,
        ) {
            let start = Instant::now();
            let mut rotation = Rotation::default();
            for partition in 0..partitions {
                rotation.wait(partition);
            }
            let step = SLICE / looks_per_slice;
            let mut last_seated = vec![start; partitions as usize];
            let rounds = (partitions as u32).div_ceil(seats as u32) + 1;
            // A slice ends at the first look at or after its end.
            let bound = (SLICE + step) * rounds + step;
            for look in 0..(looks_per_slice * 3 * rounds) {
                let now = start + step * look;
                let swaps = rotation.turn(now, seats, u64::MAX, Duration::ZERO, SLICE);
                for partition in &swaps.leave {
                    prop_assert!(!swaps.enter.contains(partition));
                }
                prop_assert!(rotation.seated().count() <= seats);
                let mut all: Vec<u8> = rotation.seated().chain(rotation.waiting()).copied().collect();
                all.sort();
                prop_assert_eq!(all, (0..partitions).collect::<Vec<_>>());
                for &partition in rotation.seated() {
                    last_seated[partition as usize] = now;
                }
                for (partition, &seen) in last_seated.iter().enumerate() {
                    prop_assert!(
                        now.duration_since(seen) <= bound,
                        "partition {} waited {:?} (bound {:?})", partition, now.duration_since(seen), bound
                    );
                }
            }
        }
    }
}
