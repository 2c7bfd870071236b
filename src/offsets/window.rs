//! The ordered window of one partition's in-flight offsets.
//!
//! Kafka's committed position means "everything before this offset is done". So the window
//! tracks each fetched offset until its outcome is known, and the position only moves to the
//! last *contiguous* resolved offset + 1: one unresolved record holds back everything behind it.
//! Offsets never seen (compacted away, transaction markers) are gaps, not unresolved records.
//! A gap at the end of what was fetched is told by the client instead: after the last record of
//! a transaction comes its marker, which no consumer sees, and the position would stay at the
//! last record + 1, one short of the log's end, for good. The client's own position moves past
//! the markers it skipped, and [`OffsetWindow::pass_over`] takes it: no record below it is still
//! to come.
//!
//! Within one assignment librdkafka hands a partition's records over in increasing order, so a
//! record at or below the highest offset already tracked means the partition's log moved back:
//! a topic deleted and created again (the committed position is past the new log's end, and the
//! out-of-range fetch starts again at the earliest offset), a log truncated after an unclean
//! leader election (librdkafka's validation seeks back to the new end), a reset. The records from
//! there on are new — other records than the ones tracked at those offsets before — so the
//! window *rewinds*: it forgets what it tracked from that offset on, keeps what it holds below
//! it (those records did not change), and tracks the new ones under a new *generation*.
//! Outcomes carry the generation their record was tracked under, so a late outcome of a
//! forgotten record never resolves the new record at its offset. The position goes back to the
//! rewind's offset if it was past it: that is the log's truth now.

use std::collections::VecDeque;

pub use crate::domain::Generation;

use super::done::Run;

/// What [`OffsetWindow::track`] did with an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackResult {
    /// The offset is now in flight, under this generation.
    Tracked(Generation),
    /// The offset was at or below the highest one tracked: the log moved back. What the window
    /// tracked from `to` on is forgotten, and `to` is in flight under a new generation.
    Rewound(Rewind),
}

impl TrackResult {
    /// The generation the offset is now tracked under.
    pub fn generation(self) -> Generation {
        match self {
            TrackResult::Tracked(generation) => generation,
            TrackResult::Rewound(rewind) => rewind.generation,
        }
    }
}

/// A move back of a partition's log, as the window saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rewind {
    /// The highest offset tracked before.
    pub highest: i64,
    /// Where the log moved back to: the offset tracked now.
    pub to: i64,
    /// The commit position before the rewind, and after it.
    pub position_before: Option<i64>,
    pub position_after: Option<i64>,
    /// Unresolved records forgotten: their outcomes, when they come, change nothing.
    pub forgotten: usize,
    /// The generation the new records are tracked under.
    pub generation: Generation,
}

/// A resolution the window does not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UntrackedOffset {
    /// Not in flight: resolved before, or never tracked.
    #[error("offset {0} is not in flight")]
    NotInFlight(i64),
    /// Tracked under another generation: the outcome of a record the window forgot when the
    /// log moved back.
    #[error("offset {0} was forgotten when the log moved back")]
    Forgotten(i64),
}

/// One tracked offset.
#[derive(Debug, Clone, Copy)]
struct Entry {
    offset: i64,
    resolved: bool,
    generation: Generation,
}

#[derive(Debug, Clone, Default)]
pub struct OffsetWindow {
    /// Tracked offsets in increasing order. The front is always unresolved: resolved entries at
    /// the front are released at once.
    entries: VecDeque<Entry>,
    /// The commit position: last contiguous resolved offset + 1. `None` until the first
    /// resolution, because nothing is known about offsets before the first one seen.
    position: Option<i64>,
    unresolved: usize,
    /// The highest offset tracked: a record at or below it means the log moved back.
    highest: Option<i64>,
    /// Rewinds so far.
    generation: Generation,
}

