//! The Kafka supervisor: owns the consumer-group membership, fetches records, and hands each
//! partition's records to its partition actor. It pauses a partition the moment what it handed
//! over fills the partition's window, resumes it when its actor reports it drained (through the
//! intake's one fetching policy, which the stream also uses to pause the whole instance), and
//! performs the commits the OffsetCommitter asks for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use rdkafka::consumer::Consumer;
use tracing::{debug, info};

use super::messages::{
    CommitOffsets, CommitOutcome, CommitPosition, CommitReason, Drained, Epoch, Held, PassedOver,
    Record, Records, StopPartition, TopicPartition,
};
use super::partition::PartitionActor;
use super::pipeline::Pipeline;
use super::trace_check::TraceCheck;
use super::window_fill::WindowFill;
use crate::domain::PartitionMap;
use crate::domain::flow::{Changes, FlowPolicy};
use crate::health::DatabaseBehind;
use crate::kafka::commit_worker::CommitWorker;
use crate::kafka::intake::{self, RoomWait};
use crate::kafka::reset_watch::ResetWatch;
use crate::kafka::topic_watch::TopicWatch;
use crate::kafka::{HistoryConsumer, KafkaItem, RebalanceEvent, item_stream};

/// Least the stream waits for room in the budget before it pauses every partition and polls
/// the client for rebalance callbacks alone. Far above a healthy write (tens of milliseconds),
/// so that pausing — which discards what the client prefetched — is for a database that
/// stopped, and short enough that a rebalance waits little for this member.
const ROOM_LEAST_WAIT: Duration = Duration::from_millis(500);
/// Most it waits when room came slowly lately (a database slowed, not stopped, whose batches
/// each take longer than the least wait): what a rebalance may wait for this member then.
const ROOM_MOST_WAIT: Duration = Duration::from_secs(2);

pub(crate) struct KafkaSupervisor {
    phase: Phase,
    pipeline: Pipeline,
    partitions: PartitionMap<Assigned>,
    /// Tells records skipped by an offset reset from gaps, off this thread.
    resets: ResetWatch,
    /// Watches that the configured topics exist (ends when dropped).
    _topics: Option<TopicWatch>,
    /// Checks each assignment's committed position against the database.
    traces: Option<Traces>,
}

/// Where the supervisor is in its life. Each transition is a method that takes the phase and
/// gives the next, so what a phase no longer holds (the record stream, the client) cannot be
/// reached after it.
enum Phase {
    /// Built, not yet started: the stream is added when the actor starts.
    Starting(Client),
    /// Fetching records.
    Consuming {
        client: Client,
        fetching: SpawnHandle,
    },
    /// Fetching stopped (shutdown, step 1); commits are still made, the final one included.
    Draining(Client),
    /// The client was handed to the thread that closes it (shutdown, step 3).
    Closed,
}

/// The Kafka client and the worker that makes its commits, which live and close together.
struct Client {
    consumer: Arc<HistoryConsumer>,
    commits: CommitWorker,
}

impl Phase {
    fn client(&self) -> Option<&Client> {
        match self {
            Phase::Starting(client) | Phase::Consuming { client, .. } | Phase::Draining(client) => {
                Some(client)
            }
            Phase::Closed => None,
        }
    }

    /// Starting → Consuming, once the record stream runs under `fetching`.
    fn consuming(self, fetching: SpawnHandle) -> Phase {
        match self {
            Phase::Starting(client) => Phase::Consuming { client, fetching },
            other => other,
        }
    }

    /// Starting or Consuming → Draining; answers the stream to cancel, if one runs.
    fn draining(self) -> (Phase, Option<SpawnHandle>) {
        match self {
            Phase::Starting(client) => (Phase::Draining(client), None),
            Phase::Consuming { client, fetching } => (Phase::Draining(client), Some(fetching)),
            other => (other, None),
        }
    }

    /// Any phase → Closed; answers the client to close, unless it was handed over before.
    fn close(self) -> Option<Client> {
        match self {
            Phase::Starting(client) | Phase::Consuming { client, .. } | Phase::Draining(client) => {
                Some(client)
            }
            Phase::Closed => None,
        }
    }
}

