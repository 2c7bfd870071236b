//! The consumer's librdkafka callbacks: rebalances, commits, statistics, errors.
//!
//! Rebalance callbacks run inside the consumer's poll, on the supervisor's thread. A revoke must
//! commit before it returns (after it, the partitions are gone and commits fail), so it asks the
//! OffsetCommitter — on another thread — to let the revoked partitions' in-flight records
//! resolve and to name their positions, waits for the answer (bounded by
//! `kafka.revoke_timeout_ms`), and commits them. Everything else is queued as an event for the
//! supervisor, in order with the records the same poll returns.
//!
//! While a rebalance callback is pending, librdkafka pauses *every* assigned partition — kept
//! ones too — and drops what it prefetched for them (`rd_kafka_rebalance_op_incr` in
//! rdkafka_cgrp.c); they fetch again only once the callback has called `incremental_unassign`.
//! So a revoke that waits stalls the intake of the whole instance, and it is kept short: what
//! the service already holds of the kept partitions keeps flowing through the writers, and the
//! revoke waits only for records that are moving — an event the database rejects (parked by
//! its writer) holds up no revoke, it is left to the next owner at its offset.
//!
//! The context keeps rdkafka's own `rebalance`, which calls `incremental_assign` /
//! `incremental_unassign` when librdkafka reports the cooperative protocol: it does for
//! cooperative-sticky and, once subscribed, always under `group.protocol=consumer` (KIP-848's
//! assignments are incremental; `rd_kafka_cgrp_rebalance_protocol` in rdkafka_cgrp.c).
//!
//! Every commit of this process — periodic (commit worker thread), revoke (here), shutdown
//! (supervisor) — goes through [`SupervisorContext::commit`], which checks it against the
//! ledger of assignments and confirmed positions (`Assignments`): a position is only sent
//! while its assignment is current and it is ahead of what its assignment confirmed, so the
//! group's position never moves backwards by our doing, whichever path commits and in whatever
//! order they race. The check and the queueing happen under the ledger's lock, the wait for the
//! broker's verdict without it. And only one commit is with librdkafka at a time
//! (`CommitTurn`): librdkafka sends a commit it held for an unavailable coordinator behind
//! later ones, so a later commit is queued only once the one before has its verdict.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::Recipient;
use rdkafka::TopicPartitionList;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::statistics::Statistics;
use tracing::{debug, error, info, warn};

use super::assignments::Assignments;
use super::bounded_commit::{Verdict, queue_commit};
use super::client_health::{ClientHealth, FetchPosition};
use super::commit_turn::{CommitTurn, Outstanding};
use super::done_lists::{DoneLists, commit_list, metadata_too_large};
use super::error_log::{ClientErrorLog, error_name};
use super::fetch_sizing::SizingWatch;
use super::messages::{Inherit, Lost, Revoke};
use super::topic_watch::TopicWatchSettings;
use crate::config::GroupProtocol;
use crate::domain::turns::Turns;
use crate::domain::{CommitOutcome, CommitPosition, CommitReason, Epoch, TopicPartition};
use crate::metrics::{self, Stats};
use crate::offsets::CommitLedger;

/// The part of `kafka.revoke_timeout_ms` kept for the revoke's commit (at most a quarter of
/// it): the committer's wait for in-flight records ends this long before the revoke's deadline.
const REVOKE_COMMIT_RESERVE: Duration = Duration::from_secs(1);
/// How long the revoke callback waits for the committer's answer beyond the committer's own
/// deadline (its mailbox may be busy when the deadline fires); taken from the commit's reserve.
const REVOKE_ANSWER_MARGIN: Duration = Duration::from_millis(250);
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

