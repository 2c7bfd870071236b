//! The consumer's librdkafka callbacks: rebalances, commits, statistics, errors.
//!
//! Rebalance callbacks run inside the consumer's poll, on the supervisor's thread. A revoke must
//! commit before it returns (after it, the partitions are gone and commits fail), so it asks the
//! OffsetCommitter — on another thread — to let the revoked partitions' in-flight records
//! resolve and to name their positions, waits for the answer (bounded by
//! `kafka.revoke_timeout_ms`), and commits them synchronously. Everything else is queued as an
//! event for the supervisor, in order with the records the same poll returns.
//!
//! The context keeps rdkafka's own `rebalance`, which calls `incremental_assign` /
//! `incremental_unassign` when librdkafka reports the cooperative protocol: it does for
//! cooperative-sticky and, once subscribed, always under `group.protocol=consumer` (KIP-848's
//! assignments are incremental; `rd_kafka_cgrp_rebalance_protocol` in rdkafka_cgrp.c).
//!
//! Every commit of this process — periodic (commit worker thread), revoke (here), shutdown
//! (supervisor) — goes through [`SupervisorContext::commit`], which serialises them and keeps a
//! ledger of what the broker confirmed: a position is only sent while it is ahead of the
//! confirmed one, so the group's position never moves backwards by our doing, whichever path
//! commits and in whatever order they race.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::Recipient;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::statistics::Statistics;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use super::bounded_commit::commit_within;
use super::commit_ledger::CommitLedger;
use super::error_log::ClientErrorLog;
use super::messages::{Lost, Revoke};
use super::topic_watch::TopicWatchSettings;
use crate::config::GroupProtocol;
use crate::domain::{CommitOutcome, CommitPosition, Epoch, TopicPartition};
use crate::metrics::{self, Stats};

/// How long the revoke callback waits for the committer beyond the committer's own deadline
/// (its mailbox may be busy when the deadline fires).
const REVOKE_ANSWER_MARGIN: Duration = Duration::from_secs(2);
/// Pause between attempts of a commit the broker refused for a reason that may pass.
const COMMIT_RETRY_BACKOFF: Duration = Duration::from_millis(100);

/// The recipients the callbacks reach the actors through.
pub struct CommitterLink {
    pub revoke: Recipient<Revoke>,
    pub lost: Recipient<Lost>,
}

/// A change of assignment, handed to the supervisor in order with the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Assigned(Vec<(TopicPartition, Epoch)>),
    /// The partitions are gone; `lost` if the group moved on without a clean revoke.
    Revoked {
        partitions: Vec<(TopicPartition, Epoch)>,
        lost: bool,
    },
}

/// State shared between the callbacks, the supervisor and the health endpoints.
pub struct SupervisorContext {
    committer: CommitterLink,
    revoke_timeout: Duration,
    stats: Arc<Stats>,
    events: Mutex<Vec<RebalanceEvent>>,
    /// Wakes the record stream when a callback queued an event, so the event is handled even if
    /// no record follows it.
    pub(super) notify: tokio::sync::Notify,
    /// The epoch of each currently assigned partition.
    epochs: Mutex<HashMap<TopicPartition, Epoch>>,
    next_epoch: AtomicU64,
    /// True once the consumer has joined its group and received an assignment (maybe empty).
    joined: Arc<AtomicBool>,
    /// The newest position the broker confirmed per partition. Held while a commit is under
    /// way, so commits from the three paths never interleave; every commit waits for it, and
    /// for the broker, only until its own deadline.
    ledger: parking_lot::Mutex<CommitLedger>,
    /// Set once the final commit is done and the consumer is being closed: the revoke that
    /// closing serves must not wait for the actors, which may be stopping (or waiting for the
    /// thread that closes the consumer).
    closing: AtomicBool,
    /// Client errors, aggregated (the supervisor logs the consumer's errors through it too).
    errors: ClientErrorLog,
    /// The group protocol: which refused commits may pass when tried again.
    protocol: GroupProtocol,
    /// A static member (`group.instance.id`) closes without leaving its group.
    static_member: bool,
    /// What the supervisor's topic watch looks for ([`super::topic_watch`]).
    topic_watch: Option<TopicWatchSettings>,
}

