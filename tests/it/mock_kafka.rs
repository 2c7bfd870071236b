//! A mock Kafka supervisor: stands where the real one does, injects records at any offsets, in
//! any order, on any partitions, and records every commit, pause and resume it makes. It
//! answers commits like a broker — confirmed, or refused when told to refuse — and commits the
//! positions a revoke returns, as the real rebalance callback does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use history_service::actors::Pipeline;
use history_service::actors::messages::{
    CommitOffsets, CommitOutcome, CommitPosition, CommitReason, CommitResult, Drained, Epoch,
    InspectWindows, Lost, Record, Records, Revoke, StaleOutcomes, StopPartition, TopicPartition,
    WindowSnapshot,
};
use history_service::actors::partition::PartitionActor;
use history_service::actors::window_fill::WindowFill;

/// What the mock was asked to do.
#[derive(Default, Debug)]
pub struct MockLog {
    /// Commits the mock confirmed, in order (periodic and revoke).
    pub commits: Vec<CommitPosition>,
    /// Why each of `commits` was asked for.
    pub reasons: Vec<CommitReason>,
    /// Commits the mock refused.
    pub refused: Vec<CommitPosition>,
    /// What each revoke returned, in order.
    pub revoked: Vec<Vec<CommitPosition>>,
    /// Pauses and resumes, in order, as the real supervisor makes them.
    pub flow: Vec<Flow>,
    /// How many of the next commit requests to refuse.
    pub refuse_next: usize,
}

impl MockLog {
    /// Confirms or refuses a commit, like a broker; positions of partitions not assigned (in
    /// that epoch) are refused, like librdkafka's `__STATE`.
    fn commit(
        &mut self,
        positions: Vec<CommitPosition>,
        reason: CommitReason,
        assigned: &HashMap<TopicPartition, Assigned>,
    ) -> CommitOutcome {
        let mut outcome = CommitOutcome::default();
        if self.refuse_next > 0 {
            self.refuse_next -= 1;
            self.refused.extend(positions.iter().cloned());
            outcome.failed = positions;
            return outcome;
        }
        for position in positions {
            let current = assigned
                .get(&position.tp)
                .is_some_and(|assigned| assigned.epoch == position.epoch);
            if current {
                self.commits.push(position.clone());
                self.reasons.push(reason);
                outcome.confirmed.push(position);
            } else {
                self.refused.push(position.clone());
                outcome.failed.push(position);
            }
        }
        outcome
    }
}

/// A fetching decision of the Kafka side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flow {
    Paused(TopicPartition, Epoch),
    Resumed(TopicPartition, Epoch),
}

/// A partition assigned to the mock: its epoch, its actor and what it holds.
pub struct Assigned {
    epoch: Epoch,
    actor: Addr<PartitionActor>,
    window_fill: Arc<WindowFill>,
}

pub struct MockKafka {
    pipeline: Pipeline,
    partitions: HashMap<TopicPartition, Assigned>,
    log: Arc<Mutex<MockLog>>,
}

