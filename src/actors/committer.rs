//! The OffsetCommitter: one ordered window per assigned partition. It admits decoded records
//! (tracks their offsets and hands them to the writers in one step), learns from the writers
//! which offsets resolved, and asks the Kafka side to commit each partition's contiguous
//! resolved position — periodically, on revoke and on shutdown — until the broker confirmed it.
//!
//! A position counts as committed only once the broker confirmed it ([`CommitResult`]); a
//! position ahead of the confirmed one is asked for again at every tick, so a refused commit
//! is retried even on a partition that went idle. A revoke or a drain first lets the affected
//! partitions' in-flight records resolve (bounded by its deadline), then answers with the
//! positions to commit; waiting is driven by the resolutions themselves, not by polling. It
//! does not wait for a parked event (one the database rejects by itself, [`Parked`]) between
//! its retries, only while a retry writes it ([`RetryBegins`]): waiting longer would only hold
//! up the handover — and, for a revoke, every partition of the instance, which
//! librdkafka keeps paused while a rebalance callback runs. For the same reason a revoke first
//! takes back the revoked partitions' jobs that no writer has started ([`Withdrawn`]), writes
//! again only those below what other writers have written or are writing, and leaves the rest
//! to the next owner: it waits for the transactions under way, not for every queue to drain,
//! and nothing written is left behind the position it commits.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::channel::oneshot;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::dispatcher::Dispatcher;
use super::messages::{
    Admit, AdmitReply, AttachKafka, CommitOffsets, CommitPosition, CommitReason, CommitResult,
    Drain, DrainReport, Epoch, Inherit, InspectWindows, Lost, Parked, Resolved, RetryBegins,
    Revoke, StaleOutcomes, TopicPartition, WindowSnapshot, WindowState, WindowUpdate, Withdrawn,
    WriteJob,
};
use crate::domain::PartitionMap;
use crate::metrics;
use crate::offsets::{
    DoneOffsets, Generation, OffsetWindow, Rewind, Run, TrackResult, UntrackedOffset,
};

/// What the partition's previous owner listed as done above the position it committed
/// ([`crate::offsets::done`]).
struct Inherited {
    /// The committed position the list belongs to.
    position: i64,
    done: DoneOffsets,
}

struct PartitionWindow {
    epoch: Epoch,
    window: OffsetWindow,
    version: u64,
    /// The position the broker last confirmed for this assignment.
    confirmed: Option<i64>,
    /// How many offsets above the confirmed position its commit listed as done: a commit of the
    /// same position listing more is sent again (a position held back by one record still
    /// tells the next owner what was done behind it).
    confirmed_listed: u64,
    /// Unresolved offsets a revoke or a drain does not wait for: an event the database rejects
    /// (retried alone by its writer), a job a revoke took back and left to the next owner.
    set_aside: BTreeSet<i64>,
    /// The previous owner's list of done offsets, while it holds: until the log moves back, or
    /// if the first record comes from below its position (the group's position was moved).
    inherited: Option<Inherited>,
    partition: Recipient<WindowUpdate>,
    /// `history_in_flight` of the partition, set at every admit and every move.
    in_flight: ::metrics::Gauge,
}

impl PartitionWindow {
    fn new(
        tp: &TopicPartition,
        epoch: Epoch,
        partition: Recipient<WindowUpdate>,
        inherited: Option<Inherited>,
    ) -> Self {
        PartitionWindow {
            in_flight: metrics::in_flight(tp),
            epoch,
            window: OffsetWindow::new(),
            version: 0,
            confirmed: None,
            confirmed_listed: 0,
            set_aside: BTreeSet::new(),
            inherited,
            partition,
        }
    }

    /// Whether the record at `offset` was done by the previous owner: listed in its commit, and
    /// the log has not moved back since (a move back drops the list: [`Self::rewound`]).
    fn inherited_done(&mut self, tp: &TopicPartition, offset: i64) -> bool {
        let Some(inherited) = &self.inherited else {
            return false;
        };
        if offset < inherited.position {
            if inherited.done.is_empty() {
                self.inherited = None;
                return false;
            }
            info!(
                %tp,
                offset,
                committed = inherited.position,
                "the partition is read from below the position the previous owner committed; \
                 its list of done offsets is not used"
            );
            self.inherited = None;
            return false;
        }
        inherited.done.contains(offset)
    }

