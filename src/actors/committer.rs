//! The OffsetCommitter: one ordered window per assigned partition, fed by Track (before
//! dispatch) and Resolved (after the database work is durable). It asks the Kafka side to
//! commit each partition's position — periodically, on revoke and on shutdown, and only when the
//! position moved since the last commit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::{debug, info, warn};

use super::messages::{
    AttachKafka, CommitOffsets, CommitPosition, CommitReason, Drain, Epoch, InspectWindows, Lost,
    Resolved, Revoke, TopicPartition, Track, TrackReply, WindowSnapshot, WindowState, WindowUpdate,
};
use crate::metrics;
use crate::offsets::{OffsetWindow, TrackResult};

struct PartitionWindow {
    epoch: Epoch,
    window: OffsetWindow,
    version: u64,
    /// The position last handed to the Kafka side for committing.
    committed: Option<i64>,
    partition: Recipient<WindowUpdate>,
}

impl PartitionWindow {
    fn state(&self) -> WindowState {
        WindowState {
            len: self.window.len(),
            version: self.version,
        }
    }

    /// The position to commit, if it moved since the last commit.
    fn pending_commit(&self, tp: &TopicPartition) -> Option<CommitPosition> {
        let offset = self.window.position()?;
        (self.committed != Some(offset)).then(|| CommitPosition {
            tp: tp.clone(),
            epoch: self.epoch,
            offset,
        })
    }
}

pub struct OffsetCommitter {
    windows: HashMap<TopicPartition, PartitionWindow>,
    /// The newest ended epoch of each partition: Track and Resolved of an epoch at or below it
    /// belong to a revoked assignment and are discarded.
    closed: HashMap<TopicPartition, Epoch>,
    kafka: Option<Recipient<CommitOffsets>>,
    commit_interval: Duration,
    /// Set by Drain: no new offsets are tracked once shutdown has begun.
    draining: bool,
}

impl OffsetCommitter {
    pub fn new(commit_interval: Duration) -> Self {
        OffsetCommitter {
            windows: HashMap::new(),
            closed: HashMap::new(),
            kafka: None,
            commit_interval,
            draining: false,
        }
    }

    fn is_closed(&self, tp: &TopicPartition, epoch: Epoch) -> bool {
        self.closed.get(tp).is_some_and(|&closed| epoch <= closed)
    }

    fn close(&mut self, tp: &TopicPartition, epoch: Epoch) -> Option<PartitionWindow> {
        let closed = self.closed.entry(tp.clone()).or_insert(epoch);
        *closed = (*closed).max(epoch);
        match self.windows.get(tp) {
            Some(window) if window.epoch <= epoch => {
                metrics::set_in_flight(tp, 0);
                self.windows.remove(tp)
            }
            _ => None,
        }
    }

    /// Positions that moved since their last commit, marked as committed.
    fn take_pending_commits(&mut self) -> Vec<CommitPosition> {
        let mut positions = Vec::new();
        for (tp, window) in &mut self.windows {
            if let Some(position) = window.pending_commit(tp) {
                window.committed = Some(position.offset);
                positions.push(position);
            }
        }
        positions.sort_by(|a, b| a.tp.cmp(&b.tp));
        positions
    }

    fn commit(&mut self, reason: CommitReason) {
        let positions = self.take_pending_commits();
        if positions.is_empty() {
            return;
        }
        match &self.kafka {
            Some(kafka) => kafka.do_send(CommitOffsets { positions, reason }),
            None => warn!("no Kafka side attached; positions not committed"),
        }
    }

    fn in_flight(&self) -> usize {
        self.windows.values().map(|w| w.window.unresolved()).sum()
    }
}

impl Actor for OffsetCommitter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Writers and partition actors report often; do not let them wait on a small mailbox.
        ctx.set_mailbox_capacity(1024);
        ctx.run_interval(self.commit_interval, |committer, _| {
            committer.commit(CommitReason::Periodic)
        });
    }
}

impl Handler<AttachKafka> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, msg: AttachKafka, _: &mut Context<Self>) {
        self.kafka = Some(msg.0);
    }
}

impl Handler<Track> for OffsetCommitter {
    type Result = MessageResult<Track>;

    fn handle(&mut self, msg: Track, _: &mut Context<Self>) -> MessageResult<Track> {
        if self.draining || self.is_closed(&msg.tp, msg.epoch) {
            return MessageResult(TrackReply::Rejected);
        }
        let window = self
            .windows
            .entry(msg.tp.clone())
            .or_insert_with(|| PartitionWindow {
                epoch: msg.epoch,
                window: OffsetWindow::new(),
                version: 0,
                committed: None,
                partition: msg.partition.clone(),
            });
        if window.epoch > msg.epoch {
            return MessageResult(TrackReply::Rejected);
        }
        if window.epoch < msg.epoch {
            // A newer assignment whose predecessor was never revoked here (its revoke is still
            // on its way): the old window's work is void.
            *window = PartitionWindow {
                epoch: msg.epoch,
                window: OffsetWindow::new(),
                version: 0,
                committed: None,
                partition: msg.partition.clone(),
            };
        }
        let dispatch = msg
            .offsets
            .iter()
            .map(|&offset| window.window.track(offset) != TrackResult::AlreadyTracked)
            .collect();
        window.version += 1;
        metrics::set_in_flight(&msg.tp, window.window.len());
        MessageResult(TrackReply::Accepted {
            dispatch,
            window: window.state(),
        })
    }
}

