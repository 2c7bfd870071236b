//! The OffsetCommitter: one ordered window per assigned partition. It admits decoded records
//! (tracks their offsets and hands them to the writers in one step), learns from the writers
//! which offsets resolved, and asks the Kafka side to commit each partition's contiguous
//! resolved position — periodically, on revoke and on shutdown — until the broker confirmed it.
//!
//! A position counts as committed only once the broker confirmed it ([`CommitResult`]); a
//! position ahead of the confirmed one is asked for again at every tick, so a refused commit
//! is retried even on a partition that went idle. A revoke or a drain first lets the affected
//! partitions' in-flight records resolve (bounded by its deadline), then answers with the
//! positions to commit; waiting is driven by the resolutions themselves, not by polling.

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;
use futures::channel::oneshot;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::dispatcher::Dispatcher;
use super::messages::{
    Admit, AdmitReply, AttachKafka, CommitOffsets, CommitPosition, CommitReason, CommitResult,
    Drain, DrainReport, Epoch, InspectWindows, Lost, Resolved, Revoke, StaleOutcomes,
    TopicPartition, WindowSnapshot, WindowState, WindowUpdate, WriteJob,
};
use crate::metrics;
use crate::offsets::{OffsetWindow, TrackResult};

struct PartitionWindow {
    epoch: Epoch,
    window: OffsetWindow,
    version: u64,
    /// The position the broker last confirmed for this assignment.
    confirmed: Option<i64>,
    partition: Recipient<WindowUpdate>,
}

impl PartitionWindow {
    fn new(epoch: Epoch, partition: Recipient<WindowUpdate>) -> Self {
        PartitionWindow {
            epoch,
            window: OffsetWindow::new(),
            version: 0,
            confirmed: None,
            partition,
        }
    }

    fn state(&self) -> WindowState {
        WindowState {
            len: self.window.len(),
            version: self.version,
        }
    }

    /// The position to commit, if it is ahead of the confirmed one.
    fn unconfirmed(&self, tp: &TopicPartition) -> Option<CommitPosition> {
        let offset = self.window.position()?;
        (self.confirmed.is_none_or(|confirmed| offset > confirmed)).then(|| CommitPosition {
            tp: tp.clone(),
            epoch: self.epoch,
            offset,
        })
    }

    /// Records resolved but waiting behind an unresolved one.
    fn resolved_behind(&self) -> usize {
        self.window.len() - self.window.unresolved()
    }
}

/// Which windows a waiter waits for.
enum Scope {
    All,
    Partitions(Vec<TopicPartition>),
}

/// A revoke or drain waiting for its partitions' in-flight records to resolve.
struct Waiter {
    id: u64,
    scope: Scope,
    done: oneshot::Sender<()>,
}

pub struct OffsetCommitter {
    windows: HashMap<TopicPartition, PartitionWindow>,
    /// The newest ended epoch of each partition: records and outcomes of an epoch at or below
    /// it belong to a revoked or lost assignment. Set when the revoke begins, so nothing new is
    /// admitted while the partition drains.
    closed: HashMap<TopicPartition, Epoch>,
    dispatcher: Dispatcher,
    kafka: Option<Recipient<CommitOffsets>>,
    commit_interval: Duration,
    /// Set by Drain: no new records are admitted once shutdown has begun.
    draining: bool,
    waiters: Vec<Waiter>,
    next_waiter: u64,
    /// Outcomes discarded because their epoch was over.
    stale_outcomes: u64,
    /// When positions were last sent for committing.
    last_commit: Instant,
    /// A commit brought forward by a partition that caught up is scheduled.
    catch_up_pending: bool,
}

/// A partition that caught up (nothing left in its window) has its position committed at once
/// rather than at the next tick — the end of a backlog is committed in milliseconds, not up to
/// a commit interval later — but no sooner than this part of the interval after the last
/// commit, so that a trickle of records does not commit each one.
const CATCH_UP_SPACING_DIVISOR: u32 = 20;

