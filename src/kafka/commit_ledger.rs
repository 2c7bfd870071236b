//! What the broker confirmed, per partition: the guard that keeps this process from ever moving
//! a group's committed position backwards. Three paths commit (periodic, revoke, shutdown) and
//! can race; each asks the ledger which of its positions still need sending.

use std::collections::HashMap;

use crate::domain::{CommitOutcome, CommitPosition, Epoch, TopicPartition};

#[derive(Debug, Default)]
pub struct CommitLedger {
    confirmed: HashMap<TopicPartition, i64>,
}

/// How a commit request splits up.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CommitPlan {
    /// Ahead of the confirmed position: to be sent to the broker.
    pub send: Vec<CommitPosition>,
    /// Covered already: this position or a later one was confirmed.
    pub covered: Vec<CommitPosition>,
    /// The partition's assignment (epoch) is over: its next owner commits it.
    pub not_ours: Vec<CommitPosition>,
}

impl CommitLedger {
    /// Splits `positions`; `epoch_of` tells the current epoch of an assigned partition.
    pub fn plan(
        &self,
        positions: &[CommitPosition],
        epoch_of: impl Fn(&TopicPartition) -> Option<Epoch>,
    ) -> CommitPlan {
        let mut plan = CommitPlan::default();
        for position in positions {
            if epoch_of(&position.tp) != Some(position.epoch) {
                plan.not_ours.push(position.clone());
            } else if self
                .confirmed
                .get(&position.tp)
                .is_some_and(|&confirmed| confirmed >= position.offset)
            {
                // Sending it would move the group's position backwards (a revoke or the final
                // commit overtook this one), or repeat a commit.
                plan.covered.push(position.clone());
            } else {
                plan.send.push(position.clone());
            }
        }
        plan
    }

    /// Records positions the broker confirmed.
    pub fn confirm(&mut self, positions: &[CommitPosition]) {
        for position in positions {
            let confirmed = self
                .confirmed
                .entry(position.tp.clone())
                .or_insert(position.offset);
            *confirmed = (*confirmed).max(position.offset);
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

    fn at(partition: i32, epoch: Epoch, offset: i64) -> CommitPosition {
        CommitPosition {
            tp: TopicPartition::new("t", partition),
            epoch,
            offset,
        }
    }

    fn all_epoch_1(_: &TopicPartition) -> Option<Epoch> {
        Some(1)
    }

    #[test]
    fn a_position_behind_the_confirmed_one_is_never_sent() {
        let mut ledger = CommitLedger::default();
        ledger.confirm(&[at(0, 1, 100)]);
        // A periodic commit of 40, overtaken by a revoke's commit of 100.
        let plan = ledger.plan(&[at(0, 1, 40), at(1, 1, 7)], all_epoch_1);
        assert_eq!(plan.covered, vec![at(0, 1, 40)]);
        assert_eq!(plan.send, vec![at(1, 1, 7)]);
    }

    #[test]
    fn the_same_position_is_not_committed_twice() {
        let mut ledger = CommitLedger::default();
        ledger.confirm(&[at(0, 1, 100)]);
        let plan = ledger.plan(&[at(0, 1, 100)], all_epoch_1);
        assert_eq!((plan.send.len(), plan.covered.len()), (0, 1));
    }

    #[test]
    fn a_later_position_is_sent_and_confirming_an_older_one_never_lowers_it() {
        let mut ledger = CommitLedger::default();
        ledger.confirm(&[at(0, 1, 100)]);
        assert_eq!(ledger.plan(&[at(0, 1, 101)], all_epoch_1).send.len(), 1);
        ledger.confirm(&[at(0, 1, 50)]);
        assert_eq!(ledger.plan(&[at(0, 1, 60)], all_epoch_1).covered.len(), 1);
    }

    #[test]
    fn positions_of_an_ended_assignment_are_not_ours_to_commit() {
        let ledger = CommitLedger::default();
        let plan = ledger.plan(&[at(0, 1, 10), at(1, 2, 10)], |tp| {
            (tp.partition == 1).then_some(2)
        });
        assert_eq!(plan.not_ours, vec![at(0, 1, 10)]);
        assert_eq!(plan.send, vec![at(1, 2, 10)]);
        let outcome = CommitLedger::outcome(plan, true);
        assert_eq!(outcome.confirmed, vec![at(1, 2, 10)]);
        assert_eq!(outcome.failed, vec![at(0, 1, 10)]);
    }
}