impl Handler<Resolved> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, msg: Resolved, _: &mut Context<Self>) {
        let mut moved: Vec<TopicPartition> = Vec::new();
        for resolved in msg.0 {
            let Some(window) = self.windows.get_mut(&resolved.tp) else {
                continue;
            };
            if window.epoch != resolved.epoch {
                continue;
            }
            match window.window.resolve(resolved.offset) {
                Ok(0) => {}
                Ok(_) if !moved.contains(&resolved.tp) => moved.push(resolved.tp),
                Ok(_) => {}
                // An offset below the position (redelivered and processed again): harmless.
                Err(untracked) => debug!(tp = %resolved.tp, %untracked, "resolution ignored"),
            }
        }
        for tp in moved {
            let window = self.windows.get_mut(&tp).expect("moved windows exist");
            window.version += 1;
            metrics::set_in_flight(&tp, window.window.len());
            window.partition.do_send(WindowUpdate {
                epoch: window.epoch,
                window: window.state(),
            });
        }
    }
}

impl Handler<Revoke> for OffsetCommitter {
    type Result = MessageResult<Revoke>;

    fn handle(&mut self, msg: Revoke, _: &mut Context<Self>) -> MessageResult<Revoke> {
        let mut positions = Vec::new();
        for (tp, epoch) in &msg.partitions {
            if let Some(window) = self.close(tp, *epoch) {
                if let Some(position) = window.pending_commit(tp) {
                    positions.push(position);
                }
                if window.window.unresolved() > 0 {
                    info!(
                        %tp,
                        unresolved = window.window.unresolved(),
                        waiting_for = ?window.window.first_unresolved(),
                        "partition revoked with records in flight; the next owner re-reads them"
                    );
                }
            }
        }
        if let Some(reply) = msg.reply {
            // The caller may have given up waiting (deadline); then nobody listens.
            let _ = reply.try_send(positions.clone());
        }
        MessageResult(positions)
    }
}

impl Handler<Lost> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, msg: Lost, _: &mut Context<Self>) {
        for (tp, epoch) in &msg.partitions {
            self.close(tp, *epoch);
        }
    }
}

impl Handler<InspectWindows> for OffsetCommitter {
    type Result = MessageResult<InspectWindows>;

    fn handle(&mut self, _: InspectWindows, _: &mut Context<Self>) -> Self::Result {
        let mut windows: Vec<WindowSnapshot> = self
            .windows
            .iter()
            .map(|(tp, window)| WindowSnapshot {
                tp: tp.clone(),
                epoch: window.epoch,
                len: window.window.len(),
                unresolved: window.window.unresolved(),
                position: window.window.position(),
                committed: window.committed,
            })
            .collect();
        windows.sort_by(|a, b| a.tp.cmp(&b.tp));
        MessageResult(windows)
    }
}

impl Handler<Drain> for OffsetCommitter {
    type Result = ResponseActFuture<Self, Vec<CommitPosition>>;

    fn handle(&mut self, msg: Drain, _: &mut Context<Self>) -> Self::Result {
        self.draining = true;
        let deadline = Instant::now() + msg.deadline;
        info!(in_flight = self.in_flight(), "draining in-flight records");
        let wait = async move {
            // Resolutions keep arriving while this future sleeps (it lets the mailbox run).
            loop {
                actix_rt::time::sleep(Duration::from_millis(20)).await;
                if Instant::now() >= deadline {
                    return;
                }
            }
        };
        let wait = actix::fut::wrap_future::<_, Self>(wait);
        // Check the condition each time the actor is polled, not just after the sleep.
        let until_drained = DrainUntil {
            inner: Box::pin(wait),
        };
        Box::pin(until_drained.map(|_, committer: &mut Self, _| {
            let left = committer.in_flight();
            if left > 0 {
                warn!(
                    in_flight = left,
                    "shutdown deadline passed with records in flight"
                );
            }
            committer.take_pending_commits()
        }))
    }
}

/// Completes when the committer has nothing in flight, or when the inner deadline future does.
struct DrainUntil {
    inner: std::pin::Pin<Box<dyn ActorFuture<OffsetCommitter, Output = ()>>>,
}

impl ActorFuture<OffsetCommitter> for DrainUntil {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        committer: &mut OffsetCommitter,
        ctx: &mut Context<OffsetCommitter>,
        task: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if committer.in_flight() == 0 {
            return std::task::Poll::Ready(());
        }
        self.inner.as_mut().poll(committer, ctx, task)
    }
}