impl OffsetCommitter {
    pub fn new(commit_interval: Duration, dispatcher: Dispatcher) -> Self {
        OffsetCommitter {
            windows: HashMap::new(),
            closed: HashMap::new(),
            dispatcher,
            kafka: None,
            commit_interval,
            draining: false,
            waiters: Vec::new(),
            next_waiter: 0,
            stale_outcomes: 0,
            last_commit: Instant::now(),
            catch_up_pending: false,
        }
    }

    fn is_closed(&self, tp: &TopicPartition, epoch: Epoch) -> bool {
        self.closed.get(tp).is_some_and(|&closed| epoch <= closed)
    }

    /// Ends an assignment: nothing of it is admitted any more.
    fn mark_closed(&mut self, tp: &TopicPartition, epoch: Epoch) {
        let closed = self.closed.entry(tp.clone()).or_insert(epoch);
        *closed = (*closed).max(epoch);
    }

    /// Removes the window of an ended assignment, if it is still the current one.
    fn remove_window(&mut self, tp: &TopicPartition, epoch: Epoch) -> Option<PartitionWindow> {
        match self.windows.get(tp) {
            Some(window) if window.epoch <= epoch => {
                metrics::set_in_flight(tp, 0);
                self.windows.remove(tp)
            }
            _ => None,
        }
    }

    /// Every position ahead of its confirmed one, in partition order.
    fn unconfirmed_positions(&self) -> Vec<CommitPosition> {
        let mut positions: Vec<CommitPosition> = self
            .windows
            .iter()
            .filter_map(|(tp, window)| window.unconfirmed(tp))
            .collect();
        positions.sort_by(|a, b| a.tp.cmp(&b.tp));
        positions
    }

    fn commit(&mut self, reason: CommitReason) {
        let positions = self.unconfirmed_positions();
        if positions.is_empty() {
            return;
        }
        self.last_commit = Instant::now();
        match &self.kafka {
            Some(kafka) => kafka.do_send(CommitOffsets { positions, reason }),
            None => warn!("no Kafka side attached; positions not committed"),
        }
    }

    /// A partition caught up: its position is committed now, or as soon as the spacing allows.
    fn commit_caught_up(&mut self, ctx: &mut Context<Self>) {
        if self.catch_up_pending {
            return;
        }
        let due = self.last_commit + self.commit_interval / CATCH_UP_SPACING_DIVISOR;
        let now = Instant::now();
        if now >= due {
            self.commit(CommitReason::Periodic);
            return;
        }
        self.catch_up_pending = true;
        ctx.run_later(due - now, |committer, _| {
            committer.catch_up_pending = false;
            committer.commit(CommitReason::Periodic);
        });
    }

    fn in_flight(&self, scope: &Scope) -> usize {
        match scope {
            Scope::All => self.windows.values().map(|w| w.window.unresolved()).sum(),
            Scope::Partitions(tps) => tps
                .iter()
                .filter_map(|tp| self.windows.get(tp))
                .map(|w| w.window.unresolved())
                .sum(),
        }
    }

    /// A future that completes once nothing in `scope` is in flight, or when `deadline` passed.
    fn wait_until_settled(
        &mut self,
        scope: Scope,
        deadline: Duration,
        ctx: &mut Context<Self>,
    ) -> oneshot::Receiver<()> {
        let (done, settled) = oneshot::channel();
        if self.in_flight(&scope) == 0 || deadline.is_zero() {
            let _ = done.send(());
            return settled;
        }
        let id = self.next_waiter;
        self.next_waiter += 1;
        self.waiters.push(Waiter { id, scope, done });
        ctx.run_later(deadline, move |committer, _| {
            if let Some(index) = committer.waiters.iter().position(|w| w.id == id) {
                let _ = committer.waiters.swap_remove(index).done.send(());
            }
        });
        settled
    }