/// The check of each new assignment against the database, and where it reports.
pub(crate) struct Traces {
    pub check: Arc<TraceCheck>,
    pub group: Arc<str>,
    pub behind: Arc<DatabaseBehind>,
}

/// A partition assigned here: its epoch, its actor and what it holds.
struct Assigned {
    epoch: Epoch,
    actor: Addr<PartitionActor>,
    window_fill: Arc<WindowFill>,
}

impl KafkaSupervisor {
    pub(crate) fn new(consumer: Arc<HistoryConsumer>, pipeline: Pipeline) -> Self {
        let commits =
            CommitWorker::start(consumer.clone(), pipeline.committer().clone().recipient());
        let resets = ResetWatch::start(Arc::downgrade(&consumer));
        let topics = consumer
            .context()
            .topic_watch()
            .map(|settings| TopicWatch::start(Arc::downgrade(&consumer), settings.clone()));
        KafkaSupervisor {
            phase: Phase::Starting(Client { consumer, commits }),
            pipeline,
            partitions: PartitionMap::default(),
            resets,
            _topics: topics,
            traces: None,
        }
    }

    /// Checks each partition, when it is assigned, against the database
    /// ([`super::trace_check`]).
    pub(crate) fn with_trace_check(mut self, traces: Traces) -> Self {
        self.traces = Some(traces);
        self
    }

    fn consumer(&self) -> Option<&HistoryConsumer> {
        self.phase.client().map(|client| &*client.consumer)
    }

    /// Moves to the phase `transition` gives.
    fn advance<R>(&mut self, transition: impl FnOnce(Phase) -> (Phase, R)) -> R {
        let (next, result) = transition(std::mem::replace(&mut self.phase, Phase::Closed));
        self.phase = next;
        result
    }

    fn rebalanced(&mut self, event: RebalanceEvent, ctx: &mut Context<Self>) {
        match event {
            RebalanceEvent::Assigned(assigned) => {
                self.resets.assigned(&assigned);
                if let Some(traces) = &self.traces {
                    let partitions = assigned.iter().map(|(tp, _)| tp.clone()).collect();
                    let (check, group, behind) = (
                        traces.check.clone(),
                        traces.group.clone(),
                        traces.behind.clone(),
                    );
                    // Off the fetch loop: it waits on the cluster and the database.
                    actix::spawn(async move {
                        check.on_assigned(partitions, &group, &behind).await;
                    });
                }
                let mut changes = Changes::default();
                for (tp, epoch) in assigned {
                    let change = self.flow(|flow| flow.assigned(tp.clone()));
                    changes.pause.extend(change.pause);
                    changes.resume.extend(change.resume);
                    let (actor, window_fill) =
                        self.pipeline
                            .start_partition(tp.clone(), epoch, ctx.address().recipient());
                    let assigned = Assigned {
                        epoch,
                        actor,
                        window_fill,
                    };
                    if let Some(old) = self.partitions.insert(tp, assigned) {
                        old.actor.do_send(StopPartition);
                    }
                }
                self.apply(&changes);
            }
            RebalanceEvent::Revoked { partitions, .. } => {
                self.resets.revoked(&partitions);
                if let Some(traces) = &self.traces {
                    // Its next owner checks it again.
                    for (tp, _) in &partitions {
                        traces.behind.clear(tp);
                    }
                }
                for (tp, epoch) in partitions {
                    if self.current_epoch(&tp) == Some(epoch) {
                        let assigned = self.partitions.remove(&tp).expect("present");
                        assigned.actor.do_send(StopPartition);
                        self.flow(|flow| flow.revoked(&tp));
                    }
                }
            }
        }
    }

    fn deliver(&self, tp: TopicPartition, records: Vec<(Record, Held)>) {
        match self.partitions.get(&tp) {
            Some(assigned) => {
                self.resets.records(&tp, assigned.epoch, &records);
                let full = assigned.window_fill.handed_over(records.len());
                assigned.actor.do_send(Records(records));
                if full {
                    // Paused now, not when the actor gets to it: the rest of this fetch would
                    // only wait in its queue.
                    self.pipeline.stats().pause();
                    debug!(%tp, "partition window full: pausing it");
                    let changes = self.flow(|flow| flow.window_full(tp));
                    self.apply(&changes);
                }
            }
            None => {
                // Not assigned here (a record fetched just before its revoke). Dropping it is
                // safe: nothing after it in this partition can be committed by this process.
                debug!(%tp, count = records.len(), "records of an unassigned partition dropped");
            }
        }
    }