    /// The offsets above the position that are done: what this owner resolved, and what the
    /// previous owner listed beyond what this one has read.
    fn done(&self) -> Arc<DoneOffsets> {
        let highest = self.window.highest();
        let inherited = self
            .inherited
            .as_ref()
            .map(|inherited| match highest {
                Some(highest) => inherited.done.above(highest),
                None => inherited.done.clone(),
            })
            .unwrap_or_default();
        if self.window.unresolved() == 0 && inherited.is_empty() {
            return Arc::default();
        }
        let runs: Vec<Run> = self.window.resolved_runs().collect();
        Arc::new(DoneOffsets::from_runs(
            runs.into_iter().chain(inherited.runs().iter().copied()),
        ))
    }

    fn state(&self) -> WindowState {
        WindowState {
            len: self.window.len(),
            version: self.version,
        }
    }

    /// The position to commit, if it is ahead of the confirmed one (of this generation), or
    /// the same one listing more offsets as done.
    fn unconfirmed(&self, tp: &TopicPartition) -> Option<CommitPosition> {
        let position = self.held(tp)?;
        let ahead = match self.confirmed {
            None => true,
            Some(confirmed) if position.offset > confirmed => true,
            Some(confirmed) => {
                position.offset == confirmed
                    && position.done.count_above(confirmed) > self.confirmed_listed
            }
        };
        ahead.then_some(position)
    }

    /// The position this assignment holds, confirmed or not: none before a record resolved
    /// in order (committing the first record's offset then could lower a position another
    /// member moved on meanwhile — seen in the frozen-member chaos run) — except the position
    /// the previous owner committed, when its first record is still unresolved and more is done
    /// above it than that owner listed: a record held there (an event the database rejects)
    /// would otherwise keep everything this owner did behind it out of every commit, and each
    /// next owner would do it again.
    fn held(&self, tp: &TopicPartition) -> Option<CommitPosition> {
        let done = self.done();
        let offset = match self.window.position() {
            Some(offset) => offset,
            None => {
                let inherited = self.inherited.as_ref()?;
                let first = self.window.first_unresolved()?;
                if first != inherited.position
                    || done.count_above(first) <= inherited.done.count_above(first)
                {
                    return None;
                }
                first
            }
        };
        Some(CommitPosition {
            tp: tp.clone(),
            epoch: self.epoch,
            generation: self.window.generation(),
            offset,
            done,
        })
    }

    /// Records resolved but waiting behind an unresolved one.
    fn resolved_behind(&self) -> usize {
        self.window.len() - self.window.unresolved()
    }

    /// Unresolved records a revoke or a drain waits for: all but those set aside.
    fn awaited(&self) -> usize {
        self.window.unresolved() - self.set_aside.len()
    }

    /// Sets unresolved offsets of this assignment aside: nothing waits for them.
    fn set_aside(&mut self, epoch: Epoch, offsets: impl IntoIterator<Item = (Generation, i64)>) {
        if epoch != self.epoch {
            return;
        }
        for (generation, offset) in offsets {
            if self.window.is_unresolved(offset, generation) {
                self.set_aside.insert(offset);
            }
        }
    }

    /// The log moved back (`rewind`): what it forgot is not awaited, and nothing of the
    /// earlier generation counts as confirmed any more.
    fn rewound(&mut self, tp: &TopicPartition, rewind: Rewind) {
        self.set_aside.retain(|&offset| offset < rewind.to);
        self.inherited = None;
        self.confirmed = None;
        self.confirmed_listed = 0;
        metrics::offset_rewind(tp);
        error!(
            %tp,
            epoch = self.epoch,
            highest = rewind.highest,
            to = rewind.to,
            position_before = ?rewind.position_before,
            position_after = ?rewind.position_after,
            forgotten = rewind.forgotten,
            "the partition's log moved back: records from this offset on are new and are \
             processed as such; the group's position goes back with them (likely the topic was \
             deleted and created again, or its log truncated after an unclean leader election)"
        );
    }
}

/// Which windows a waiter waits for.
enum Scope {
    All,
    Partitions(Vec<TopicPartition>),
}

/// A revoke (or a drain at its deadline) gathering the unstarted jobs of its partitions from
/// the writers.
struct Withdrawal {
    /// Writers yet to answer.
    awaiting: usize,
    jobs: Vec<WriteJob>,
    /// Every job is left undone (a drain past its deadline), not only those past the cut.
    leave_all: bool,
}