    /// Releases the waiters whose partitions have nothing in flight any more.
    fn wake_waiters(&mut self) {
        if self.waiters.is_empty() {
            return;
        }
        let waiters = std::mem::take(&mut self.waiters);
        for waiter in waiters {
            if self.in_flight(&waiter.scope) == 0 {
                let _ = waiter.done.send(());
            } else {
                self.waiters.push(waiter);
            }
        }
    }

    /// Tracks the jobs' offsets; returns the jobs to write (not those already in flight).
    fn admit(&mut self, msg: Admit) -> Result<(Vec<WriteJob>, WindowState), ()> {
        if self.draining || self.is_closed(&msg.tp, msg.epoch) {
            return Err(());
        }
        let window = self
            .windows
            .entry(msg.tp.clone())
            .or_insert_with(|| PartitionWindow::new(msg.epoch, msg.partition.clone()));
        if window.epoch > msg.epoch {
            return Err(());
        }
        if window.epoch < msg.epoch {
            // A newer assignment whose predecessor was never revoked here (its revoke is still
            // on its way): the old window's work is void.
            *window = PartitionWindow::new(msg.epoch, msg.partition.clone());
        }
        let jobs: Vec<WriteJob> = msg
            .jobs
            .into_iter()
            .filter(|job| window.window.track(job.offset) != TrackResult::AlreadyTracked)
            .collect();
        window.version += 1;
        metrics::set_in_flight(&msg.tp, window.window.len());
        Ok((jobs, window.state()))
    }

    /// Closes the revoked windows and returns the positions to commit for them.
    fn finish_revoke(&mut self, partitions: &[(TopicPartition, Epoch)]) -> Vec<CommitPosition> {
        let mut positions = Vec::new();
        for (tp, epoch) in partitions {
            let Some(window) = self.remove_window(tp, *epoch) else {
                continue;
            };
            if window.epoch != *epoch {
                continue;
            }
            positions.extend(window.unconfirmed(tp));
            if window.window.unresolved() > 0 {
                info!(
                    %tp,
                    unresolved = window.window.unresolved(),
                    resolved_behind = window.resolved_behind(),
                    waiting_for = ?window.window.first_unresolved(),
                    "partition revoked with records still in flight at the deadline; the next \
                     owner re-reads them"
                );
            }
        }
        positions
    }

    fn drain_report(&self) -> DrainReport {
        DrainReport {
            positions: self.unconfirmed_positions(),
            unresolved: self.in_flight(&Scope::All),
            resolved_behind: self.windows.values().map(|w| w.resolved_behind()).sum(),
        }
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

impl Handler<Admit> for OffsetCommitter {
    type Result = MessageResult<Admit>;

    fn handle(&mut self, msg: Admit, _: &mut Context<Self>) -> MessageResult<Admit> {
        match self.admit(msg) {
            Ok((jobs, window)) => {
                self.dispatcher.dispatch(jobs);
                MessageResult(AdmitReply::Accepted { window })
            }
            Err(()) => MessageResult(AdmitReply::Rejected),
        }
    }
}

impl Handler<Resolved> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, msg: Resolved, ctx: &mut Context<Self>) {
        let mut moved: Vec<TopicPartition> = Vec::new();
        for resolved in msg.0 {
            let window = match self.windows.get_mut(&resolved.tp) {
                Some(window) if window.epoch == resolved.epoch => window,
                _ => {
                    // Revoked or lost before the database answered: the next owner of the
                    // partition reads the record again and finds it applied.
                    self.stale_outcomes += 1;
                    continue;
                }
            };
            match window.window.resolve(resolved.offset) {
                Ok(0) => {}
                Ok(_) if !moved.contains(&resolved.tp) => moved.push(resolved.tp),
                Ok(_) => {}
                // An offset below the position (redelivered and processed again): harmless.
                Err(untracked) => debug!(tp = %resolved.tp, %untracked, "resolution ignored"),
            }
        }
        let mut caught_up = false;
        for tp in moved {
            let window = self.windows.get_mut(&tp).expect("moved windows exist");
            window.version += 1;
            caught_up |= window.window.is_empty();
            metrics::set_in_flight(&tp, window.window.len());
            window.partition.do_send(WindowUpdate {
                epoch: window.epoch,
                window: window.state(),
            });
        }
        if caught_up {
            self.commit_caught_up(ctx);
        }
        self.wake_waiters();
    }
}