impl OffsetWindow {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts tracking a fetched offset.
    pub fn track(&mut self, offset: i64) -> TrackResult {
        let result = match self.highest {
            Some(highest) if offset <= highest => {
                TrackResult::Rewound(self.rewind(offset, highest))
            }
            _ => TrackResult::Tracked(self.generation),
        };
        self.entries.push_back(Entry {
            offset,
            resolved: false,
            generation: self.generation,
        });
        self.unresolved += 1;
        self.highest = Some(offset);
        result
    }

    /// Takes the client's word that the log holds no record below `offset` beyond those already
    /// tracked (it moved past transaction markers, or records of aborted transactions it does
    /// not hand over): once every tracked offset is resolved, the position is `offset`. Ignored
    /// (`false`) unless past every offset tracked; a record tracked later below it is a move
    /// back, as below any tracked one.
    pub fn pass_over(&mut self, offset: i64) -> bool {
        let last = offset - 1;
        if self.highest.is_some_and(|highest| last <= highest) {
            return false;
        }
        self.highest = Some(last);
        if self.entries.is_empty() {
            self.position = Some(offset);
        } else {
            // Resolved, it waits behind the unresolved ones like any resolved record.
            self.entries.push_back(Entry {
                offset: last,
                resolved: true,
                generation: self.generation,
            });
        }
        true
    }

    /// Forgets what was tracked from `to` on and starts a new generation (see the module
    /// documentation).
    fn rewind(&mut self, to: i64, highest: i64) -> Rewind {
        let position_before = self.position;
        let keep = self.entries.partition_point(|entry| entry.offset < to);
        let forgotten = self
            .entries
            .drain(keep..)
            .filter(|entry| !entry.resolved)
            .count();
        self.unresolved -= forgotten;
        // Everything below `to` that is not held back is done: the position is `to` unless an
        // unresolved record below it holds it further back. (Resolved entries kept behind one
        // stay: they are released when it resolves.)
        if self.entries.is_empty() {
            self.position = Some(to);
        } else {
            self.position = self.position.map(|position| position.min(to));
        }
        self.generation += 1;
        Rewind {
            highest,
            to,
            position_before,
            position_after: self.position,
            forgotten,
            generation: self.generation,
        }
    }

    /// Marks an offset, tracked under `generation`, resolved. Returns how many entries this
    /// released from the window (the position moved past them); 0 if the offset was behind an
    /// unresolved one or already resolved.
    pub fn resolve(
        &mut self,
        offset: i64,
        generation: Generation,
    ) -> Result<usize, UntrackedOffset> {
        let index = self
            .search(offset)
            .map_err(|_| self.untracked(offset, generation))?;
        let entry = &mut self.entries[index];
        if entry.generation != generation {
            return Err(self.untracked(offset, generation));
        }
        if entry.resolved {
            return Ok(0);
        }
        entry.resolved = true;
        self.unresolved -= 1;
        if index != 0 {
            return Ok(0);
        }
        let mut released = 0;
        while let Some(&Entry {
            offset: front,
            resolved: true,
            ..
        }) = self.entries.front()
        {
            self.entries.pop_front();
            self.position = Some(front + 1);
            released += 1;
        }
        Ok(released)
    }

    fn untracked(&self, offset: i64, generation: Generation) -> UntrackedOffset {
        if generation < self.generation {
            UntrackedOffset::Forgotten(offset)
        } else {
            UntrackedOffset::NotInFlight(offset)
        }
    }

    /// The offset to commit: every tracked offset before it is resolved.
    pub fn position(&self) -> Option<i64> {
        self.position
    }

    /// The current generation: how often the log moved back in this window.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// Entries held: unresolved offsets and the resolved ones waiting behind them. This is what
    /// the per-partition in-flight limit bounds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Offsets tracked and not yet resolved.
    pub fn unresolved(&self) -> usize {
        self.unresolved
    }

