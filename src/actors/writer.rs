//! A DbWriter gathers jobs into batches (up to `batch_max_events`, waiting at most
//! `batch_linger_ms`) and runs one transaction per batch. Every record's outcome is reported:
//! resolved offsets to the OffsetCommitter; an Unknown batch is retried with exponential
//! backoff, and its offsets stay unresolved (so uncommitted) until the database answers.
//!
//! A batch the server rejects because of its data is bisected (`actors/batch.rs`): what the
//! server accepts is written, and each event it rejects by itself is parked
//! (`actors/parked.rs`) — retried alone, with backoff, while the writer serves other jobs — so
//! one bad event holds back only its own partition, at its offset, and is named in the log and
//! in `history_stuck_event`.
//!
//! A batch that does not finish within its deadline is written again halved, the rest put back
//! at the front of the queue, and later batches stay smaller until the database is quick again
//! (`domain::batch_size`): a database too slow for a full batch per deadline gets smaller ones,
//! rather than the same batch timing out for ever. Full batches slower than
//! `pipeline.batch_aim_ms` are made smaller too, while that costs no more per row.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tracing::{debug, error, info, warn};

use super::batch::{Batch, BatchResult, Job, Rejection, execute, partitions_of};
use super::committer::OffsetCommitter;
use super::messages::{
    DecodedEvent, Parked, Resolved, ResolvedOffset, TopicPartition, Withdraw, Withdrawn, WriteJob,
    WriteJobs,
};
use super::parked::{ParkedEvent, Retrying, Settled};
use crate::domain::backoff::Backoff;
use crate::domain::batch_size::BatchSize;
use crate::domain::fair_queue::FairQueue;
use crate::domain::linger::{Decision, Linger};
use crate::kafka::dead_letter_topic::DeadLetterPublisher;
use crate::metrics::{OutcomeClass, Stats};
use crate::store::{PgHistoryRepository, StoreError};

/// The writer's tuning, from `[pipeline]`.
#[derive(Debug, Clone)]
pub(crate) struct WriterSettings {
    pub batch_max_events: usize,
    pub batch_linger: Duration,
    /// How long a full batch is aimed to last (`pipeline.batch_aim_ms`), if at all.
    pub batch_aim: Option<Duration>,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    /// How this replica names itself in `stuck_events` ([`crate::replica::name`]).
    pub replica: Arc<str>,
}

enum State {
    Idle,
    /// Waiting for the batch to fill; the timer writes whatever is there when it fires.
    Lingering(SpawnHandle),
    Writing,
    /// A batch failed; it is retried when the timer fires.
    BackingOff,
}

pub(crate) struct DbWriter {
    id: usize,
    repository: PgHistoryRepository,
    publisher: Option<Arc<DeadLetterPublisher>>,
    committer: Addr<OffsetCommitter>,
    settings: WriterSettings,
    stats: Arc<Stats>,
    /// Jobs waiting for the next batch, each partition's oldest first; batches take them from
    /// the partitions in turn, so that a slow database writes every backlogged partition side
    /// by side rather than one fetched run after another.
    buffer: FairQueue<TopicPartition, WriteJob>,
    state: State,
    /// When the buffered jobs are written.
    linger: Linger<tokio::time::Instant>,
    /// The delays between the attempts of a failing batch; reset by a success.
    backoff: Backoff,
    attempt: u32,
    /// How many jobs the next batch may hold: fewer than `batch_max_events` after a timeout.
    batch_size: BatchSize,
}