impl Actor for MockKafka {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Assign(pub TopicPartition, pub Epoch);

#[derive(Message)]
#[rtype(result = "()")]
pub struct Inject(pub TopicPartition, pub Vec<Record>);

/// Revokes a partition as the real rebalance callback does: the committer lets its in-flight
/// records resolve (up to the deadline), the returned positions are committed, then the
/// partition actor is stopped. Answers what the revoke returned.
#[derive(Message)]
#[rtype(result = "Vec<CommitPosition>")]
pub struct RevokePartition(pub TopicPartition, pub Duration);

impl Handler<Assign> for MockKafka {
    type Result = ();
    fn handle(&mut self, msg: Assign, ctx: &mut Context<Self>) {
        let (actor, window_fill) =
            self.pipeline
                .start_partition(msg.0.clone(), msg.1, ctx.address().recipient());
        let assigned = Assigned {
            epoch: msg.1,
            actor,
            window_fill,
        };
        if let Some(old) = self.partitions.insert(msg.0, assigned) {
            old.actor.do_send(StopPartition);
        }
    }
}

impl Handler<Inject> for MockKafka {
    type Result = ();
    fn handle(&mut self, msg: Inject, _: &mut Context<Self>) {
        let assigned = &self.partitions[&msg.0];
        // As the real consumer stream and supervisor: the records are taken (counted in the
        // budget), handed over, and a partition they fill is paused at once.
        let intake = self.pipeline.intake();
        let records: Vec<_> = msg
            .1
            .into_iter()
            .map(|record| {
                let held = intake.take(&record);
                (record, held)
            })
            .collect();
        let full = assigned.window_fill.handed_over(records.len());
        assigned.actor.do_send(Records(records));
        if full {
            let flow = Flow::Paused(msg.0.clone(), assigned.epoch);
            self.log.lock().unwrap().flow.push(flow);
        }
    }
}

impl Handler<RevokePartition> for MockKafka {
    type Result = ResponseActFuture<Self, Vec<CommitPosition>>;
    fn handle(&mut self, msg: RevokePartition, _: &mut Context<Self>) -> Self::Result {
        let epoch = self.partitions[&msg.0].epoch;
        let committer = self.pipeline.committer().clone();
        let revoke = committer.send(Revoke {
            partitions: vec![(msg.0.clone(), epoch)],
            deadline: msg.1,
            early: None,
            reply: None,
        });
        Box::pin(revoke.into_actor(self).map(move |positions, mock, _| {
            let positions = positions.unwrap();
            {
                let mut log = mock.log.lock().unwrap();
                log.revoked.push(positions.clone());
                log.commit(positions.clone(), CommitReason::Revoke, &mock.partitions);
            }
            let assigned = mock.partitions.remove(&msg.0).expect("assigned");
            assigned.actor.do_send(StopPartition);
            positions
        }))
    }
}

/// How many records of a partition were handed to its actor and not admitted to its window yet.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Queued(pub TopicPartition);

impl Handler<Queued> for MockKafka {
    type Result = usize;
    fn handle(&mut self, msg: Queued, _: &mut Context<Self>) -> usize {
        self.partitions
            .get(&msg.0)
            .map_or(0, |assigned| assigned.window_fill.queued())
    }
}

/// Answers once every message sent to the mock before it was handled.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Barrier;

impl Handler<Barrier> for MockKafka {
    type Result = ();
    fn handle(&mut self, _: Barrier, _: &mut Context<Self>) {}
}

/// Stops every partition actor, as shutdown does before it drains.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopAll;

impl Handler<StopAll> for MockKafka {
    type Result = ();
    fn handle(&mut self, _: StopAll, _: &mut Context<Self>) {
        for assigned in self.partitions.values() {
            assigned.actor.do_send(StopPartition);
        }
    }
}

/// The group moved on without us (session timeout, fenced member): no clean revoke.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LosePartition(pub TopicPartition);

impl Handler<LosePartition> for MockKafka {
    type Result = ResponseFuture<()>;
    fn handle(&mut self, msg: LosePartition, _: &mut Context<Self>) -> Self::Result {
        let Assigned { epoch, actor, .. } = self.partitions.remove(&msg.0).expect("assigned");
        actor.do_send(StopPartition);
        let committer = self.pipeline.committer().clone();
        Box::pin(async move {
            committer
                .send(Lost {
                    partitions: vec![(msg.0, epoch)],
                })
                .await
                .unwrap()
        })
    }
}

impl Handler<CommitOffsets> for MockKafka {
    type Result = ();
    fn handle(&mut self, msg: CommitOffsets, _: &mut Context<Self>) {
        let outcome = self
            .log
            .lock()
            .unwrap()
            .commit(msg.positions, msg.reason, &self.partitions);
        self.pipeline.committer().do_send(CommitResult(outcome));
    }
}

impl Handler<Drained> for MockKafka {
    type Result = ();
    fn handle(&mut self, msg: Drained, _: &mut Context<Self>) {
        let Some(assigned) = self.partitions.get(&msg.tp) else {
            return;
        };
        if assigned.epoch == msg.epoch && assigned.window_fill.resume() {
            self.log
                .lock()
                .unwrap()
                .flow
                .push(Flow::Resumed(msg.tp, msg.epoch));
        }
    }
}

/// The pipeline with a mock supervisor attached.
pub struct Harness {
    pub pipeline: Pipeline,
    pub kafka: Addr<MockKafka>,
    pub log: Arc<Mutex<MockLog>>,
}

impl Harness {
    pub fn start(pipeline: Pipeline) -> Harness {
        let log = Arc::new(Mutex::new(MockLog::default()));
        let kafka = MockKafka {
            pipeline: pipeline.clone(),
            partitions: HashMap::new(),
            log: log.clone(),
        }
        .start();
        pipeline.attach_kafka(kafka.clone().recipient());
        Harness {
            pipeline,
            kafka,
            log,
        }
    }