impl RebalanceEvent {
    /// The partitions assigned or revoked.
    pub fn partitions(&self) -> impl Iterator<Item = &TopicPartition> {
        let (RebalanceEvent::Assigned(partitions) | RebalanceEvent::Revoked { partitions, .. }) =
            self;
        partitions.iter().map(|(tp, _)| tp)
    }
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
    /// The current assignments (each partition's epoch) and what the broker confirmed for
    /// each, under one lock that orders every commit against the end of an assignment.
    assignments: Assignments,
    /// One commit with librdkafka at a time: commits leave in the order they were made.
    turn: CommitTurn,
    /// True once the consumer has joined its group and received an assignment (maybe empty).
    joined: Arc<AtomicBool>,
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
    /// Brokers unreachable, batches that cannot be decompressed: what readiness reports.
    health: Arc<ClientHealth>,
    /// The watch that the fetch requests' sizing still holds.
    sizing: Option<SizingWatch>,
    /// Where the lists of done offsets read at an assignment go, and how long the ones written
    /// into commits may be; without it, commits carry none and none are read.
    done_lists: Option<DoneLists>,
    /// How the client's prefetch is shared among partitions with queues of their own
    /// ([`super::split_queues`]), if they have; and whether that ended (batches larger than the
    /// turns allow were fetched: partitions are taken in fetch order from then on).
    turns: Option<Turns>,
    turns_ended: AtomicBool,
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
            assignments: Assignments::default(),
            turn: CommitTurn::default(),
            joined,
            closing: AtomicBool::new(false),
            errors: ClientErrorLog::default(),
            protocol: GroupProtocol::Classic,
            static_member: false,
            topic_watch: None,
            health: Arc::default(),
            sizing: None,
            done_lists: None,
            turns: None,
            turns_ended: AtomicBool::new(false),
        }
    }

    /// Writes into each commit's metadata the offsets above its position that are done, in at
    /// most `max_bytes` bytes, and reads them back for the partitions assigned, for `committer`
    /// ([`super::done_lists`]).
    pub fn with_done_lists(mut self, committer: Recipient<Inherit>, max_bytes: usize) -> Self {
        self.done_lists = Some(DoneLists::new(committer, max_bytes));
        self
    }

    fn metadata_max_bytes(&self) -> usize {
        self.done_lists.as_ref().map_or(0, DoneLists::max_bytes)
    }

    /// Reports the client's troubles (every broker down, batches it cannot decompress) to
    /// `health`, which readiness reads.
    pub fn with_health(mut self, health: Arc<ClientHealth>) -> Self {
        self.health = health;
        self
    }

    /// Watches that the fetch requests' sizing still holds (`super::fetch_sizing`).
    pub fn with_sizing(mut self, sizing: SizingWatch) -> Self {
        self.sizing = Some(sizing);
        self
    }

    /// Gives each assigned partition a queue of its own, taken in turn with the others', their
    /// prefetch shared as `turns` says.
    pub fn with_turns(mut self, turns: Option<Turns>) -> Self {
        self.turns = turns;
        self
    }

    /// How the prefetch is shared while each assigned partition has a queue of its own; `None`
    /// when the partitions are taken in fetch order.
    pub fn turns(&self) -> Option<&Turns> {
        self.turns
            .as_ref()
            .filter(|_| !self.turns_ended.load(Ordering::Relaxed))
    }

    /// How the prefetch was shared at start-up, whether the turns ended since or not: the
    /// partitions that kept their queues then are still looked at with it.
    pub fn planned_turns(&self) -> Option<&Turns> {
        self.turns.as_ref()
    }

    /// Whether each assigned partition has a queue of its own.
    pub fn splits_partitions(&self) -> bool {
        self.turns().is_some()
    }

    /// Partitions are taken in fetch order from now on: those assigned later get no queue of
    /// their own.
    pub fn end_turns(&self) {
        self.turns_ended.store(true, Ordering::Relaxed);
    }

    /// Whether partitions took turns once and no longer do.
    pub fn turns_ended(&self) -> bool {
        self.turns.is_some() && self.turns_ended.load(Ordering::Relaxed)
    }

    /// The client's troubles.
    pub fn health(&self) -> &ClientHealth {
        &self.health
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

    /// Client errors go through `errors`, which the process's other clients share.
    pub fn with_error_log(mut self, errors: ClientErrorLog) -> Self {
        self.errors = errors;
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
        self.assignments.epoch_of(tp)
    }

    fn push(&self, event: RebalanceEvent) {
        self.events.lock().unwrap().push(event);
        self.notify.notify_one();
    }

    /// The current epochs of the listed partitions (those assigned here).
    fn epochs_of(&self, tpl: &TopicPartitionList) -> Vec<(TopicPartition, Epoch)> {
        self.assignments.epochs_of(partitions_of(tpl))
    }

    /// Ends the assignments: from now on their positions are the next owner's to commit.
    fn forget(&self, partitions: &[(TopicPartition, Epoch)]) {
        self.assignments.forget(partitions);
        for (tp, _) in partitions {
            self.health.forget(tp);
        }
    }

    /// How long a periodic commit may wait for the broker's verdict (`kafka.revoke_timeout_ms`,
    /// the bound of a commit's confirmation).
    pub fn commit_timeout(&self) -> Duration {
        self.revoke_timeout
    }

    /// Commits the positions that are ahead of what the broker confirmed, waits for the broker's
    /// verdict until `deadline`, and reports what is committed now. A position of a partition
    /// no longer assigned here (its epoch is over) is not sent: it is its next owner's to
    /// commit. A commit still waiting at the deadline counts as not made, and stays
    /// outstanding: no later commit is sent before its verdict came (`CommitTurn`). The
    /// ledger's lock is held only to check the positions and queue the commit, never while
    /// the broker answers.
    pub fn commit<C: Consumer<SupervisorContext>>(
        &self,
        consumer: &C,
        positions: &[CommitPosition],
        reason: CommitReason,
        deadline: Instant,
    ) -> (CommitOutcome, Option<KafkaError>) {
        let not_sent = || CommitOutcome {
            confirmed: Vec::new(),
            failed: positions.to_vec(),
        };
        let Some(mut turn) = self.turn.take(deadline) else {
            // Another thread's commit is with the broker past this one's deadline.
            self.stats.commit(reason.as_str(), "held");
            return (not_sent(), Some(timed_out()));
        };
        if let Some(earlier) = turn.take() {
            match earlier.commit.wait(deadline) {
                Verdict::Pending => {
                    self.held_back(&earlier, positions, reason);
                    *turn = Some(earlier);
                    return (not_sent(), Some(timed_out()));
                }
                verdict => self.late_verdict(earlier, verdict),
            }
        }
        let mut queued_at = None;
        let (plan, queued) = self.assignments.plan_and_send(positions, reason, |send| {
            // Taken under the ledger's lock: the order of these is the order commits leave in.
            queued_at = Some(chrono::Utc::now());
            queue_commit(consumer, &commit_list(send, self.metadata_max_bytes()))
        });
        for position in &plan.not_ours {
            debug!(tp = %position.tp, epoch = position.epoch, "not committed: assignment over");
        }
        let Some(queued) = queued else {
            return (CommitLedger::outcome(plan, true), None);
        };
        let result = match queued {
            Ok(commit) => match commit.wait(deadline) {
                Verdict::Pending => {
                    *turn = Some(Outstanding {
                        commit,
                        positions: plan.send.clone(),
                        reason,
                        queued_at: queued_at.unwrap_or_else(chrono::Utc::now),
                        since: Instant::now(),
                    });
                    Err(timed_out())
                }
                verdict => verdict.into_result(),
            },
            Err(err) => Err(err),
        };
        drop(turn);
        match self.verdict(result, &plan.send, reason, queued_at) {
            Ok(()) => {
                self.assignments.confirm(&plan.send);
                (CommitLedger::outcome(plan, true), None)
            }
            Err(err) => (CommitLedger::outcome(plan, false), Some(err)),
        }
    }

    /// The verdict of a commit that was outstanding, read by a later one: a confirmation counts
    /// (for the assignments still current), a refusal is told as any other.
    fn late_verdict(&self, earlier: Outstanding, verdict: Verdict) {
        let waited = earlier.since.elapsed();
        let confirmed = matches!(verdict, Verdict::Confirmed);
        info!(
            reason = earlier.reason.as_str(),
            partitions = earlier.positions.len(),
            confirmed,
            after_ms = waited.as_millis() as u64,
            "an offset commit that was still with the broker at its deadline has its verdict"
        );
        if self
            .verdict(
                verdict.into_result(),
                &earlier.positions,
                earlier.reason,
                Some(earlier.queued_at),
            )
            .is_ok()
        {
            self.assignments.confirm(&earlier.positions);
        }
    }

    /// A commit not sent, because the one before it still has no verdict.
    fn held_back(&self, earlier: &Outstanding, positions: &[CommitPosition], reason: CommitReason) {
        self.stats.commit(reason.as_str(), "held");
        warn!(
            reason = reason.as_str(),
            partitions = positions.len(),
            earlier_reason = earlier.reason.as_str(),
            waiting_ms = earlier.since.elapsed().as_millis() as u64,
            "offset commit not sent: the previous one still awaits the broker's verdict (the \
             group's coordinator is unavailable or does not answer; librdkafka holds that commit \
             and would send it after this one, moving the positions back)"
        );
    }

    /// Forgets the commit outstanding, for the close (see `CommitTurn::release`).
    pub fn release_outstanding_commit(&self) {
        if let Some(earlier) = self.turn.release() {
            info!(
                reason = earlier.reason.as_str(),
                partitions = earlier.positions.len(),
                waiting_ms = earlier.since.elapsed().as_millis() as u64,
                "closing with an offset commit still awaiting the broker's verdict: counted as \
                 not made"
            );
        }
    }

    /// [`commit`](Self::commit), retried while the broker's refusal may pass and `deadline` is
    /// ahead. At least one attempt is made.
    pub fn commit_until<C: Consumer<SupervisorContext>>(
        &self,
        consumer: &C,
        positions: &[CommitPosition],
        reason: CommitReason,
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
            warn!(
                partitions = ?names(&partitions),
                epochs = ?epochs(&partitions),
                "assignment lost: nothing is committed"
            );
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
            epochs = ?epochs(&partitions),
            protocol = protocol_name(consumer.rebalance_protocol()),
            "partitions revoked: letting their in-flight records resolve, then committing"
        );
        let started = Instant::now();
        let budget = RevokeBudget::new(started, self.revoke_timeout);
        let (early, early_answer) = std::sync::mpsc::sync_channel(1);
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        // Never lost to a full mailbox: a bounded send (`try_send`) parks its sender on a full
        // one and refuses the next message, and waiting for room here would stall every
        // partition; a revoke is rare and small.
        self.committer.revoke.do_send(Revoke {
            partitions: partitions.clone(),
            deadline: budget.records,
            early: Some(early),
            reply: Some(reply),
        });
        // What is resolved already is committed at once; what was in flight follows below.
        if let Ok(positions) = early_answer.recv_timeout(budget.answer_left()) {
            if !positions.is_empty() {
                self.commit(consumer, &positions, CommitReason::Revoke, budget.deadline);
            }
        }
        match answer.recv_timeout(budget.answer_left()) {
            Ok(positions) if positions.is_empty() => {}
            Ok(positions) => {
                let outcome =
                    self.commit_until(consumer, &positions, CommitReason::Revoke, budget.deadline);
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
        info!(
            partitions = ?names(&partitions),
            epochs = ?epochs(&partitions),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "revoke handled: partitions released"
        );
        self.forget(&partitions);
        self.push(RebalanceEvent::Revoked {
            partitions,
            lost: false,
        });
    }

    fn assign(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let partitions = self.assignments.assign(partitions_of(tpl));
        if let Some(done_lists) = &self.done_lists {
            // Before the event: the committer has the lists before any record comes.
            done_lists.read(consumer, &partitions, self.commit_timeout());
        }
        self.stats.rebalance("assign");
        info!(
            partitions = ?names(&partitions),
            epochs = ?epochs(&partitions),
            member_id = member_id(consumer).unwrap_or_default(),
            "partitions assigned"
        );
        self.joined.store(true, Ordering::Relaxed);
        self.push(RebalanceEvent::Assigned(partitions));
    }
}

/// How a revoke spends `kafka.revoke_timeout_ms`: the committer lets the in-flight records
/// resolve for most of it, and the commit gets the rest, so the whole revoke — the commit's
/// wait for the broker included — ends within the bound.
struct RevokeBudget {
    /// How long the committer waits for the revoked partitions' in-flight records.
    records: Duration,
    /// When the committer's answer is given up on.
    answer_by: Instant,
    /// When the revoke's commits give up waiting for the broker.
    deadline: Instant,
}

impl RevokeBudget {
    fn new(started: Instant, timeout: Duration) -> Self {
        let reserve = REVOKE_COMMIT_RESERVE.min(timeout / 4);
        let records = timeout - reserve;
        RevokeBudget {
            records,
            answer_by: started + records + REVOKE_ANSWER_MARGIN.min(reserve / 2),
            deadline: started + timeout,
        }
    }

    fn answer_left(&self) -> Duration {
        self.answer_by.saturating_duration_since(Instant::now())
    }
}

/// The partitions of a list.
fn partitions_of(tpl: &TopicPartitionList) -> impl Iterator<Item = TopicPartition> + '_ {
    tpl.elements()
        .into_iter()
        .map(|element| TopicPartition::new(element.topic(), element.partition()))
}