    /// Whether `offset`, tracked under `generation`, is in flight and not yet resolved.
    pub fn is_unresolved(&self, offset: i64, generation: Generation) -> bool {
        self.search(offset).is_ok_and(|index| {
            let entry = self.entries[index];
            !entry.resolved && entry.generation == generation
        })
    }

    /// The oldest unresolved offset: what the position is waiting for.
    pub fn first_unresolved(&self) -> Option<i64> {
        self.entries.front().map(|entry| entry.offset)
    }

    /// Where a revoke cuts the partition's unstarted work (`withdrawn`, unresolved offsets no
    /// writer has started) so that nothing written is read again by the next owner, and nothing
    /// is written that cannot be committed: the work below the cut is done before the partition
    /// is handed over, the rest is left to the next owner. The cut is past every offset that is
    /// not withdrawn (written, or being written), but no further than the first offset in
    /// `stuck` (set aside, never resolving here): the position stops there anyway.
    pub fn withdrawal_cut(
        &self,
        withdrawn: &std::collections::BTreeSet<i64>,
        stuck: &std::collections::BTreeSet<i64>,
    ) -> Option<i64> {
        let first = self.entries.front()?.offset;
        let past_started = self
            .entries
            .iter()
            .rev()
            .map(|entry| entry.offset)
            .find(|offset| !withdrawn.contains(offset))
            .map_or(first, |last| last + 1);
        Some(match stuck.iter().find(|&&offset| offset >= first) {
            Some(&stuck) => past_started.min(stuck),
            None => past_started,
        })
    }

    /// The highest offset tracked (or passed over).
    pub fn highest(&self) -> Option<i64> {
        self.highest
    }