impl SupervisorContext {
    pub fn new(
        committer: CommitterLink,
        revoke_timeout: Duration,
        stats: Arc<Stats>,
        joined: Arc<AtomicBool>,
    ) -> Self {
        SupervisorContext {
            committer,
            revoke_timeout,
            stats,
            events: Mutex::new(Vec::new()),
            notify: tokio::sync::Notify::new(),
            epochs: Mutex::new(HashMap::new()),
            next_epoch: AtomicU64::new(1),
            joined,
            ledger: parking_lot::Mutex::new(CommitLedger::default()),
            closing: AtomicBool::new(false),
            errors: ClientErrorLog::default(),
            protocol: GroupProtocol::Classic,
            static_member: false,
            topic_watch: None,
        }
    }

    /// Has the supervisor watch that the configured topics exist.
    pub fn with_topic_watch(mut self, settings: TopicWatchSettings) -> Self {
        self.topic_watch = Some(settings);
        self
    }

    /// What the topic watch looks for, if there is to be one.
    pub fn topic_watch(&self) -> Option<&TopicWatchSettings> {
        self.topic_watch.as_ref()
    }

    /// The group protocol the consumer runs, and whether it is a static member.
    pub fn with_group(mut self, protocol: GroupProtocol, static_member: bool) -> Self {
        self.protocol = protocol;
        self.static_member = static_member;
        self
    }

    /// Whether the consumer is a static member of its group: closing it must not leave the
    /// group (no unsubscribe first), so that a restart within the session timeout takes its
    /// partitions back with no rebalance.
    pub fn is_static_member(&self) -> bool {
        self.static_member
    }

    /// Summarises repeated client errors once per `interval` (30 s by default).
    pub fn with_error_log_interval(mut self, interval: Duration) -> Self {
        self.errors = ClientErrorLog::new(interval);
        self
    }

    /// The aggregated log of client errors.
    pub fn errors(&self) -> &ClientErrorLog {
        &self.errors
    }