/// How long a drain past its deadline still waits for the transactions under way, once no
/// writer starts another: what one of them writes after the final commit is written again by
/// the next owner.
const DRAIN_UNDER_WAY_GRACE: Duration = Duration::from_secs(1);

/// Where the committer is in its life: [`Drain`] (shutdown) ends admission for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Records are admitted to their partitions' windows.
    Admitting,
    /// Shutdown has begun: nothing new is admitted, what is in flight is let resolve.
    Draining,
}

/// A revoke or drain waiting for its partitions' in-flight records to resolve.
struct Waiter {
    id: u64,
    scope: Scope,
    done: oneshot::Sender<()>,
}

pub struct OffsetCommitter {
    windows: PartitionMap<PartitionWindow>,
    /// The newest ended epoch of each partition: records and outcomes of an epoch at or below
    /// it belong to a revoked or lost assignment. Set when the revoke begins, so nothing new is
    /// admitted while the partition drains.
    closed: HashMap<TopicPartition, Epoch>,
    dispatcher: Dispatcher,
    kafka: Option<Recipient<CommitOffsets>>,
    commit_interval: Duration,
    phase: Phase,
    /// Lists of done offsets of assignments whose first records have not come yet.
    inherited: HashMap<TopicPartition, (Epoch, Inherited)>,
    waiters: Vec<Waiter>,
    next_waiter: u64,
    /// Revokes gathering their partitions' unstarted jobs, by id.
    withdrawals: HashMap<u64, Withdrawal>,
    next_withdrawal: u64,
    /// Outcomes discarded because their epoch was over.
    stale_outcomes: u64,
    /// When positions were last sent for committing.
    last_commit: Instant,
    /// A commit brought forward by a partition that caught up is scheduled.
    catch_up_pending: bool,
    /// Commit ticks since the confirmed positions were last re-asserted.
    ticks_since_reassert: u32,
}

/// Every this many commit ticks the confirmed positions are committed again
/// ([`CommitReason::Reassert`]): one commit per interval of this many ticks, and a lower
/// position someone else committed for a partition we hold stands no longer than that.
const REASSERT_EVERY_TICKS: u32 = 10;

/// A partition that caught up (nothing left in its window) has its position committed at once
/// rather than at the next tick — the end of a backlog is committed in milliseconds, not up to
/// a commit interval later — but no sooner than this part of the interval after the last
/// commit, so that a trickle of records does not commit each one.
const CATCH_UP_SPACING_DIVISOR: u32 = 20;

impl OffsetCommitter {
    pub fn new(commit_interval: Duration, dispatcher: Dispatcher) -> Self {
        OffsetCommitter {
            windows: PartitionMap::default(),
            closed: HashMap::new(),
            dispatcher,
            kafka: None,
            commit_interval,
            phase: Phase::Admitting,
            inherited: HashMap::new(),
            waiters: Vec::new(),
            next_waiter: 0,
            withdrawals: HashMap::new(),
            next_withdrawal: 0,
            stale_outcomes: 0,
            last_commit: Instant::now(),
            catch_up_pending: false,
            ticks_since_reassert: 0,
        }
    }

    fn is_closed(&self, tp: &TopicPartition, epoch: Epoch) -> bool {
        self.closed.get(tp).is_some_and(|&closed| epoch <= closed)
    }

    /// Ends an assignment: nothing of it is admitted any more.
    fn mark_closed(&mut self, tp: &TopicPartition, epoch: Epoch) {
        let closed = self.closed.entry(tp.clone()).or_insert(epoch);
        *closed = (*closed).max(epoch);
        if self
            .inherited
            .get(tp)
            .is_some_and(|(inherited, _)| *inherited <= epoch)
        {
            self.inherited.remove(tp);
        }
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
        self.positions(PartitionWindow::unconfirmed)
    }

    /// What `position` picks of each window, in partition order.
    fn positions(
        &self,
        position: impl Fn(&PartitionWindow, &TopicPartition) -> Option<CommitPosition>,
    ) -> Vec<CommitPosition> {
        let mut positions: Vec<CommitPosition> = self
            .windows
            .iter()
            .filter_map(|(tp, window)| position(window, tp))
            .collect();
        positions.sort_by(|a, b| a.tp.cmp(&b.tp));
        positions
    }