fn protocol_name(protocol: rdkafka::consumer::RebalanceProtocol) -> &'static str {
    match protocol {
        rdkafka::consumer::RebalanceProtocol::Cooperative => "cooperative",
        rdkafka::consumer::RebalanceProtocol::Eager => "eager",
        rdkafka::consumer::RebalanceProtocol::None => "none",
    }
}

/// The member id the group coordinator gave this consumer (what the broker's tools and its
/// OffsetCommit requests name it by); `None` before it joined.
fn member_id<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> Option<String> {
    // SAFETY: the handle is alive for the call; librdkafka returns a copy (or null), which is
    // ours to free with rd_kafka_mem_free.
    unsafe {
        let rk = consumer.client().native_ptr();
        let id = rdkafka::bindings::rd_kafka_memberid(rk);
        if id.is_null() {
            return None;
        }
        let owned = std::ffi::CStr::from_ptr(id).to_string_lossy().into_owned();
        rdkafka::bindings::rd_kafka_mem_free(rk, id.cast());
        Some(owned).filter(|id| !id.is_empty())
    }
}

fn names(partitions: &[(TopicPartition, Epoch)]) -> Vec<String> {
    partitions.iter().map(|(tp, _)| tp.to_string()).collect()
}

/// The epochs of the assignments, in the order of [`names`]: commit lines name theirs too.
fn epochs(partitions: &[(TopicPartition, Epoch)]) -> Vec<Epoch> {
    partitions.iter().map(|(_, epoch)| *epoch).collect()
}