impl Handler<CommitResult> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, msg: CommitResult, _: &mut Context<Self>) {
        for position in msg.0.confirmed {
            if let Some(window) = self.windows.get_mut(&position.tp) {
                if window.epoch == position.epoch {
                    window.confirmed = Some(
                        window
                            .confirmed
                            .map_or(position.offset, |c| c.max(position.offset)),
                    );
                }
            }
        }
        // Refused positions need nothing here: they stay ahead of the confirmed one, so the
        // next tick (or the revoke, or the drain) asks for them again.
    }
}

impl Handler<Revoke> for OffsetCommitter {
    type Result = ResponseActFuture<Self, Vec<CommitPosition>>;

    fn handle(&mut self, msg: Revoke, ctx: &mut Context<Self>) -> Self::Result {
        for (tp, epoch) in &msg.partitions {
            self.mark_closed(tp, *epoch);
        }
        let current: Vec<TopicPartition> = msg
            .partitions
            .iter()
            .filter(|(tp, epoch)| self.windows.get(tp).is_some_and(|w| w.epoch == *epoch))
            .map(|(tp, _)| tp.clone())
            .collect();
        // Once shutdown drained, whatever is left stays unresolved: do not wait for it twice.
        let deadline = if self.draining {
            Duration::ZERO
        } else {
            msg.deadline
        };
        if let Some(early) = &msg.early {
            let positions = current
                .iter()
                .filter_map(|tp| self.windows.get(tp).and_then(|w| w.unconfirmed(tp)))
                .collect();
            let _ = early.try_send(positions);
        }
        let in_flight = self.in_flight(&Scope::Partitions(current.clone()));
        if in_flight > 0 {
            debug!(in_flight, partitions = ?current, "revoke: letting in-flight records resolve");
        }
        let settled = self.wait_until_settled(Scope::Partitions(current), deadline, ctx);
        Box::pin(
            actix::fut::wrap_future::<_, Self>(settled).map(move |_, committer, _| {
                let positions = committer.finish_revoke(&msg.partitions);
                if let Some(reply) = msg.reply {
                    // The caller may have given up waiting; then nobody listens.
                    let _ = reply.try_send(positions.clone());
                }
                positions
            }),
        )
    }
}

impl Handler<Lost> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, msg: Lost, _: &mut Context<Self>) {
        for (tp, epoch) in &msg.partitions {
            self.mark_closed(tp, *epoch);
            self.remove_window(tp, *epoch);
        }
        self.wake_waiters();
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
                confirmed: window.confirmed,
            })
            .collect();
        windows.sort_by(|a, b| a.tp.cmp(&b.tp));
        MessageResult(windows)
    }
}

impl Handler<StaleOutcomes> for OffsetCommitter {
    type Result = u64;

    fn handle(&mut self, _: StaleOutcomes, _: &mut Context<Self>) -> u64 {
        self.stale_outcomes
    }
}

impl Handler<Drain> for OffsetCommitter {
    type Result = ResponseActFuture<Self, DrainReport>;

    fn handle(&mut self, msg: Drain, ctx: &mut Context<Self>) -> Self::Result {
        self.draining = true;
        info!(
            in_flight = self.in_flight(&Scope::All),
            "draining in-flight records"
        );
        let settled = self.wait_until_settled(Scope::All, msg.deadline, ctx);
        Box::pin(
            actix::fut::wrap_future::<_, Self>(settled).map(|_, committer, _| {
                let report = committer.drain_report();
                if report.unresolved > 0 {
                    warn!(
                        unresolved = report.unresolved,
                        resolved_behind = report.resolved_behind,
                        "shutdown deadline passed with records in flight"
                    );
                }
                report
            }),
        )
    }
}
