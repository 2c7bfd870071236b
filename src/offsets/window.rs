//! The ordered window of one partition's in-flight offsets.
//!
//! Kafka's committed position means "everything before this offset is done". So the window
//! tracks each fetched offset until its outcome is known, and the position only moves to the
//! last *contiguous* resolved offset + 1: one unresolved record holds back everything behind it.
//! Offsets never seen (compacted away, transaction markers) are gaps, not unresolved records.

use std::collections::VecDeque;

/// What [`OffsetWindow::track`] did with an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackResult {
    /// The offset is now in flight.
    Tracked,
    /// The offset is already in flight (a redelivery within the same assignment).
    AlreadyTracked,
    /// The position has already moved past this offset; it is not tracked. Processing it again
    /// is harmless (the inbox deduplicates) but it can no longer hold the position back.
    BelowPosition,
}

/// A resolution for an offset that is not in the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("offset {0} is not in flight")]
pub struct UntrackedOffset(pub i64);

#[derive(Debug, Clone, Default)]
pub struct OffsetWindow {
    /// Tracked offsets in increasing order, each with whether it is resolved. The front is
    /// always unresolved: resolved entries at the front are released at once.
    entries: VecDeque<(i64, bool)>,
    /// The commit position: last contiguous resolved offset + 1. `None` until the first
    /// resolution, because nothing is known about offsets before the first one seen.
    position: Option<i64>,
    unresolved: usize,
}

impl OffsetWindow {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts tracking a fetched offset.
    pub fn track(&mut self, offset: i64) -> TrackResult {
        if self.position.is_some_and(|position| offset < position) {
            return TrackResult::BelowPosition;
        }
        match self.entries.back() {
            // The fast path: Kafka hands a partition's records over in increasing order.
            None => self.entries.push_back((offset, false)),
            Some(&(last, _)) if offset > last => self.entries.push_back((offset, false)),
            Some(_) => match self.search(offset) {
                Ok(_) => return TrackResult::AlreadyTracked,
                Err(index) => self.entries.insert(index, (offset, false)),
            },
        }
        self.unresolved += 1;
        TrackResult::Tracked
    }

    /// Marks an offset resolved. Returns how many entries this released from the window (the
    /// position moved past them); 0 if the offset was behind an unresolved one or already
    /// resolved.
    pub fn resolve(&mut self, offset: i64) -> Result<usize, UntrackedOffset> {
        let index = self.search(offset).map_err(|_| UntrackedOffset(offset))?;
        let entry = &mut self.entries[index];
        if entry.1 {
            return Ok(0);
        }
        entry.1 = true;
        self.unresolved -= 1;
        if index != 0 {
            return Ok(0);
        }
        let mut released = 0;
        while let Some(&(front, true)) = self.entries.front() {
            self.entries.pop_front();
            self.position = Some(front + 1);
            released += 1;
        }
        Ok(released)
    }

    /// The offset to commit: every tracked offset before it is resolved.
    pub fn position(&self) -> Option<i64> {
        self.position
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

    /// Whether `offset` is tracked and not yet resolved.
    pub fn is_unresolved(&self, offset: i64) -> bool {
        self.search(offset)
            .is_ok_and(|index| !self.entries[index].1)
    }

    /// The oldest unresolved offset: what the position is waiting for.
    pub fn first_unresolved(&self) -> Option<i64> {
        self.entries.front().map(|&(offset, _)| offset)
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
        let first = self.entries.front()?.0;
        let past_started = self
            .entries
            .iter()
            .rev()
            .map(|&(offset, _)| offset)
            .find(|offset| !withdrawn.contains(offset))
            .map_or(first, |last| last + 1);
        Some(match stuck.iter().find(|&&offset| offset >= first) {
            Some(&stuck) => past_started.min(stuck),
            None => past_started,
        })
    }

    fn search(&self, offset: i64) -> Result<usize, usize> {
        self.entries
            .binary_search_by_key(&offset, |&(tracked, _)| tracked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_waits_for_the_oldest_unresolved_offset() {
        let mut window = OffsetWindow::new();
        for offset in 0..4 {
            assert_eq!(window.track(offset), TrackResult::Tracked);
        }
        assert_eq!(window.resolve(1), Ok(0));
        assert_eq!(window.resolve(2), Ok(0));
        assert_eq!(window.position(), None);
        assert_eq!(window.first_unresolved(), Some(0));
        assert_eq!(window.resolve(0), Ok(3));
        assert_eq!(window.position(), Some(3));
        assert_eq!(window.len(), 1);
        assert_eq!(window.resolve(3), Ok(1));
        assert_eq!(window.position(), Some(4));
        assert!(window.is_empty());
    }

    #[test]
    fn gaps_never_seen_do_not_hold_the_position_back() {
        let mut window = OffsetWindow::new();
        for offset in [10, 11, 15, 20] {
            window.track(offset);
        }
        for offset in [20, 15, 11, 10] {
            window.resolve(offset).unwrap();
        }
        assert_eq!(window.position(), Some(21));
    }

    #[test]
    fn a_revoke_cuts_the_unstarted_work_past_everything_written_or_being_written() {
        use std::collections::BTreeSet;
        let set = |offsets: &[i64]| offsets.iter().copied().collect::<BTreeSet<i64>>();
        let mut w = OffsetWindow::new();
        assert_eq!(w.withdrawal_cut(&set(&[]), &set(&[])), None);
        for offset in 100..110 {
            w.track(offset);
        }
        // 103 and 106 written or being written by other writers: the withdrawn work before
        // them is done here, the rest left.
        w.resolve(103).unwrap();
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
        w.track(1);
        w.track(2);
        assert!(w.is_unresolved(2) && !w.is_unresolved(3));
        w.resolve(2).unwrap();
        assert!(!w.is_unresolved(2) && w.is_unresolved(1));

        let mut window = OffsetWindow::new();
        window.track(5);
        window.track(6);
        assert_eq!(window.resolve(6), Ok(0));
        assert_eq!(window.resolve(6), Ok(0));
        assert_eq!(window.resolve(7), Err(UntrackedOffset(7)));
        assert_eq!(window.unresolved(), 1);
        assert_eq!(window.resolve(5), Ok(2));
        assert_eq!(window.resolve(5), Err(UntrackedOffset(5)));
    }

    #[test]
    fn redelivered_and_late_offsets_are_recognised() {
        let mut window = OffsetWindow::new();
        window.track(1);
        window.track(4);
        assert_eq!(window.track(4), TrackResult::AlreadyTracked);
        assert_eq!(
            window.track(2),
            TrackResult::Tracked,
            "a late offset fills its place"
        );
        window.resolve(1).unwrap();
        window.resolve(2).unwrap();
        window.resolve(4).unwrap();
        assert_eq!(window.position(), Some(5));
        assert_eq!(window.track(3), TrackResult::BelowPosition);
        assert!(window.is_empty());
    }
}