/// Builds the list to commit: each partition at its position.
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

impl SupervisorContext {
    /// Logs and counts the broker's verdict on a commit of `positions`.
    fn verdict(
        &self,
        result: Result<(), KafkaError>,
        positions: &[CommitPosition],
        reason: CommitReason,
        queued_at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<(), KafkaError> {
        let stats = &self.stats;
        let reason = reason.as_str();
        let refused = result.as_ref().err().map(|err| refusal(err, self.protocol));
        if let (Err(err), Some(refused)) = (&result, refused) {
            log_refused(positions, reason, err, refused);
        }
        match result {
            Ok(()) => {
                log_committed(positions, reason, queued_at);
                stats.commit(reason, "ok");
                self.health.commit_confirmed();
                Ok(())
            }
            Err(err) if refused == Some(Refusal::StaleEpoch) => {
                // The client learns the group's epoch from its next heartbeat, which librdkafka
                // sends at once: a revoke or the final commit tries again while the partitions
                // are still ours, the periodic commit at its next tick.
                info!(
                    error = %err,
                    reason,
                    partitions = positions.len(),
                    "offset commit refused: this member's epoch is behind the group's; tried \
                     again while the partitions are still assigned here"
                );
                stats.commit(reason, "error");
                Err(err)
            }
            Err(err) if refused == Some(Refusal::Generation) => {
                // Expected while the group rebalances: the position is asked for again (by the
                // next tick, or by the revoke of this very rebalance).
                info!(error = %err, reason, partitions = positions.len(), "offset commit refused during a rebalance");
                stats.commit(reason, "error");
                if let Some(lasting) = self.health.commit_refused(&err.to_string(), Instant::now())
                {
                    // No rebalance lasts this long: the coordinator does not take this member
                    // for one of the group's.
                    error!(
                        error = %err,
                        refused_for_s = lasting.as_secs(),
                        "every offset commit has been refused for {} s as from a member the \
                         group's coordinator does not know: nothing is committed, and every \
                         record since is read again after a restart. If kafka.group_protocol \
                         was changed while members of the other protocol still run in the \
                         group, stop them (or switch them too); if another replica runs with \
                         the same kafka.group_instance_id, give each its own",
                        lasting.as_secs(),
                    );
                }
                Err(err)
            }
            Err(err) => {
                if metadata_too_large(&err) {
                    if let Some(done_lists) = &self.done_lists {
                        done_lists.refused_as_too_large();
                    }
                }
                warn!(error = %err, reason, positions = ?positions, "offset commit failed");
                stats.commit(reason, "error");
                Err(err)
            }
        }
    }
}

/// The service's own record of each commit: one line per partition, with the epoch of its
/// assignment, at debug level under the `history_service::commits` target (the chaos test and
/// the handover tests read them back). Written once the broker confirmed it, by whichever thread
/// waited — so two commits' lines may come in another order than the commits left in; their
/// `queued_at` (taken under the ledger's lock) is in the order they left in, which is the order
/// the broker applies them.
fn log_committed(
    positions: &[CommitPosition],
    reason: &'static str,
    queued_at: Option<chrono::DateTime<chrono::Utc>>,
) {
    let queued_at = queued_at
        .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        .unwrap_or_default();
    for position in positions {
        metrics::set_committed_offset(&position.tp, position.offset);
        debug!(
            target: "history_service::commits",
            topic = &*position.tp.topic,
            partition = position.tp.partition,
            offset = position.offset,
            epoch = position.epoch,
            generation = position.generation,
            reason,
            queued_at = %queued_at,
            "offset committed"
        );
    }
}

/// The service's record of each refused commit, beside [`log_committed`]'s: one line per
/// partition, with the position the broker did not take and how many resolved offsets above it
/// the commit listed — what the partition's next owner reads again, from the last confirmed
/// position, if no later commit lands (the handover tests bound their re-done records by it).
fn log_refused(
    positions: &[CommitPosition],
    reason: &'static str,
    error: &KafkaError,
    refused: Refusal,
) {
    let code = error
        .rdkafka_error_code()
        .map(|code| format!("{code:?}"))
        .unwrap_or_default();
    for position in positions {
        debug!(
            target: "history_service::commits",
            topic = &*position.tp.topic,
            partition = position.tp.partition,
            offset = position.offset,
            done = position.done.count(),
            epoch = position.epoch,
            reason,
            code = %code,
            refusal = ?refused,
            "offset commit refused for the partition"
        );
    }
}

impl ClientContext for SupervisorContext {
    fn stats(&self, statistics: Statistics) {
        let mut positions = Vec::new();
        for (topic, stats) in &statistics.topics {
            for (partition, stats) in &stats.partitions {
                let tp = TopicPartition::new(topic, *partition);
                if self.assignments.epoch_of(&tp).is_none() {
                    continue;
                }
                let offsets = [stats.committed_offset, stats.consumer_lag];
                if let Some(lag) = lag_of(offsets, stats.lo_offset, stats.ls_offset) {
                    metrics::set_consumer_lag(&tp, lag.records);
                    if let Some(start) = lag.never_committed_from {
                        metrics::set_committed_offset(&tp, start);
                    }
                }
                if stats.next_offset >= 0 && stats.hi_offset >= 0 {
                    let position = FetchPosition {
                        next: stats.next_offset,
                        end: stats.hi_offset,
                    };
                    positions.push((tp, position));
                }
            }
        }
        self.health.place_failures(&positions, Instant::now());
        if statistics
            .brokers
            .values()
            .any(|broker| broker.nodeid >= 0 && broker.state == "UP")
        {
            self.health.broker_up();
        }
        if let Some(sizing) = &self.sizing {
            sizing.observe(&statistics);
        }
    }