    fn current_epoch(&self, tp: &TopicPartition) -> Option<Epoch> {
        self.partitions.get(tp).map(|assigned| assigned.epoch)
    }

    fn stop_partitions(&mut self) {
        for (_, assigned) in self.partitions.drain() {
            assigned.actor.do_send(StopPartition);
        }
    }

    fn flow<R>(&self, decide: impl FnOnce(&mut FlowPolicy<TopicPartition>) -> R) -> R {
        self.pipeline.intake().flow(decide)
    }

    fn apply(&self, changes: &Changes<TopicPartition>) {
        if let Some(consumer) = self.consumer() {
            intake::apply(consumer, changes);
        }
    }
}

impl Actor for KafkaSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1024);
        if let Some(client) = self.phase.client() {
            let intake = self.pipeline.intake().clone();
            let stream = item_stream(
                client.consumer.clone(),
                intake,
                RoomWait::new(ROOM_LEAST_WAIT, ROOM_MOST_WAIT),
            );
            let fetching = ctx.add_stream(stream);
            self.advance(|phase| (phase.consuming(fetching), ()));
        }
        // Summaries of repeated client errors are due even when the errors stopped.
        ctx.run_interval(Duration::from_secs(1), |supervisor, _| {
            if let Some(consumer) = supervisor.consumer() {
                consumer.context().errors().flush();
            }
        });
    }
}

impl StreamHandler<Vec<KafkaItem>> for KafkaSupervisor {
    fn handle(&mut self, items: Vec<KafkaItem>, ctx: &mut Context<Self>) {
        // A turn of the stream's items: records are grouped per partition, in order, into one
        // `Records` message each; a rebalance event first delivers what came before it.
        let mut runs: Vec<(TopicPartition, Vec<(Record, Held)>)> = Vec::new();
        for item in items {
            match item {
                KafkaItem::Record(tp, record, held) => {
                    match runs.iter_mut().find(|(t, _)| *t == tp) {
                        Some((_, records)) => records.push((record, held)),
                        None => runs.push((tp, vec![(record, held)])),
                    }
                }
                KafkaItem::Rebalance(event) => {
                    for (tp, records) in runs.drain(..) {
                        self.deliver(tp, records);
                    }
                    self.rebalanced(event, ctx);
                }
                KafkaItem::PassedOver(tp, offset) => {
                    if let Some(at) = runs.iter().position(|(t, _)| *t == tp) {
                        let (tp, records) = runs.remove(at);
                        self.deliver(tp, records);
                    }
                    if let Some(assigned) = self.partitions.get(&tp) {
                        assigned.actor.do_send(PassedOver(offset));
                    }
                }
                KafkaItem::Error(err) => {
                    if let Some(consumer) = self.consumer() {
                        consumer.context().errors().consumer_error(&err);
                    }
                }
            }
        }
        for (tp, records) in runs {
            self.deliver(tp, records);
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // The stream never ends by itself; it only stops when fetching is cancelled.
    }
}

impl Handler<Drained> for KafkaSupervisor {
    type Result = ();

    fn handle(&mut self, msg: Drained, _: &mut Context<Self>) {
        let Some(assigned) = self.partitions.get(&msg.tp) else {
            return;
        };
        if assigned.epoch == msg.epoch && assigned.window_fill.resume() {
            debug!(tp = %msg.tp, "partition window drained: resuming it");
            let changes = self.flow(|flow| flow.window_drained(&msg.tp));
            self.apply(&changes);
        }
    }
}

impl Handler<CommitOffsets> for KafkaSupervisor {
    type Result = ();