impl DbWriter {
    pub(crate) fn new(
        id: usize,
        repository: PgHistoryRepository,
        publisher: Option<Arc<DeadLetterPublisher>>,
        committer: Addr<OffsetCommitter>,
        settings: WriterSettings,
        stats: Arc<Stats>,
    ) -> Self {
        let linger = Linger::new(settings.batch_max_events, settings.batch_linger);
        let backoff = Backoff::new(settings.retry_initial, settings.retry_max);
        let batch_size = BatchSize::new(
            settings.batch_max_events,
            repository.pool().deadline(),
            settings.batch_aim,
        );
        crate::metrics::set_batch_max_events(id, batch_size.current());
        DbWriter {
            id,
            repository,
            publisher,
            committer,
            settings,
            stats,
            buffer: FairQueue::new(),
            state: State::Idle,
            linger,
            backoff,
            attempt: 0,
            batch_size,
        }
    }

    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if let State::Writing | State::BackingOff = self.state {
            return;
        }
        let now = tokio::time::Instant::now();
        match (self.linger.decide(self.buffer.len(), now), &self.state) {
            (Decision::WriteNow, State::Lingering(timer)) => {
                ctx.cancel_future(*timer);
                self.write_next(ctx);
            }
            (Decision::WriteNow, _) => self.write_next(ctx),
            (Decision::WaitUntil(deadline), State::Idle) => {
                let timer = ctx.run_later(deadline - now, |writer, ctx| {
                    writer.state = State::Idle;
                    writer.write_next(ctx);
                });
                self.state = State::Lingering(timer);
            }
            // Already lingering towards that deadline, or nothing to write.
            (Decision::WaitUntil(_), _) | (Decision::Idle, _) => {}
        }
    }

    fn write_next(&mut self, ctx: &mut Context<Self>) {
        if self.buffer.is_empty() {
            self.state = State::Idle;
            return;
        }
        let batch = Batch::of(self.buffer.take(self.batch_size.current()));
        self.linger.taken();
        self.write(batch, ctx);
    }

    fn write(&mut self, batch: Batch, ctx: &mut Context<Self>) {
        self.state = State::Writing;
        let work = execute(
            self.repository.clone(),
            self.publisher.clone(),
            self.stats.clone(),
            batch,
        );
        ctx.spawn(
            work.into_actor(self)
                .map(|result, writer, ctx| writer.finish(result, ctx)),
        );
    }

    fn finish(&mut self, result: BatchResult, ctx: &mut Context<Self>) {
        // A batch the database rejected event by event wrote nothing either: when nothing of a
        // batch resolved, its failure counts, be it the whole batch's or its events' one by one.
        let failure: Option<String> = match (&result.failed, result.rejected.first()) {
            (Some((_, error)), _) => Some(error.to_string()),
            (None, Some((_, rejection))) => Some(rejection.to_string()),
            (None, None) => None,
        };
        self.stats
            .writes
            .batch(!result.resolved.is_empty(), failure.as_ref());
        self.stats.transaction(result.elapsed, result.attempted);
        for reason in result.dead_letter_reasons {
            self.stats.dead_letter_reason(reason);
        }
        self.report(result.resolved);
        for (job, rejection) in result.rejected {
            self.park(job, rejection, ctx);
        }
        match result.failed {
            None => {
                if let Some(resized) = self.batch_size.written(result.attempted, result.elapsed) {
                    debug!(writer = self.id, ?resized, "batch size changed");
                    crate::metrics::set_batch_max_events(self.id, self.batch_size.current());
                }
                if self.attempt > 0 {
                    info!(
                        writer = self.id,
                        attempts = self.attempt,
                        "database answers again"
                    );
                }
                self.attempt = 0;
                self.backoff.reset();
                self.state = State::Idle;
                self.schedule(ctx);
            }
            Some((mut batch, error)) => {
                self.stats
                    .outcomes(OutcomeClass::Unknown, batch.len() as u64);
                self.stats.retry();
                self.attempt += 1;
                let delay = retry_delay(&mut self.backoff, &error);
                if let StoreError::TimedOut(deadline) = &error {
                    self.stats.db_timeout();
                    error!(
                        writer = self.id,
                        partitions = %partitions_of(&batch),
                        records = batch.len(),
                        age_ms = result.elapsed.as_millis() as u64,
                        deadline_ms = deadline.as_millis() as u64,
                        attempt = self.attempt,
                        "write did not return within its deadline: abandoned, its connection \
                         closed and every older one replaced; retrying on a fresh connection"
                    );
                }
                if error.is_deadline() {
                    let attempted = batch.len();
                    let keep = self.batch_size.timed_out(attempted);
                    crate::metrics::set_batch_max_events(self.id, self.batch_size.current());
                    let rest = batch.split_off(keep);
                    for job in rest.into_jobs().collect::<Vec<_>>().into_iter().rev() {
                        self.buffer.push_front(job.tp.clone(), job);
                    }
                    if batch.len() < attempted {
                        warn!(
                            writer = self.id,
                            records = attempted,
                            retried = batch.len(),
                            batch_max = self.batch_size.current(),
                            "a batch did not finish within its deadline: written again halved, \
                             the rest queued, and later batches this small until the database \
                             writes them quickly again"
                        );
                    }
                }
                warn!(
                    writer = self.id,
                    records = batch.len(),
                    attempt = self.attempt,
                    retry_in_ms = delay.as_millis() as u64,
                    %error,
                    "write failed, outcome unknown: retrying"
                );
                self.state = State::BackingOff;
                ctx.run_later(delay, move |writer, ctx| writer.write(batch, ctx));
            }
        }
    }

    /// Counts resolved offsets and hands them to the committer.
    fn report(&self, resolved: Vec<(ResolvedOffset, OutcomeClass)>) {
        if resolved.is_empty() {
            return;
        }
        let mut counts = [0u64; 4];
        let offsets = resolved
            .into_iter()
            .map(|(offset, class)| {
                counts[class as usize] += 1;
                offset
            })
            .collect();
        for class in [
            OutcomeClass::Applied,
            OutcomeClass::AlreadyApplied,
            OutcomeClass::Unknown,
            OutcomeClass::DeadLetter,
        ] {
            self.stats.outcomes(class, counts[class as usize]);
        }
        self.committer.do_send(Resolved(offsets));
    }

    /// Sets an event the database rejects aside ([`ParkedEvent`]): it is retried alone, with
    /// backoff, while the writer goes on with other jobs.
    fn park(&mut self, job: Job<Box<DecodedEvent>>, rejection: Rejection, ctx: &mut Context<Self>) {
        let backoff = Backoff::new(self.settings.retry_initial, self.settings.retry_max);
        let parked = ParkedEvent::park(job, rejection, backoff, self.id, &self.stats);
        // A revoke or a stop does not wait for it.
        self.committer.do_send(Parked(parked.position()));
        self.retry_parked_later(parked, ctx);
    }

    fn retry_parked_later(&mut self, mut parked: ParkedEvent, ctx: &mut Context<Self>) {
        let delay = parked.next_delay();
        ctx.run_later(delay, move |writer, ctx| writer.retry_parked(parked, ctx));
    }

    fn retry_parked(&mut self, mut parked: ParkedEvent, ctx: &mut Context<Self>) {
        let attempt = parked.attempt(Retrying {
            repository: self.repository.clone(),
            publisher: self.publisher.clone(),
            committer: self.committer.clone(),
            stats: self.stats.clone(),
            replica: self.settings.replica.clone(),
        });
        ctx.spawn(attempt.into_actor(self).map(move |result, writer, ctx| {
            match parked.settle(result, &writer.stats, &writer.settings.replica) {
                Settled::Done(Some(resolved)) => writer.report(vec![resolved]),
                Settled::Done(None) => {}
                Settled::Again => {
                    // Between retries nothing waits for it again.
                    writer.committer.do_send(Parked(parked.position()));
                    writer.retry_parked_later(parked, ctx)
                }
            }
        }));
    }
}