    /// The periodic commit; every [`REASSERT_EVERY_TICKS`] ticks, a re-assertion.
    fn tick(&mut self) {
        self.ticks_since_reassert += 1;
        if self.ticks_since_reassert < REASSERT_EVERY_TICKS {
            self.commit(CommitReason::Periodic);
            return;
        }
        self.ticks_since_reassert = 0;
        let positions = self.positions(PartitionWindow::held);
        self.send(positions, CommitReason::Reassert);
    }

    fn commit(&mut self, reason: CommitReason) {
        let positions = self.unconfirmed_positions();
        self.send(positions, reason);
    }

    fn send(&mut self, positions: Vec<CommitPosition>, reason: CommitReason) {
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

    /// Unresolved records in `scope`.
    fn in_flight(&self, scope: &Scope) -> usize {
        self.windows_in(scope).map(|w| w.window.unresolved()).sum()
    }

    /// Unresolved records in `scope` that a revoke or a drain waits for (not those set aside).
    fn awaited(&self, scope: &Scope) -> usize {
        self.windows_in(scope).map(PartitionWindow::awaited).sum()
    }

    fn windows_in<'a>(
        &'a self,
        scope: &'a Scope,
    ) -> Box<dyn Iterator<Item = &'a PartitionWindow> + 'a> {
        match scope {
            Scope::All => Box::new(self.windows.values()),
            Scope::Partitions(tps) => Box::new(tps.iter().filter_map(|tp| self.windows.get(tp))),
        }
    }