    fn handle(&mut self, msg: CommitOffsets, _: &mut Context<Self>) {
        // Positions of partitions revoked meanwhile are sorted out where commits are made, and
        // reported back to the committer as not committed.
        if let Some(client) = self.phase.client() {
            client.commits.commit(msg.positions, msg.reason);
        }
    }
}

/// Shutdown, step 1: stop fetching and stop the partition actors. Records already handed to
/// writers keep going; nothing new is dispatched.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct StopFetching;

impl Handler<StopFetching> for KafkaSupervisor {
    type Result = ();

    fn handle(&mut self, _: StopFetching, ctx: &mut Context<Self>) {
        if let Some(fetching) = self.advance(Phase::draining) {
            ctx.cancel_future(fetching);
        }
        if let Some(traces) = &self.traces {
            traces.check.stop();
        }
        self.stop_partitions();
        info!("fetching stopped");
    }
}

/// Shutdown, step 2: commit the final positions synchronously, retrying refusals that may
/// pass until the deadline. Answers what the broker confirmed.
#[derive(Message)]
#[rtype(result = "CommitOutcome")]
pub(crate) struct CommitFinal {
    pub positions: Vec<CommitPosition>,
    pub deadline: Instant,
}

impl Handler<CommitFinal> for KafkaSupervisor {
    type Result = MessageResult<CommitFinal>;

    fn handle(&mut self, msg: CommitFinal, _: &mut Context<Self>) -> Self::Result {
        let Some(consumer) = self.consumer() else {
            return MessageResult(CommitOutcome {
                confirmed: Vec::new(),
                failed: msg.positions,
            });
        };
        if msg.positions.is_empty() {
            return MessageResult(CommitOutcome::default());
        }
        info!(
            positions = msg.positions.len(),
            "committing final positions"
        );
        MessageResult(consumer.context().commit_until(
            consumer,
            &msg.positions,
            CommitReason::Shutdown,
            msg.deadline,
        ))
    }
}

/// Shutdown, step 3: leave the group and close the consumer. Closing waits on the broker (the
/// group's leave, the client's threads) and can take `session.timeout.ms` or longer with the
/// broker gone, so it runs on a thread of its own; the answer completes when the consumer is
/// closed, and the caller waits for it only as long as its deadline allows.
#[derive(Message)]
#[rtype(result = "tokio::sync::oneshot::Receiver<()>")]
pub(crate) struct CloseConsumer;

impl Handler<CloseConsumer> for KafkaSupervisor {
    type Result = MessageResult<CloseConsumer>;

    fn handle(&mut self, _: CloseConsumer, ctx: &mut Context<Self>) -> Self::Result {
        let (closed, answer) = tokio::sync::oneshot::channel();
        if let Some(consumer) = self.consumer() {
            // Said now: a close the broker holds up may not end before the process does.
            consumer.context().errors().flush_all();
        }
        let client = self.advance(|phase| (Phase::Closed, phase.close()));
        let closing = move || {
            if let Some(Client {
                consumer,
                mut commits,
            }) = client
            {
                commits.stop();
                consumer.context().closing();
                // Its result queue must not outlive the client.
                consumer.context().release_outstanding_commit();
                // A static member must not leave, so that its partitions wait for it to come
                // back (KIP-345): closing never sends a LeaveGroup for one, unsubscribing does
                // once its revoke is served (classic). Here that revoke is only served while
                // closing, when librdkafka already suppresses the leave — not an order to rely on.
                if !consumer.context().is_static_member() {
                    consumer.unsubscribe();
                }
                // Dropping the last handle closes the consumer: it leaves the group (serving the
                // final revoke, which commits nothing new) before returning.
                match Arc::try_unwrap(consumer) {
                    Ok(consumer) => drop(consumer),
                    // The offset-reset thread may be in a broker lookup; the consumer closes when
                    // it lets go (its revoke then releases the partitions without waiting for us).
                    Err(_) => info!("consumer still in use by a lookup; it closes when released"),
                }
            }
            let _ = closed.send(());
        };
        std::thread::Builder::new()
            .name("history-kafka-close".into())
            .spawn(closing)
            .expect("cannot start the thread that closes the consumer");
        ctx.stop();
        MessageResult(answer)
    }
}