    pub async fn assign(&self, tp: &TopicPartition, epoch: Epoch) {
        self.kafka.send(Assign(tp.clone(), epoch)).await.unwrap();
    }

    pub async fn inject(&self, tp: &TopicPartition, records: Vec<Record>) {
        self.kafka.send(Inject(tp.clone(), records)).await.unwrap();
    }

    /// Records of `tp` handed to its actor and waiting outside its window.
    pub async fn queued(&self, tp: &TopicPartition) -> usize {
        self.kafka.send(Queued(tp.clone())).await.unwrap()
    }

    /// Polls `state` until `done` holds for what it answers, within `timeout`.
    pub async fn wait_until<T: std::fmt::Debug>(
        &self,
        what: &str,
        timeout: Duration,
        state: impl AsyncFn(&Harness) -> T,
        done: impl Fn(&T) -> bool,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let now = state(self).await;
            if done(&now) {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "{what} within {timeout:?}: {now:?}"
            );
            actix_rt::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Refuses the next `count` commit requests, as a broker in trouble would.
    pub fn refuse_commits(&self, count: usize) {
        self.log.lock().unwrap().refuse_next = count;
    }

    /// Outcomes the committer discarded because their assignment was over.
    pub async fn stale_outcomes(&self) -> u64 {
        self.pipeline.committer().send(StaleOutcomes).await.unwrap()
    }

    pub async fn windows(&self) -> Vec<WindowSnapshot> {
        self.pipeline
            .committer()
            .send(InspectWindows)
            .await
            .unwrap()
    }

    /// The highest position committed so far for a partition.
    pub fn committed(&self, tp: &TopicPartition) -> Option<i64> {
        self.log
            .lock()
            .unwrap()
            .commits
            .iter()
            .filter(|c| &c.tp == tp)
            .map(|c| c.offset)
            .max()
    }

    /// Every position committed for a partition, with its list of done offsets and why it was
    /// committed, in the order the commits were made.
    pub fn positions_of(&self, tp: &TopicPartition) -> Vec<(CommitPosition, CommitReason)> {
        let log = self.log.lock().unwrap();
        log.commits
            .iter()
            .zip(&log.reasons)
            .filter(|(c, _)| &c.tp == tp)
            .map(|(c, reason)| (c.clone(), *reason))
            .collect()
    }

    /// Every position committed for a partition, in the order the commits were made.
    pub fn commits_of(&self, tp: &TopicPartition) -> Vec<i64> {
        self.log
            .lock()
            .unwrap()
            .commits
            .iter()
            .filter(|c| &c.tp == tp)
            .map(|c| c.offset)
            .collect()
    }

    /// Waits until the last position committed for `tp` is `offset`.
    pub async fn wait_last_committed(&self, tp: &TopicPartition, offset: i64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.commits_of(tp).last() != Some(&offset) {
            assert!(
                Instant::now() < deadline,
                "{tp}'s last commit is not {offset} within {timeout:?}: commits {:?}, windows {:?}",
                self.commits_of(tp),
                self.windows().await
            );
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the committed position of `tp` reaches `offset`.
    pub async fn wait_committed(&self, tp: &TopicPartition, offset: i64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.committed(tp) != Some(offset) {
            assert!(
                Instant::now() < deadline,
                "{tp} not committed to {offset} within {timeout:?}: committed {:?}, windows {:?}",
                self.committed(tp),
                self.windows().await
            );
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn stop(&self) {
        self.pipeline.stop();
    }
}