    /// A future that completes once nothing in `scope` is awaited (in flight and not parked),
    /// or when `deadline` passed.
    fn wait_until_settled(
        &mut self,
        scope: Scope,
        deadline: Duration,
        ctx: &mut Context<Self>,
    ) -> oneshot::Receiver<()> {
        let (done, settled) = oneshot::channel();
        if self.awaited(&scope) == 0 || deadline.is_zero() {
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

    /// Releases the waiters whose partitions have nothing awaited any more.
    fn wake_waiters(&mut self) {
        if self.waiters.is_empty() {
            return;
        }
        let waiters = std::mem::take(&mut self.waiters);
        for waiter in waiters {
            if self.awaited(&waiter.scope) == 0 {
                let _ = waiter.done.send(());
            } else {
                self.waiters.push(waiter);
            }
        }
    }

    /// Tracks the jobs' offsets (each under the generation of the log it belongs to: one at or
    /// below an offset already tracked means the log moved back, see [`OffsetWindow`]); returns
    /// the jobs to write.
    fn admit(&mut self, msg: Admit) -> Result<(Vec<WriteJob>, WindowState), ()> {
        if self.phase == Phase::Draining || self.is_closed(&msg.tp, msg.epoch) {
            return Err(());
        }
        let newer = self
            .windows
            .get(&msg.tp)
            .is_none_or(|window| window.epoch < msg.epoch);
        if newer {
            // The first records of this assignment. (A window of an older one was never
            // revoked here — its revoke is still on its way: its work is void.)
            let inherited = match self.inherited.remove(&msg.tp) {
                Some((epoch, inherited)) if epoch == msg.epoch => Some(inherited),
                Some((epoch, inherited)) if epoch > msg.epoch => {
                    self.inherited.insert(msg.tp.clone(), (epoch, inherited));
                    None
                }
                _ => None,
            };
            self.windows.insert(
                msg.tp.clone(),
                PartitionWindow::new(&msg.tp, msg.epoch, msg.partition.clone(), inherited),
            );
        }
        let window = self.windows.get_mut(&msg.tp).expect("inserted above");
        if window.epoch > msg.epoch {
            return Err(());
        }
        let mut jobs = msg.jobs;
        let mut skipped = 0u64;
        jobs.retain_mut(|job| {
            let tracked = window.window.track(job.offset);
            job.generation = tracked.generation();
            if let TrackResult::Rewound(rewind) = tracked {
                window.rewound(&msg.tp, rewind);
            }
            if !window.inherited_done(&msg.tp, job.offset) {
                return true;
            }
            // Written by the previous owner: resolved here without writing it again.
            let resolved = window.window.resolve(job.offset, job.generation);
            debug_assert!(resolved.is_ok(), "an offset just tracked resolves");
            skipped += 1;
            false
        });
        if skipped > 0 {
            metrics::records_skipped_as_done(&msg.tp, skipped);
        }
        if let Some(offset) = msg.passed_over {
            if window.window.pass_over(offset) {
                debug!(tp = %msg.tp, offset, "the client passed over offsets without records (transaction markers)");
            }
        }
        window.version += 1;
        window.in_flight.set(window.window.len() as f64);
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
                    set_aside = window.set_aside.len(),
                    resolved_behind = window.resolved_behind(),
                    waiting_for = ?window.window.first_unresolved(),
                    "partition revoked with records still in flight at the deadline; the next \
                     owner re-reads them"
                );
            }
        }
        positions
    }

    /// Asks every writer for `partitions`' jobs it has not started ([`Withdrawn`] brings them).
    fn withdraw(&mut self, partitions: &[(TopicPartition, Epoch)], leave_all: bool) {
        if partitions.is_empty() {
            return;
        }
        let id = self.next_withdrawal;
        self.next_withdrawal += 1;
        let awaiting = self.dispatcher.withdraw(id, partitions);
        self.withdrawals.insert(
            id,
            Withdrawal {
                awaiting,
                jobs: Vec::new(),
                leave_all,
            },
        );
    }

    /// A drain past its deadline: the jobs no writer started are left to the next owner, and
    /// only the transactions under way are waited for (a little), so that nothing is written
    /// after the final commit's positions are taken.
    fn leave_unstarted(&mut self) {
        let all: Vec<(TopicPartition, Epoch)> = self
            .windows
            .iter()
            .map(|(tp, window)| (tp.clone(), window.epoch))
            .collect();
        self.withdraw(&all, true);
    }

    /// Every writer handed back the revoked partitions' unstarted jobs: those below the cut are
    /// written after all (something after them was written, or is being written), the others
    /// are dropped and left to the next owner.
    fn settle_withdrawn(&mut self, jobs: Vec<WriteJob>) {
        let mut by_partition: HashMap<TopicPartition, Vec<WriteJob>> = HashMap::new();
        for job in jobs {
            by_partition.entry(job.tp.clone()).or_default().push(job);
        }
        let mut again = Vec::new();
        for (tp, jobs) in by_partition {
            let Some(window) = self.windows.get_mut(&tp) else {
                continue;
            };
            // Jobs of an ended assignment, or of records the log's move back made obsolete,
            // are dropped.
            let (current, _old): (Vec<WriteJob>, Vec<WriteJob>) =
                jobs.into_iter().partition(|job| {
                    job.epoch == window.epoch
                        && window.window.is_unresolved(job.offset, job.generation)
                });
            let withdrawn: BTreeSet<i64> = current.iter().map(|job| job.offset).collect();
            let Some(cut) = window.window.withdrawal_cut(&withdrawn, &window.set_aside) else {
                continue;
            };
            let (write, leave): (Vec<WriteJob>, Vec<WriteJob>) =
                current.into_iter().partition(|job| job.offset < cut);
            debug!(%tp, cut, written = write.len(), left = leave.len(), "revoke: unstarted jobs settled");
            window.set_aside(
                window.epoch,
                leave.iter().map(|job| (job.generation, job.offset)),
            );
            again.extend(write);
        }
        if !again.is_empty() {
            self.dispatcher.dispatch(again);
        }
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
        ctx.run_interval(self.commit_interval, |committer, _| committer.tick());
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
            match window.window.resolve(resolved.offset, resolved.generation) {
                Ok(released) => {
                    window.set_aside.remove(&resolved.offset);
                    if released > 0 && !moved.contains(&resolved.tp) {
                        moved.push(resolved.tp);
                    }
                }
                // The outcome of a record the log's move back made obsolete.
                Err(UntrackedOffset::Forgotten(offset)) => {
                    self.stale_outcomes += 1;
                    debug!(tp = %resolved.tp, offset, "outcome of a forgotten record ignored");
                }
                Err(untracked) => debug!(tp = %resolved.tp, %untracked, "resolution ignored"),
            }
        }
        let mut caught_up = false;
        for tp in moved {
            let window = self.windows.get_mut(&tp).expect("moved windows exist");
            window.version += 1;
            caught_up |= window.window.is_empty();
            window.in_flight.set(window.window.len() as f64);
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

impl Handler<Inherit> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, Inherit(lists): Inherit, _: &mut Context<Self>) {
        for list in lists {
            if self.is_closed(&list.tp, list.epoch) {
                continue;
            }
            let inherited = Inherited {
                position: list.position,
                done: list.done,
            };
            self.inherited.insert(list.tp, (list.epoch, inherited));
        }
    }
}