    /// Connection failures (`FAIL`) repeat for as long as a broker is away, and the error
    /// callback reports each again: they go through the summarised log. Every other line keeps
    /// librdkafka's own form — each says something once (an offset reset after a log
    /// truncation names its partition and position).
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel::*;
        match level {
            Emerg | Alert | Critical | Error | Warning if facility == "FAIL" => {
                self.errors.client_log(facility, message)
            }
            _ => rdkafka::client::DefaultClientContext.log(level, facility, message),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.health
            .client_error(Some(&error_name(&error)), reason, Instant::now());
        self.errors.client_error(&error, reason);
    }
}

impl ConsumerContext for SupervisorContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => self.revoke(consumer, tpl),
            // Before librdkafka starts fetching them: their records never reach the consumer
            // queue ([`super::split_queues`]).
            Rebalance::Assign(tpl) if self.splits_partitions() => {
                for tp in partitions_of(tpl) {
                    if !super::split_queues::mark_split(consumer, &tp) {
                        warn!(%tp, "the partition's queue could not be split off");
                    }
                }
            }
            Rebalance::Assign(_) | Rebalance::Error(_) => {}
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.assign(consumer, tpl),
            Rebalance::Revoke(_) => {}
            Rebalance::Error(err) => warn!(error = %err, "rebalance error"),
        }
    }
}

