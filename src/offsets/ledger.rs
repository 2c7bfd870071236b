//! The assignments of this process and what the broker confirmed for each: the guard that
//! keeps this process from ever sending a position that is not its own, or that would move a
//! group's committed position backwards. Three paths commit (periodic, revoke, shutdown) and can
//! race; each asks the ledger which of its positions still need sending.
//!
//! Checking against what was confirmed is not enough: a commit planned while a higher one is
//! queued but not yet answered (a periodic commit picked up by its thread just after the final
//! commit was queued) would pass, be sent after it, and the broker, applying commits in the order
//! they come, would end at the lower one. So the ledger also keeps the highest position queued in
//! each assignment, and raises a lower position to it: every position it queued was resolved
//! through, so committing it again covers the lower one, and commits leave in increasing order.
//!
//! Both halves are keyed by the assignment's epoch. A position of an epoch that is over is its
//! next owner's to commit, never ours; and what was confirmed in one epoch says nothing of the
//! next: a partition assigned again may rightly commit a lower position (the topic was deleted
//! and created again, or the group's position was reset meanwhile). Within an epoch, the same
//! holds of the log's generations: when the partition's log moved back (a topic created again
//! while assigned here, a truncated log), the positions of the new generation may be lower than
//! those of the one before — that is the log's truth now — and a position of an earlier
//! generation is never sent after one of a later one.

use crate::domain::{
    CommitOutcome, CommitPosition, Epoch, Generation, PartitionMap, TopicPartition,
};

#[derive(Debug)]
pub struct CommitLedger {
    /// The epoch of each partition assigned here now.
    epochs: PartitionMap<Epoch>,
    /// The newest position the broker confirmed for the partition's current epoch.
    confirmed: PartitionMap<Mark>,
    /// The highest position queued for the partition's current epoch, answered or not.
    queued: PartitionMap<Mark>,
    next_epoch: Epoch,
}

impl Default for CommitLedger {
    fn default() -> Self {
        CommitLedger {
            epochs: PartitionMap::default(),
            confirmed: PartitionMap::default(),
            queued: PartitionMap::default(),
            next_epoch: 1,
        }
    }
}

/// A position recorded for an assignment: its epoch, its log's generation and its offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    epoch: Epoch,
    generation: Generation,
    offset: i64,
    /// Offsets listed as done above `offset` by the commit that set it.
    listed: u64,
}

impl Mark {
    fn of(position: &CommitPosition) -> Mark {
        Mark {
            epoch: position.epoch,
            generation: position.generation,
            offset: position.offset,
            listed: position.done.count_above(position.offset),
        }
    }

    /// `position`, of the same epoch, folded into this mark: a later generation replaces it
    /// (its offset may be lower), the same one raises it, an earlier one changes nothing.
    fn with(self, position: &CommitPosition) -> Mark {
        if self.epoch != position.epoch || position.generation > self.generation {
            Mark::of(position)
        } else if position.generation == self.generation {
            match position.offset.cmp(&self.offset) {
                std::cmp::Ordering::Greater => Mark::of(position),
                std::cmp::Ordering::Equal => Mark {
                    listed: self.listed.max(Mark::of(position).listed),
                    ..self
                },
                std::cmp::Ordering::Less => self,
            }
        } else {
            self
        }
    }
}

/// How a commit request splits up.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CommitPlan {
    /// Ahead of the confirmed position of its epoch: to be sent to the broker — raised to the
    /// highest position already queued in its epoch, if that is higher.
    pub send: Vec<CommitPosition>,
    /// Covered already: this position or a later one of the same epoch was confirmed.
    pub covered: Vec<CommitPosition>,
    /// The partition's assignment (epoch) is over: its next owner commits it; or the position
    /// is of a generation of the log that moved back since.
    pub not_ours: Vec<CommitPosition>,
}

impl CommitLedger {
    /// Gives each partition a new assignment, with an epoch no earlier assignment had.
    pub fn assign(
        &mut self,
        partitions: impl IntoIterator<Item = TopicPartition>,
    ) -> Vec<(TopicPartition, Epoch)> {
        partitions
            .into_iter()
            .map(|tp| {
                let epoch = self.next_epoch;
                self.next_epoch += 1;
                self.epochs.insert(tp.clone(), epoch);
                (tp, epoch)
            })
            .collect()
    }