impl Handler<Parked> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, Parked(parked): Parked, _: &mut Context<Self>) {
        if let Some(window) = self.windows.get_mut(&parked.tp) {
            window.set_aside(parked.epoch, [(parked.generation, parked.offset)]);
            self.wake_waiters();
        }
    }
}

impl Handler<RetryBegins> for OffsetCommitter {
    type Result = bool;

    fn handle(&mut self, RetryBegins(retry): RetryBegins, _: &mut Context<Self>) -> bool {
        if self.is_closed(&retry.tp, retry.epoch) {
            return false;
        }
        match self.windows.get_mut(&retry.tp) {
            Some(window)
                if window.epoch == retry.epoch
                    && window.window.is_unresolved(retry.offset, retry.generation) =>
            {
                window.set_aside.remove(&retry.offset);
                true
            }
            _ => false,
        }
    }
}

impl Handler<Withdrawn> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, msg: Withdrawn, _: &mut Context<Self>) {
        // A lost assignment's jobs (nobody waits for them) are dropped here.
        let Some(withdrawal) = self.withdrawals.get_mut(&msg.id) else {
            return;
        };
        withdrawal.jobs.extend(msg.jobs);
        withdrawal.awaiting -= 1;
        if withdrawal.awaiting > 0 {
            return;
        }
        let withdrawal = self.withdrawals.remove(&msg.id).expect("present");
        if withdrawal.leave_all {
            for job in withdrawal.jobs {
                if let Some(window) = self.windows.get_mut(&job.tp) {
                    window.set_aside(job.epoch, [(job.generation, job.offset)]);
                }
            }
        } else {
            self.settle_withdrawn(withdrawal.jobs);
        }
        self.wake_waiters();
    }
}

impl Handler<CommitResult> for OffsetCommitter {
    type Result = ();

    fn handle(&mut self, msg: CommitResult, _: &mut Context<Self>) {
        for position in msg.0.confirmed {
            if let Some(window) = self.windows.get_mut(&position.tp) {
                if window.epoch == position.epoch
                    && window.window.generation() == position.generation
                {
                    let listed = position.done.count_above(position.offset);
                    match window.confirmed {
                        Some(confirmed) if confirmed > position.offset => {}
                        Some(confirmed) if confirmed == position.offset => {
                            window.confirmed_listed = window.confirmed_listed.max(listed);
                        }
                        _ => {
                            window.confirmed = Some(position.offset);
                            window.confirmed_listed = listed;
                        }
                    }
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
        // What no writer has started is its next owner's to do; only what is under way is
        // waited for.
        let revoked: Vec<(TopicPartition, Epoch)> = msg
            .partitions
            .iter()
            .filter(|(tp, _)| current.contains(tp))
            .cloned()
            .collect();
        self.withdraw(&revoked, false);
        // Once shutdown drained, whatever is left stays unresolved: do not wait for it twice.
        let deadline = if self.phase == Phase::Draining {
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
        let awaited = self.awaited(&Scope::Partitions(current.clone()));
        if awaited > 0 {
            debug!(awaited, partitions = ?current, "revoke: letting in-flight records resolve");
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
        // Nothing of a lost assignment can be committed any more: the writers drop what they
        // have not started of it (answers to an id nobody waits for are dropped), and the next
        // owner does it once.
        if !msg.partitions.is_empty() {
            let id = self.next_withdrawal;
            self.next_withdrawal += 1;
            self.dispatcher.withdraw(id, &msg.partitions);
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
        self.phase = Phase::Draining;
        info!(
            in_flight = self.in_flight(&Scope::All),
            "draining in-flight records"
        );
        let settled = self.wait_until_settled(Scope::All, msg.deadline, ctx);
        Box::pin(
            actix::fut::wrap_future::<_, Self>(settled)
                .then(|_, committer: &mut Self, ctx| {
                    if committer.awaited(&Scope::All) > 0 {
                        committer.leave_unstarted();
                    }
                    let under_way =
                        committer.wait_until_settled(Scope::All, DRAIN_UNDER_WAY_GRACE, ctx);
                    actix::fut::wrap_future::<_, Self>(under_way)
                })
                .map(|_, committer, _| {
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
