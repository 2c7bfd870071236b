//! The ledger of assignments and confirmed positions ([`CommitLedger`]), behind the one lock
//! that orders commits against the end of an assignment.
//!
//! A commit is checked against the ledger and handed to librdkafka (which only queues it, and
//! sends it in order with what was queued before) under the lock; the broker's verdict is then
//! awaited without it, so no commit ever holds up another, or a revoke, while it waits for the
//! broker. Ending an assignment takes the same lock, so a commit that passed the epoch check is
//! already queued when `forget` returns — before the revoke hands the partition back to
//! librdkafka (which then gives it to its next owner) — and a commit planned after it finds the
//! epoch over. Without that, a periodic commit checked just before a revoke could reach the
//! broker after the partition changed hands, and move its next owner's position backwards.

use parking_lot::Mutex;

use crate::domain::{CommitPosition, CommitReason, Epoch, TopicPartition};
use crate::metrics;
use crate::offsets::{CommitLedger, CommitPlan};

#[derive(Debug, Default)]
pub(crate) struct Assignments {
    ledger: Mutex<CommitLedger>,
}

impl Assignments {
    /// New assignments of these partitions, each with a new epoch.
    pub(crate) fn assign(
        &self,
        partitions: impl IntoIterator<Item = TopicPartition>,
    ) -> Vec<(TopicPartition, Epoch)> {
        let mut ledger = self.ledger.lock();
        let assigned = ledger.assign(partitions);
        metrics::set_assigned_partitions(ledger.assigned());
        assigned
    }

    /// Ends these assignments. A commit of theirs that passed the epoch check is queued with
    /// librdkafka before this returns; none is sent after.
    pub(crate) fn forget(&self, partitions: &[(TopicPartition, Epoch)]) {
        let mut ledger = self.ledger.lock();
        ledger.forget(partitions);
        metrics::set_assigned_partitions(ledger.assigned());
    }

    /// The epoch of a partition's current assignment, if it is assigned here.
    pub(crate) fn epoch_of(&self, tp: &TopicPartition) -> Option<Epoch> {
        self.ledger.lock().epoch_of(tp)
    }

    /// The current epochs of those of `partitions` assigned here.
    pub(crate) fn epochs_of(
        &self,
        partitions: impl IntoIterator<Item = TopicPartition>,
    ) -> Vec<(TopicPartition, Epoch)> {
        let ledger = self.ledger.lock();
        partitions
            .into_iter()
            .filter_map(|tp| ledger.epoch_of(&tp).map(|epoch| (tp, epoch)))
            .collect()
    }

    /// Plans `positions` and, if any is to be sent, hands those to `send` — under the lock, so
    /// that no assignment ends between the check and the queueing. `send` must only queue
    /// (never wait for the broker): every commit and revoke of the process waits for it.
    pub(crate) fn plan_and_send<Q>(
        &self,
        positions: &[CommitPosition],
        reason: CommitReason,
        send: impl FnOnce(&[CommitPosition]) -> Q,
    ) -> (CommitPlan, Option<Q>) {
        let mut ledger = self.ledger.lock();
        let plan = if reason.resends_confirmed() {
            ledger.plan_reasserting(positions)
        } else {
            ledger.plan(positions)
        };
        if plan.send.is_empty() {
            return (plan, None);
        }
        let queued = send(&plan.send);
        ledger.queued(&plan.send);
        (plan, Some(queued))
    }

    /// Records positions the broker confirmed.
    pub(crate) fn confirm(&self, positions: &[CommitPosition]) {
        self.ledger.lock().confirm(positions);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use super::*;

    fn tp(partition: i32) -> TopicPartition {
        TopicPartition::new("t", partition)
    }

    /// A confirmed position is queued again only by a re-assertion.
    #[test]
    fn only_a_reassertion_sends_a_confirmed_position_again() {
        let assignments = Assignments::default();
        let assigned = assignments.assign([tp(0)]);
        let position = CommitPosition {
            done: Default::default(),
            tp: tp(0),
            epoch: assigned[0].1,
            generation: 0,
            offset: 10,
        };
        assignments.confirm(std::slice::from_ref(&position));
        let sent = |reason| {
            let (_, queued) =
                assignments.plan_and_send(std::slice::from_ref(&position), reason, |send| {
                    send.to_vec()
                });
            queued.unwrap_or_default()
        };
        assert!(sent(CommitReason::Periodic).is_empty());
        assert!(sent(CommitReason::Revoke).is_empty());
        assert_eq!(sent(CommitReason::Reassert), vec![position.clone()]);
    }

    /// A commit is checked and queued while an assignment ends on another thread: the end
    /// waits until the commit is queued, and a commit planned after it is not sent. (Break
    /// `forget`'s lock and this fails: the assignment ends while the commit is between its
    /// check and its queueing.)
    #[test]
    fn an_assignment_does_not_end_between_a_commits_check_and_its_queueing() {
        let assignments = Arc::new(Assignments::default());
        let assigned = assignments.assign([tp(0)]);
        let position = CommitPosition {
            done: Default::default(),
            tp: tp(0),
            epoch: assigned[0].1,
            generation: 0,
            offset: 10,
        };
        let (checked, check_done) = std::sync::mpsc::channel();
        let forgotten = Arc::new(AtomicBool::new(false));
        let revoke = {
            let (assignments, forgotten) = (assignments.clone(), forgotten.clone());
            std::thread::spawn(move || {
                check_done.recv().unwrap();
                assignments.forget(&assigned);
                forgotten.store(true, Ordering::SeqCst);
            })
        };
        let (plan, queued) = assignments.plan_and_send(
            std::slice::from_ref(&position),
            CommitReason::Periodic,
            |send| {
                checked.send(()).unwrap();
                // The revoke has had every chance to end the assignment: given the lock, it
                // cannot have.
                let until = Instant::now() + Duration::from_millis(300);
                while Instant::now() < until {
                    if forgotten.load(Ordering::SeqCst) {
                        return Err("the assignment ended while the commit was being queued");
                    }
                    std::thread::yield_now();
                }
                Ok(send.len())
            },
        );
        assert_eq!(queued, Some(Ok(1)));
        assert_eq!(plan.send, vec![position.clone()]);
        revoke.join().unwrap();
        assert!(forgotten.load(Ordering::SeqCst));
        let (plan, queued) = assignments.plan_and_send(
            std::slice::from_ref(&position),
            CommitReason::Periodic,
            |_| (),
        );
        assert_eq!((plan.not_ours, queued), (vec![position], None));
    }
}