    /// Ends these assignments (those still current): from now on their positions are their
    /// next owner's to commit.
    pub fn forget(&mut self, partitions: &[(TopicPartition, Epoch)]) {
        for (tp, epoch) in partitions {
            if self.epochs.get(tp) == Some(epoch) {
                self.epochs.remove(tp);
                self.confirmed.remove(tp);
                self.queued.remove(tp);
            }
        }
    }

    /// The epoch of a partition's current assignment, if it is assigned here.
    pub fn epoch_of(&self, tp: &TopicPartition) -> Option<Epoch> {
        self.epochs.get(tp).copied()
    }

    /// How many partitions are assigned here.
    pub fn assigned(&self) -> usize {
        self.epochs.len()
    }

    /// Splits `positions` by what is to be done with each.
    pub fn plan(&self, positions: &[CommitPosition]) -> CommitPlan {
        self.plan_with(positions, false)
    }

    /// Like [`plan`](Self::plan), but a position equal to the confirmed one is sent again (a
    /// re-assertion of what this owner committed); one behind it is still never sent.
    pub fn plan_reasserting(&self, positions: &[CommitPosition]) -> CommitPlan {
        self.plan_with(positions, true)
    }

    fn plan_with(&self, positions: &[CommitPosition], resend_confirmed: bool) -> CommitPlan {
        let mut plan = CommitPlan::default();
        let same = |mark: Option<&Mark>, position: &CommitPosition| {
            mark.copied().filter(|mark| {
                mark.epoch == position.epoch && mark.generation == position.generation
            })
        };
        let later_generation = |mark: Option<&Mark>, position: &CommitPosition| {
            mark.is_some_and(|mark| {
                mark.epoch == position.epoch && mark.generation > position.generation
            })
        };
        for position in positions {
            let confirmed = self.confirmed.get(&position.tp);
            let queued = self.queued.get(&position.tp);
            if self.epoch_of(&position.tp) != Some(position.epoch)
                || later_generation(confirmed, position)
                || later_generation(queued, position)
            {
                plan.not_ours.push(position.clone());
            } else if same(confirmed, position).is_some_and(|confirmed| {
                confirmed.offset > position.offset
                    || (confirmed.offset == position.offset
                        && !resend_confirmed
                        && position.done.count_above(position.offset) <= confirmed.listed)
            }) {
                // Sending it would move the group's position backwards (a revoke or the final
                // commit overtook this one), or repeat a commit.
                plan.covered.push(position.clone());
            } else {
                let offset = match same(queued, position) {
                    Some(queued) => queued.offset.max(position.offset),
                    None => position.offset,
                };
                plan.send.push(CommitPosition {
                    offset,
                    ..position.clone()
                });
            }
        }
        plan
    }

    /// Records positions handed to the client for sending (those of assignments still
    /// current): no later commit of their epoch is sent lower.
    pub fn queued(&mut self, positions: &[CommitPosition]) {
        for position in positions {
            if self.epoch_of(&position.tp) != Some(position.epoch) {
                continue;
            }
            let queued = self
                .queued
                .entry(position.tp.clone())
                .or_insert(Mark::of(position));
            *queued = queued.with(position);
        }
    }

    /// Records positions the broker confirmed (those of assignments still current).
    pub fn confirm(&mut self, positions: &[CommitPosition]) {
        for position in positions {
            if self.epoch_of(&position.tp) != Some(position.epoch) {
                continue;
            }
            let confirmed = self
                .confirmed
                .entry(position.tp.clone())
                .or_insert(Mark::of(position));
            *confirmed = confirmed.with(position);
        }
    }