    /// The resolved offsets waiting behind an unresolved one, as runs of records delivered one
    /// after the other: an offset between two of them was never handed over (compacted away, a
    /// transaction marker), so a run may cover it.
    pub fn resolved_runs(&self) -> impl Iterator<Item = Run> + '_ {
        let mut entries = self.entries.iter().peekable();
        std::iter::from_fn(move || {
            let first = entries.find(|entry| entry.resolved)?.offset;
            let mut last = first;
            while let Some(entry) = entries.next_if(|entry| entry.resolved) {
                last = entry.offset;
            }
            Some(Run { first, last })
        })
    }

    fn search(&self, offset: i64) -> Result<usize, usize> {
        self.entries
            .binary_search_by_key(&offset, |entry| entry.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(window: &mut OffsetWindow, offsets: impl IntoIterator<Item = i64>) {
        for offset in offsets {
            assert_eq!(
                window.track(offset),
                TrackResult::Tracked(window.generation())
            );
        }
    }

    #[test]
    fn the_position_waits_for_the_oldest_unresolved_offset() {
        let mut window = OffsetWindow::new();
        tracked(&mut window, 0..4);
        assert_eq!(window.resolve(1, 0), Ok(0));
        assert_eq!(window.resolve(2, 0), Ok(0));
        assert_eq!(window.position(), None);
        assert_eq!(window.first_unresolved(), Some(0));
        assert_eq!(window.resolve(0, 0), Ok(3));
        assert_eq!(window.position(), Some(3));
        assert_eq!(window.len(), 1);
        assert_eq!(window.resolve(3, 0), Ok(1));
        assert_eq!(window.position(), Some(4));
        assert!(window.is_empty());
    }

    #[test]
    fn a_transaction_marker_the_client_passed_over_is_committed_past() {
        // Records 0..3 of a transaction, its marker at 3: the client's position is 4.
        let mut window = OffsetWindow::new();
        tracked(&mut window, 0..3);
        assert!(window.pass_over(4));
        window.resolve(0, 0).unwrap();
        window.resolve(2, 0).unwrap();
        assert_eq!(
            window.position(),
            Some(1),
            "record 1 still holds the position"
        );
        window.resolve(1, 0).unwrap();
        assert_eq!(window.position(), Some(4));
        assert!(window.is_empty());
        // All resolved already: the position moves at once.
        tracked(&mut window, [4, 5]);
        window.resolve(4, 0).unwrap();
        window.resolve(5, 0).unwrap();
        assert!(window.pass_over(7));
        assert_eq!(window.position(), Some(7));
        // Nothing fetched but a marker since the assignment began.
        let mut fresh = OffsetWindow::new();
        assert!(fresh.pass_over(12));
        assert_eq!(fresh.position(), Some(12));
    }

    #[test]
    fn a_pass_over_not_past_the_tracked_records_is_ignored() {
        let mut window = OffsetWindow::new();
        tracked(&mut window, [10, 11]);
        assert!(!window.pass_over(12), "12 is only the next offset after 11");
        assert!(!window.pass_over(5));
        window.resolve(10, 0).unwrap();
        window.resolve(11, 0).unwrap();
        assert_eq!(window.position(), Some(12));
        // A record below a pass-over is a log that moved back.
        assert!(window.pass_over(20));
        assert!(matches!(window.track(15), TrackResult::Rewound(_)));
    }

    #[test]
    fn resolved_offsets_behind_an_unresolved_one_form_runs_over_the_gaps_between_them() {
        let mut window = OffsetWindow::new();
        tracked(&mut window, [10, 11, 13, 14, 15, 17, 20]);
        for offset in [11, 13, 15, 17] {
            window.resolve(offset, 0).unwrap();
        }
        let runs = |window: &OffsetWindow| {
            window
                .resolved_runs()
                .map(|run| (run.first, run.last))
                .collect::<Vec<_>>()
        };
        assert_eq!(runs(&window), [(11, 13), (15, 17)]);
        assert!(window.pass_over(25));
        assert_eq!(runs(&window), [(11, 13), (15, 17), (24, 24)]);
        window.resolve(10, 0).unwrap();
        assert_eq!(window.position(), Some(14));
        assert_eq!(runs(&window), [(15, 17), (24, 24)]);
    }

    #[test]
    fn gaps_never_seen_do_not_hold_the_position_back() {
        let mut window = OffsetWindow::new();
        tracked(&mut window, [10, 11, 15, 20]);
        for offset in [20, 15, 11, 10] {
            window.resolve(offset, 0).unwrap();
        }
        assert_eq!(window.position(), Some(21));
    }

    #[test]
    fn a_revoke_cuts_the_unstarted_work_past_everything_written_or_being_written() {
        use std::collections::BTreeSet;
        let set = |offsets: &[i64]| offsets.iter().copied().collect::<BTreeSet<i64>>();
        let mut w = OffsetWindow::new();
        assert_eq!(w.withdrawal_cut(&set(&[]), &set(&[])), None);
        tracked(&mut w, 100..110);
        // 103 and 106 written or being written by other writers: the withdrawn work before
        // them is done here, the rest left.
        w.resolve(103, 0).unwrap();
        let withdrawn = set(&[100, 101, 102, 104, 105, 107, 108, 109]);
        assert_eq!(w.withdrawal_cut(&withdrawn, &set(&[])), Some(107));
        // Nothing started: all of it is left to the next owner.
        assert_eq!(
            w.withdrawal_cut(&set(&(100..110).collect::<Vec<_>>()), &set(&[])),
            Some(100)
        );
        // Nothing withdrawn: the cut is past the last tracked offset.
        assert_eq!(w.withdrawal_cut(&set(&[]), &set(&[])), Some(110));
        // An event stuck at 102: nothing past it can be committed, so nothing past it is done.
        assert_eq!(w.withdrawal_cut(&withdrawn, &set(&[102])), Some(102));
        // A stuck offset below the window (resolved since) does not count.
        assert_eq!(w.withdrawal_cut(&withdrawn, &set(&[7])), Some(107));
    }

    #[test]
    fn resolving_twice_or_resolving_an_untracked_offset_changes_nothing() {
        let mut w = OffsetWindow::new();
        tracked(&mut w, [1, 2]);
        assert!(w.is_unresolved(2, 0) && !w.is_unresolved(3, 0));
        w.resolve(2, 0).unwrap();
        assert!(!w.is_unresolved(2, 0) && w.is_unresolved(1, 0));

        let mut window = OffsetWindow::new();
        tracked(&mut window, [5, 6]);
        assert_eq!(window.resolve(6, 0), Ok(0));
        assert_eq!(window.resolve(6, 0), Ok(0));
        assert_eq!(window.resolve(7, 0), Err(UntrackedOffset::NotInFlight(7)));
        assert_eq!(window.unresolved(), 1);
        assert_eq!(window.resolve(5, 0), Ok(2));
        assert_eq!(window.resolve(5, 0), Err(UntrackedOffset::NotInFlight(5)));
    }

    #[test]
    fn a_record_below_the_position_is_new_and_the_position_goes_back_to_it() {
        let mut window = OffsetWindow::new();
        tracked(&mut window, 100..110);
        for offset in 100..110 {
            window.resolve(offset, 0).unwrap();
        }
        assert_eq!(window.position(), Some(110));
        // A topic created again: the out-of-range fetch starts at the new log's 0.
        let TrackResult::Rewound(rewind) = window.track(0) else {
            panic!("not a rewind");
        };
        assert_eq!(
            rewind,
            Rewind {
                highest: 109,
                to: 0,
                position_before: Some(110),
                position_after: Some(0),
                forgotten: 0,
                generation: 1,
            }
        );
        assert!(
            window.is_unresolved(0, 1),
            "tracked, not dispatched untracked"
        );
        assert_eq!(window.position(), Some(0), "nothing committed past it");
        assert_eq!(window.track(1), TrackResult::Tracked(1));
        window.resolve(1, 1).unwrap();
        assert_eq!(window.position(), Some(0));
        window.resolve(0, 1).unwrap();
        assert_eq!(window.position(), Some(2));
    }

    #[test]
    fn a_rewind_forgets_the_records_from_its_offset_on_and_their_late_outcomes() {
        let mut window = OffsetWindow::new();
        tracked(&mut window, 0..10);
        window.resolve(0, 0).unwrap();
        window.resolve(7, 0).unwrap();
        // A log truncated at 5 (an unclean leader election): 5..10 were other records.
        let TrackResult::Rewound(rewind) = window.track(5) else {
            panic!("not a rewind");
        };
        assert_eq!(rewind.forgotten, 4, "5, 6, 8 and 9 were unresolved");
        assert_eq!(rewind.position_after, Some(1), "1..5 still hold it back");
        // A late outcome of the old record at 6 changes nothing; the new 6 is tracked apart.
        assert_eq!(window.resolve(6, 0), Err(UntrackedOffset::Forgotten(6)));
        assert_eq!(window.track(6), TrackResult::Tracked(1));
        assert_eq!(window.resolve(6, 0), Err(UntrackedOffset::Forgotten(6)));
        assert!(window.is_unresolved(6, 1));
        // The records below the rewind did not change: their outcomes count.
        for offset in 1..5 {
            window.resolve(offset, 0).unwrap();
        }
        assert_eq!(window.position(), Some(5), "the new 5 holds it");
        window.resolve(5, 1).unwrap();
        window.resolve(6, 1).unwrap();
        assert_eq!(window.position(), Some(7));
        assert!(window.is_empty());
    }

    #[test]
    fn the_same_offset_delivered_again_is_a_rewind_too() {
        let mut window = OffsetWindow::new();
        tracked(&mut window, [1, 4]);
        let TrackResult::Rewound(rewind) = window.track(4) else {
            panic!("not a rewind");
        };
        assert_eq!((rewind.to, rewind.forgotten, rewind.generation), (4, 1, 1));
        assert_eq!(window.unresolved(), 2);
        window.resolve(1, 0).unwrap();
        window.resolve(4, 1).unwrap();
        assert_eq!(window.position(), Some(5));
    }
}