    /// Events queued by callbacks since the last call.
    pub fn take_events(&self) -> Vec<RebalanceEvent> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }

    /// The epoch of a partition's current assignment, if it is assigned.
    pub fn epoch_of(&self, tp: &TopicPartition) -> Option<Epoch> {
        self.epochs.lock().unwrap().get(tp).copied()
    }

    fn push(&self, event: RebalanceEvent) {
        self.events.lock().unwrap().push(event);
        self.notify.notify_one();
    }

    /// The current epochs of the listed partitions (those assigned here).
    fn epochs_of(&self, tpl: &TopicPartitionList) -> Vec<(TopicPartition, Epoch)> {
        let epochs = self.epochs.lock().unwrap();
        tpl.elements()
            .iter()
            .filter_map(|element| {
                let tp = TopicPartition::new(element.topic(), element.partition());
                epochs.get(&tp).map(|&epoch| (tp, epoch))
            })
            .collect()
    }

    /// Ends the assignments: from now on their positions are the next owner's to commit.
    fn forget(&self, partitions: &[(TopicPartition, Epoch)]) {
        let mut epochs = self.epochs.lock().unwrap();
        for (tp, epoch) in partitions {
            if epochs.get(tp) == Some(epoch) {
                epochs.remove(tp);
            }
        }
        metrics::set_assigned_partitions(epochs.len());
    }

    /// How long a periodic commit may wait for the broker's verdict (`kafka.revoke_timeout_ms`,
    /// the bound of a commit's confirmation).
    pub fn commit_timeout(&self) -> Duration {
        self.revoke_timeout
    }

    /// Commits the positions that are ahead of what the broker confirmed, waits for the broker's
    /// verdict until `deadline`, and reports what is committed now. A position of a partition
    /// no longer assigned here (its epoch is over) is not sent: it is its next owner's to
    /// commit. A commit still waiting at the deadline counts as not made.
    pub fn commit<C: Consumer<SupervisorContext>>(
        &self,
        consumer: &C,
        positions: &[CommitPosition],
        reason: &'static str,
        deadline: Instant,
    ) -> (CommitOutcome, Option<KafkaError>) {
        let Some(mut ledger) = self.ledger.try_lock_until(deadline) else {
            warn!(
                reason,
                positions = positions.len(),
                "offset commit not made: an earlier commit still waits for the broker"
            );
            let outcome = CommitOutcome {
                confirmed: Vec::new(),
                failed: positions.to_vec(),
            };
            let timed_out = KafkaError::ConsumerCommit(RDKafkaErrorCode::OperationTimedOut);
            return (outcome, Some(timed_out));
        };
        let plan = ledger.plan(positions, |tp| self.epoch_of(tp));
        for position in &plan.not_ours {
            debug!(tp = %position.tp, epoch = position.epoch, "not committed: assignment over");
        }
        if plan.send.is_empty() {
            return (CommitLedger::outcome(plan, true), None);
        }
        match commit_sync(
            consumer,
            &plan.send,
            &self.stats,
            reason,
            deadline,
            self.protocol,
        ) {
            Ok(()) => {
                ledger.confirm(&plan.send);
                (CommitLedger::outcome(plan, true), None)
            }
            Err(err) => (CommitLedger::outcome(plan, false), Some(err)),
        }
    }

    /// [`commit`](Self::commit), retried while the broker's refusal may pass and `deadline` is
    /// ahead. At least one attempt is made.
    pub fn commit_until<C: Consumer<SupervisorContext>>(
        &self,
        consumer: &C,
        positions: &[CommitPosition],
        reason: &'static str,
        deadline: Instant,
    ) -> CommitOutcome {
        let mut done = CommitOutcome::default();
        let mut pending = positions.to_vec();
        loop {
            let (outcome, error) = self.commit(consumer, &pending, reason, deadline);
            done.confirmed.extend(outcome.confirmed);
            let retry = error
                .as_ref()
                .is_some_and(|error| refusal(error, self.protocol).may_pass())
                && Instant::now() + COMMIT_RETRY_BACKOFF < deadline;
            if !retry {
                done.failed.extend(outcome.failed);
                return done;
            }
            // Positions whose assignment ended cannot succeed; keep only the others.
            pending = outcome
                .failed
                .into_iter()
                .filter(|position| {
                    let current = self.epoch_of(&position.tp) == Some(position.epoch);
                    if !current {
                        done.failed.push(position.clone());
                    }
                    current
                })
                .collect();
            if pending.is_empty() {
                return done;
            }
            std::thread::sleep(COMMIT_RETRY_BACKOFF);
        }
    }

    /// The final commit is done: what the consumer's close revokes is released as it is.
    pub fn closing(&self) {
        self.closing.store(true, Ordering::Relaxed);
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let partitions = self.epochs_of(tpl);
        if self.closing.load(Ordering::Relaxed) {
            debug!(partitions = ?names(&partitions), "partitions released at close");
            self.forget(&partitions);
            self.push(RebalanceEvent::Revoked {
                partitions,
                lost: false,
            });
            return;
        }
        if consumer.assignment_lost() {
            warn!(partitions = ?names(&partitions), "assignment lost: nothing is committed");
            self.stats.rebalance("lost");
            self.forget(&partitions);
            self.committer.lost.do_send(Lost {
                partitions: partitions.clone(),
            });
            self.joined.store(false, Ordering::Relaxed);
            self.push(RebalanceEvent::Revoked {
                partitions,
                lost: true,
            });
            return;
        }
        self.stats.rebalance("revoke");
        info!(
            partitions = ?names(&partitions),
            protocol = protocol_name(consumer.rebalance_protocol()),
            "partitions revoked: letting their in-flight records resolve, then committing"
        );
        let started = Instant::now();
        let (early, early_answer) = std::sync::mpsc::sync_channel(1);
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let _ = self.committer.revoke.try_send(Revoke {
            partitions: partitions.clone(),
            deadline: self.revoke_timeout,
            early: Some(early),
            reply: Some(reply),
        });
        // What is resolved already is committed at once; what was in flight follows below.
        if let Ok(positions) = early_answer.recv_timeout(REVOKE_ANSWER_MARGIN) {
            if !positions.is_empty() {
                self.commit(
                    consumer,
                    &positions,
                    "revoke",
                    started + self.revoke_timeout,
                );
            }
        }
        match answer.recv_timeout(self.revoke_timeout + REVOKE_ANSWER_MARGIN) {
            Ok(positions) if positions.is_empty() => {}
            Ok(positions) => {
                let outcome = self.commit_until(
                    consumer,
                    &positions,
                    "revoke",
                    started + self.revoke_timeout,
                );
                if !outcome.is_complete() {
                    warn!(
                        failed = ?outcome.failed,
                        "revoked partitions' positions not committed: their next owner re-reads \
                         from the last confirmed position"
                    );
                }
            }
            Err(_) => warn!(
                timeout_ms = self.revoke_timeout.as_millis() as u64,
                "the committer did not answer the revoke in time: nothing committed"
            ),
        }
        debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "revoke handled"
        );
        self.forget(&partitions);
        self.push(RebalanceEvent::Revoked {
            partitions,
            lost: false,
        });
    }

    fn assign(&self, tpl: &TopicPartitionList) {
        let partitions: Vec<(TopicPartition, Epoch)> = {
            let mut epochs = self.epochs.lock().unwrap();
            tpl.elements()
                .iter()
                .map(|element| {
                    let tp = TopicPartition::new(element.topic(), element.partition());
                    let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
                    epochs.insert(tp.clone(), epoch);
                    (tp, epoch)
                })
                .collect()
        };
        self.stats.rebalance("assign");
        info!(partitions = ?names(&partitions), "partitions assigned");
        metrics::set_assigned_partitions(self.epochs.lock().unwrap().len());
        self.joined.store(true, Ordering::Relaxed);
        self.push(RebalanceEvent::Assigned(partitions));
    }
}