/// The longest a batch waits before it is retried after a session fault (a deadline expired, a
/// read-only or shutting-down server): the backoff, but no more than this. Such a failure is
/// answered at once by the server, or after the whole deadline; either way a retry a second later
/// costs the database one short transaction, and it finds a server that came back within a
/// second of its return rather than after up to `pipeline.retry_max_ms`.
const FRESH_SESSION_RETRY_MAX: Duration = Duration::from_secs(1);

/// How long a failed batch waits before its next attempt: the backoff's next delay, capped at
/// [`FRESH_SESSION_RETRY_MAX`] after a session fault — the pool has replaced its sessions, and
/// the next attempt runs on a fresh one, which may work at once (the fail-over done, the server
/// writable again).
fn retry_delay(backoff: &mut Backoff, error: &StoreError) -> Duration {
    let delay = backoff.next_delay();
    if error.is_session_fault() {
        delay.min(FRESH_SESSION_RETRY_MAX)
    } else {
        delay
    }
}

impl Actor for DbWriter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1024);
    }
}

impl Handler<WriteJobs> for DbWriter {
    type Result = ();

    fn handle(&mut self, msg: WriteJobs, ctx: &mut Context<Self>) {
        for job in msg.0 {
            self.buffer.push_back(job.tp.clone(), job);
        }
        self.schedule(ctx);
    }
}

impl Handler<Withdraw> for DbWriter {
    type Result = ();

    /// Hands the buffered jobs of the revoked assignments back to the committer. A batch being
    /// written, or waiting for its retry, is not touched: its outcome is the database's to tell.
    fn handle(&mut self, msg: Withdraw, _: &mut Context<Self>) {
        let jobs = self.buffer.extract(|tp, job| {
            msg.partitions
                .iter()
                .any(|(revoked, epoch)| revoked == tp && *epoch == job.epoch)
        });
        if !jobs.is_empty() {
            debug!(
                writer = self.id,
                withdrawn = jobs.len(),
                "revoked partitions' unstarted jobs handed back"
            );
        }
        self.committer.do_send(Withdrawn { id: msg.id, jobs });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_session_fault_the_retry_waits_a_second_at_most_otherwise_the_backoff() {
        // Ceilings 100 ms, 200 ms, … 10 s: drawn under them, the sixth and later may reach past
        // a second, and over 40 draws some do.
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let outage = StoreError::Unavailable("connection refused".into());
        let delays: Vec<Duration> = (0..40)
            .map(|_| retry_delay(&mut backoff, &outage))
            .collect();
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(10)),
            "{delays:?}"
        );
        assert!(
            delays.iter().any(|d| *d > FRESH_SESSION_RETRY_MAX),
            "{delays:?}"
        );

        let timed_out = StoreError::TimedOut(Duration::from_secs(10));
        for _ in 0..20 {
            assert!(retry_delay(&mut backoff, &timed_out) <= FRESH_SESSION_RETRY_MAX);
        }
        backoff.reset();
        assert!(
            retry_delay(&mut backoff, &timed_out) <= Duration::from_millis(100),
            "a shorter backoff is kept"
        );
    }
}