/// A partition's lag as the statistics tell it.
#[derive(Debug, PartialEq, Eq)]
struct Lag {
    records: i64,
    /// The group never committed this partition: it starts at the log start (the projection
    /// reads from the earliest record), given here so that the committed position is exported
    /// from the assignment on and a group stuck at its first record is seen on the dashboard.
    never_committed_from: Option<i64>,
}

/// librdkafka reports no lag (-1) for a partition its group never committed; such a group
/// has the whole log ahead of it, from the log start to the last stable offset.
fn lag_of([committed, consumer_lag]: [i64; 2], log_start: i64, last_stable: i64) -> Option<Lag> {
    if committed >= 0 {
        return (consumer_lag >= 0).then_some(Lag {
            records: consumer_lag,
            never_committed_from: None,
        });
    }
    (log_start >= 0 && last_stable >= log_start).then_some(Lag {
        records: last_stable - log_start,
        never_committed_from: Some(log_start),
    })
}

/// A commit without its verdict by its deadline.
fn timed_out() -> KafkaError {
    KafkaError::ConsumerCommit(RDKafkaErrorCode::OperationTimedOut)
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

    #[test]
    fn a_partition_never_committed_lags_by_the_whole_log_from_its_start() {
        // librdkafka: no committed offset (-1001), no lag (-1); the log holds 40..100.
        assert_eq!(
            lag_of([-1001, -1], 40, 100),
            Some(Lag {
                records: 60,
                never_committed_from: Some(40)
            })
        );
        assert_eq!(
            lag_of([70, 30], 40, 100),
            Some(Lag {
                records: 30,
                never_committed_from: None
            })
        );
        // Nothing known yet: nothing exported rather than a made-up figure.
        assert_eq!(lag_of([-1001, -1], -1, -1), None);
        assert_eq!(lag_of([70, -1], 40, 100), None);
    }
}