fn protocol_name(protocol: rdkafka::consumer::RebalanceProtocol) -> &'static str {
    match protocol {
        rdkafka::consumer::RebalanceProtocol::Cooperative => "cooperative",
        rdkafka::consumer::RebalanceProtocol::Eager => "eager",
        rdkafka::consumer::RebalanceProtocol::None => "none",
    }
}

fn names(partitions: &[(TopicPartition, Epoch)]) -> Vec<String> {
    partitions.iter().map(|(tp, _)| tp.to_string()).collect()
}

/// Builds the list to commit: each partition at its position.
pub fn commit_list(positions: &[CommitPosition]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(positions.len());
    for position in positions {
        // Only fails for an invalid offset value, which a position never is.
        let _ = tpl.add_partition_offset(
            &position.tp.topic,
            position.tp.partition,
            Offset::Offset(position.offset),
        );
    }
    tpl
}

/// Why the broker (or the client) refused a commit, as far as retrying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Tied to the classic group's generation (a rebalance under way, a member the coordinator
    /// no longer knows) or to an assignment that is over: it will not pass while we hold up the
    /// rebalance by retrying.
    Generation,
    /// The `consumer` protocol's member epoch of this commit is behind the coordinator's
    /// (`STALE_MEMBER_EPOCH`): the member is still in the group. librdkafka heartbeats at once
    /// but does not retry a manual commit: tried again (with the epoch the client then has), it
    /// lands while the partition is still ours — and [`SupervisorContext::commit_until`] retries
    /// only positions of assignments that are still current. `UNKNOWN_MEMBER_ID` is not this:
    /// the member was fenced (its session expired, a frozen process), its partitions already
    /// belong to others, and a retry made after the client rejoined under a new member id would
    /// land — a zombie's commit that can move another owner's position backwards (seen in the
    /// frozen-member chaos run).
    StaleEpoch,
    /// Anything else (a coordinator moving, a time-out): may pass.
    Other,
}

impl Refusal {
    /// Whether the refused commit may succeed if tried again soon.
    pub(crate) fn may_pass(self) -> bool {
        self != Refusal::Generation
    }
}

/// Classifies a refused commit under `protocol`.
pub(crate) fn refusal(error: &KafkaError, protocol: GroupProtocol) -> Refusal {
    match (error.rdkafka_error_code(), protocol) {
        (Some(RDKafkaErrorCode::StaleMemberEpoch), GroupProtocol::Consumer) => Refusal::StaleEpoch,
        (
            Some(
                RDKafkaErrorCode::RebalanceInProgress
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::FencedInstanceId
                | RDKafkaErrorCode::FencedMemberEpoch
                | RDKafkaErrorCode::State
                | RDKafkaErrorCode::UnknownPartition,
            ),
            _,
        ) => Refusal::Generation,
        _ => Refusal::Other,
    }
}