    /// The outcome of a plan once the broker answered the positions it sent.
    pub fn outcome(plan: CommitPlan, sent_ok: bool) -> CommitOutcome {
        let mut outcome = CommitOutcome {
            confirmed: plan.covered,
            failed: plan.not_ours,
        };
        if sent_ok {
            outcome.confirmed.extend(plan.send);
        } else {
            outcome.failed.extend(plan.send);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(partition: i32) -> TopicPartition {
        TopicPartition::new("t", partition)
    }

    fn at(partition: i32, epoch: Epoch, offset: i64) -> CommitPosition {
        CommitPosition {
            done: Default::default(),
            tp: tp(partition),
            epoch,
            generation: 0,
            offset,
        }
    }

    /// A position of a later generation of the partition's log (it moved back `generation`
    /// times in this assignment).
    fn of_generation(generation: Generation, position: CommitPosition) -> CommitPosition {
        CommitPosition {
            generation,
            ..position
        }
    }

    #[test]
    fn a_later_generation_commits_lower_and_an_earlier_one_never_after_it() {
        let mut ledger = assigned();
        ledger.confirm(&[at(0, 1, 1000)]);
        ledger.queued(&[at(0, 1, 1200)]);
        // The log moved back to 0 (the topic was created again): its positions go out, lower.
        let rewound = of_generation(1, at(0, 1, 40));
        assert_eq!(
            ledger.plan(std::slice::from_ref(&rewound)).send,
            vec![rewound.clone()]
        );
        ledger.queued(std::slice::from_ref(&rewound));
        // A periodic commit of the old log planned before it is never sent after it…
        let old = at(0, 1, 1300);
        assert_eq!(ledger.plan(std::slice::from_ref(&old)).not_ours, vec![old]);
        // …and the new log's positions are raised to what it queued, not to the old log's.
        let lower = of_generation(1, at(0, 1, 30));
        assert_eq!(ledger.plan(&[lower]).send, vec![rewound.clone()]);
        // Once confirmed, the new generation's position covers what is behind it.
        ledger.confirm(std::slice::from_ref(&rewound));
        let behind = of_generation(1, at(0, 1, 20));
        assert_eq!(
            ledger.plan(std::slice::from_ref(&behind)).covered,
            vec![behind]
        );
        // A confirmation of the old log arriving late changes nothing.
        ledger.confirm(&[at(0, 1, 1200)]);
        let next = of_generation(1, at(0, 1, 41));
        assert_eq!(ledger.plan(std::slice::from_ref(&next)).send, vec![next]);
    }

    /// `position` listing `runs` as done above it.
    fn listing(position: CommitPosition, runs: &[(i64, i64)]) -> CommitPosition {
        use crate::offsets::done::{DoneOffsets, Run};
        let done = DoneOffsets::from_runs(runs.iter().map(|&(first, last)| Run { first, last }));
        CommitPosition {
            done: std::sync::Arc::new(done),
            ..position
        }
    }

    #[test]
    fn a_confirmed_position_is_sent_again_only_when_it_lists_more_as_done() {
        let mut ledger = assigned();
        let first = listing(at(0, 1, 100), &[(102, 110)]);
        ledger.queued(std::slice::from_ref(&first));
        ledger.confirm(std::slice::from_ref(&first));
        let same = listing(at(0, 1, 100), &[(102, 110)]);
        assert_eq!(ledger.plan(std::slice::from_ref(&same)).covered, vec![same]);
        let more = listing(at(0, 1, 100), &[(102, 110), (120, 130)]);
        assert_eq!(
            ledger.plan(std::slice::from_ref(&more)).send,
            vec![more.clone()]
        );
        ledger.queued(std::slice::from_ref(&more));
        ledger.confirm(std::slice::from_ref(&more));
        assert_eq!(
            ledger.plan(std::slice::from_ref(&first)).covered,
            vec![first],
            "a shorter list than the one confirmed is not sent"
        );
    }

    /// A ledger with partitions 0 and 1 assigned, at epochs 1 and 2.
    fn assigned() -> CommitLedger {
        let mut ledger = CommitLedger::default();
        assert_eq!(ledger.assign([tp(0), tp(1)]), vec![(tp(0), 1), (tp(1), 2)]);
        ledger
    }

    #[test]
    fn a_position_behind_the_confirmed_one_is_never_sent() {
        let mut ledger = assigned();
        ledger.confirm(&[at(0, 1, 100)]);
        // A periodic commit of 40, overtaken by a revoke's commit of 100.
        let plan = ledger.plan(&[at(0, 1, 40), at(1, 2, 7)]);
        assert_eq!(plan.covered, vec![at(0, 1, 40)]);
        assert_eq!(plan.send, vec![at(1, 2, 7)]);
    }

    #[test]
    fn the_same_position_is_not_committed_twice() {
        let mut ledger = assigned();
        ledger.confirm(&[at(0, 1, 100)]);
        let plan = ledger.plan(&[at(0, 1, 100)]);
        assert_eq!((plan.send.len(), plan.covered.len()), (0, 1));
    }

    #[test]
    fn a_position_below_one_queued_and_unanswered_is_raised_to_it() {
        let mut ledger = assigned();
        ledger.queued(&[at(0, 1, 100)]);
        // Not yet confirmed: a lower position planned now must not leave after it, lower.
        let plan = ledger.plan(&[at(0, 1, 90), at(1, 2, 5)]);
        assert_eq!(plan.send, vec![at(0, 1, 100), at(1, 2, 5)]);
        // A higher one goes as it is.
        assert_eq!(ledger.plan(&[at(0, 1, 120)]).send, vec![at(0, 1, 120)]);
        // Confirmed, it covers what is behind it.
        ledger.confirm(&[at(0, 1, 100)]);
        assert_eq!(ledger.plan(&[at(0, 1, 90)]).covered, vec![at(0, 1, 90)]);
    }

    #[test]
    fn what_an_ended_epoch_queued_raises_nothing_of_a_later_one() {
        let mut ledger = assigned();
        ledger.queued(&[at(0, 1, 100)]);
        ledger.forget(&[(tp(0), 1)]);
        let epoch = ledger.assign([tp(0)])[0].1;
        ledger.queued(&[at(0, 1, 200)]);
        assert_eq!(
            ledger.plan(&[at(0, epoch, 40)]).send,
            vec![at(0, epoch, 40)]
        );
    }

    #[test]
    fn a_reassertion_sends_the_confirmed_position_again_but_never_one_behind_it() {
        let mut ledger = assigned();
        ledger.confirm(&[at(0, 1, 100), at(1, 2, 50)]);
        let plan = ledger.plan_reasserting(&[at(0, 1, 100), at(1, 2, 40), at(1, 1, 60)]);
        assert_eq!(plan.send, vec![at(0, 1, 100)]);
        assert_eq!(plan.covered, vec![at(1, 2, 40)]);
        assert_eq!(plan.not_ours, vec![at(1, 1, 60)]);
    }

    #[test]
    fn a_later_position_is_sent_and_confirming_an_older_one_never_lowers_it() {
        let mut ledger = assigned();
        ledger.confirm(&[at(0, 1, 100)]);
        assert_eq!(ledger.plan(&[at(0, 1, 101)]).send.len(), 1);
        ledger.confirm(&[at(0, 1, 50)]);
        assert_eq!(ledger.plan(&[at(0, 1, 60)]).covered.len(), 1);
    }

    #[test]
    fn positions_of_an_ended_assignment_are_not_ours_to_commit() {
        let mut ledger = assigned();
        ledger.forget(&[(tp(0), 1)]);
        let plan = ledger.plan(&[at(0, 1, 10), at(1, 2, 10)]);
        assert_eq!(plan.not_ours, vec![at(0, 1, 10)]);
        assert_eq!(plan.send, vec![at(1, 2, 10)]);
        let outcome = CommitLedger::outcome(plan, true);
        assert_eq!(outcome.confirmed, vec![at(1, 2, 10)]);
        assert_eq!(outcome.failed, vec![at(0, 1, 10)]);
        assert_eq!(ledger.assigned(), 1);
    }

    #[test]
    fn forgetting_an_older_epoch_leaves_the_current_assignment_alone() {
        let mut ledger = assigned();
        let again = ledger.assign([tp(0)]);
        assert_eq!(again, vec![(tp(0), 3)]);
        ledger.forget(&[(tp(0), 1)]);
        assert_eq!(ledger.epoch_of(&tp(0)), Some(3));
    }

    /// A partition assigned again may commit lower than what an earlier assignment confirmed:
    /// the topic was created anew, or the group's position was reset meanwhile.
    #[test]
    fn what_an_earlier_epoch_confirmed_does_not_cover_a_later_one() {
        let mut ledger = assigned();
        ledger.confirm(&[at(0, 1, 5_000)]);
        ledger.forget(&[(tp(0), 1)]);
        ledger.assign([tp(0)]);
        let plan = ledger.plan(&[at(0, 3, 40)]);
        assert_eq!(plan.send, vec![at(0, 3, 40)]);
        // Also when the new assignment came before the old one was forgotten here.
        let mut ledger = assigned();
        ledger.confirm(&[at(0, 1, 5_000)]);
        ledger.assign([tp(0)]);
        assert_eq!(ledger.plan(&[at(0, 3, 40)]).send, vec![at(0, 3, 40)]);
        ledger.confirm(&[at(0, 3, 40)]);
        assert_eq!(ledger.plan(&[at(0, 3, 40)]).covered, vec![at(0, 3, 40)]);
    }

    #[test]
    fn a_confirmation_of_an_ended_epoch_is_not_recorded() {
        let mut ledger = assigned();
        ledger.forget(&[(tp(0), 1)]);
        ledger.assign([tp(0)]);
        ledger.confirm(&[at(0, 1, 100)]);
        assert_eq!(ledger.plan(&[at(0, 3, 50)]).send.len(), 1);
    }
}