/// Commits and waits for the broker's answer until `deadline`, then records the outcome.
fn commit_sync<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    positions: &[CommitPosition],
    stats: &Stats,
    reason: &'static str,
    deadline: Instant,
    protocol: GroupProtocol,
) -> Result<(), KafkaError> {
    let tpl = commit_list(positions);
    let result = commit_within(consumer, &tpl, deadline);
    let refused = result.as_ref().err().map(|err| refusal(err, protocol));
    match result {
        Ok(()) => {
            log_committed(&tpl, reason);
            stats.commit(reason, "ok");
            Ok(())
        }
        Err(err) if refused == Some(Refusal::StaleEpoch) => {
            // The client learns the group's epoch from its next heartbeat, which librdkafka
            // sends at once: a revoke or the final commit tries again while the partitions are
            // still ours, the periodic commit at its next tick.
            info!(
                error = %err,
                reason,
                partitions = positions.len(),
                "offset commit refused: this member's epoch is behind the group's; tried again \
                 while the partitions are still assigned here"
            );
            stats.commit(reason, "error");
            Err(err)
        }
        Err(err) if refused == Some(Refusal::Generation) => {
            // Expected while the group rebalances: the position is asked for again (by the
            // next tick, or by the revoke of this very rebalance).
            info!(error = %err, reason, partitions = positions.len(), "offset commit refused during a rebalance");
            stats.commit(reason, "error");
            Err(err)
        }
        Err(err) => {
            warn!(error = %err, reason, positions = ?positions, "offset commit failed");
            stats.commit(reason, "error");
            Err(err)
        }
    }
}

/// The service's own record of each commit: one line per partition, at debug level under the
/// `history_service::commits` target (the chaos test reads them back).
fn log_committed(tpl: &TopicPartitionList, reason: &'static str) {
    for element in tpl.elements() {
        if let Offset::Offset(offset) = element.offset() {
            let tp = TopicPartition::new(element.topic(), element.partition());
            metrics::set_committed_offset(&tp, offset);
            debug!(
                target: "history_service::commits",
                topic = element.topic(),
                partition = element.partition(),
                offset,
                reason,
                "offset committed"
            );
        }
    }
}

impl ClientContext for SupervisorContext {
    fn stats(&self, statistics: Statistics) {
        let epochs = self.epochs.lock().unwrap();
        for (topic, stats) in &statistics.topics {
            for (partition, stats) in &stats.partitions {
                let tp = TopicPartition::new(topic, *partition);
                if stats.consumer_lag >= 0 && epochs.contains_key(&tp) {
                    metrics::set_consumer_lag(&tp, stats.consumer_lag);
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.client_error(&error, reason);
    }
}

impl ConsumerContext for SupervisorContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.revoke(consumer, tpl);
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.assign(tpl),
            Rebalance::Revoke(_) => {}
            Rebalance::Error(err) => warn!(error = %err, "rebalance error"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: RDKafkaErrorCode, protocol: GroupProtocol) -> Refusal {
        refusal(&KafkaError::ConsumerCommit(code), protocol)
    }

    #[test]
    fn a_stale_member_epoch_may_pass_under_the_consumer_protocol() {
        use GroupProtocol::{Classic, Consumer};
        use RDKafkaErrorCode::*;
        assert_eq!(refused(StaleMemberEpoch, Consumer), Refusal::StaleEpoch);
        assert!(refused(StaleMemberEpoch, Consumer).may_pass());
        // An unknown member was fenced: its partitions moved, under either protocol; a retry
        // after the client rejoined would be a zombie's commit.
        assert_eq!(refused(UnknownMemberId, Consumer), Refusal::Generation);
        assert_eq!(refused(UnknownMemberId, Classic), Refusal::Generation);
        for code in [
            RebalanceInProgress,
            IllegalGeneration,
            FencedMemberEpoch,
            State,
        ] {
            for protocol in [Classic, Consumer] {
                assert!(!refused(code, protocol).may_pass(), "{code:?} {protocol:?}");
            }
        }
        assert_eq!(refused(CoordinatorNotAvailable, Consumer), Refusal::Other);
        assert!(refused(RequestTimedOut, Classic).may_pass());
    }
}
