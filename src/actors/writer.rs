//! A DbWriter gathers jobs into batches (up to `batch_max_events`, waiting at most
//! `batch_linger_ms`) and runs one transaction per batch. Every record's outcome is reported:
//! resolved offsets to the OffsetCommitter; an Unknown batch is retried with exponential
//! backoff, and its offsets stay unresolved (so uncommitted) until the database answers.
//!
//! A batch the server rejects because of its data is bisected (`domain::bisect`): what the
//! server accepts is written, and each event it rejects by itself is parked — retried alone,
//! with backoff, while the writer serves other jobs — so one bad event holds back only its own
//! partition, at its offset, and is named in the log and in `history_stuck_event`.
//!
//! A batch that does not finish within its deadline is written again halved, the rest put back
//! at the front of the queue, and later batches stay smaller until the database is quick again
//! (`domain::batch_size`): a database too slow for a full batch per deadline gets smaller ones,
//! rather than the same batch timing out for ever.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::{debug, error, info, warn};

use super::committer::OffsetCommitter;
use super::messages::{
    DecodedEvent, Epoch, Generation, Held, InspectWindows, Parked, Resolved, ResolvedOffset,
    TopicPartition, Withdraw, Withdrawn, Work, WriteJob, WriteJobs,
};
use crate::domain::backoff::Backoff;
use crate::domain::batch_size::BatchSize;
use crate::domain::fair_queue::FairQueue;
use crate::domain::linger::{Decision, Linger};
use crate::domain::values::SET_ASIDE;
use crate::domain::{HistoryEvent, Resolution, bisect, process_history_batch};
use crate::kafka::dead_letter_topic::DeadLetterPublisher;
use crate::metrics::{self, OutcomeClass, Stats};
use crate::store::dead_letters::{self, DeadLetter, DeadLetterRow};
use crate::store::repository::load_events;
use crate::store::stuck;
use crate::store::{PgHistoryRepository, StoreError};

/// The writer's tuning, from `[pipeline]`.
#[derive(Debug, Clone)]
pub struct WriterSettings {
    pub batch_max_events: usize,
    pub batch_linger: Duration,
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

pub struct DbWriter {
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

/// One record's work, typed by kind: the batch code never has to ask which kind a job is.
#[derive(Debug, Clone)]
struct Job<T> {
    tp: TopicPartition,
    epoch: Epoch,
    generation: Generation,
    offset: i64,
    item: T,
    /// The record's share of the budget, given back when the job is dropped (resolved). Only
    /// its drop matters, so nothing reads it.
    #[allow(dead_code)]
    held: Held,
}

impl<T> Job<T> {
    fn position(&self) -> ResolvedOffset {
        ResolvedOffset {
            tp: self.tp.clone(),
            epoch: self.epoch,
            generation: self.generation,
            offset: self.offset,
        }
    }
}

/// A batch of jobs, split by kind.
#[derive(Default)]
struct Batch {
    events: Vec<Job<Box<DecodedEvent>>>,
    letters: Vec<Job<DeadLetter>>,
}

impl Batch {
    fn of(jobs: impl IntoIterator<Item = WriteJob>) -> Self {
        let mut batch = Batch::default();
        for WriteJob {
            tp,
            epoch,
            generation,
            offset,
            work,
            held,
        } in jobs
        {
            match work {
                Work::Event(item) => batch.events.push(Job {
                    tp,
                    epoch,
                    generation,
                    offset,
                    item,
                    held,
                }),
                Work::DeadLetter(item) => batch.letters.push(Job {
                    tp,
                    epoch,
                    generation,
                    offset,
                    item,
                    held,
                }),
            }
        }
        batch
    }

    fn len(&self) -> usize {
        self.events.len() + self.letters.len()
    }

    /// Splits off everything after the first `keep` jobs (events first, then letters).
    fn split_off(&mut self, keep: usize) -> Batch {
        let events = self.events.split_off(keep.min(self.events.len()));
        let letters_kept = keep.saturating_sub(self.events.len());
        let letters = self.letters.split_off(letters_kept.min(self.letters.len()));
        Batch { events, letters }
    }

    /// The jobs again, as they came to the writer.
    fn into_jobs(self) -> impl Iterator<Item = WriteJob> {
        let job = |tp, epoch, generation, offset, work, held| WriteJob {
            tp,
            epoch,
            generation,
            offset,
            work,
            held,
        };
        let events = self.events.into_iter().map(move |j| {
            job(
                j.tp,
                j.epoch,
                j.generation,
                j.offset,
                Work::Event(j.item),
                j.held,
            )
        });
        let letters = self.letters.into_iter().map(move |j| {
            job(
                j.tp,
                j.epoch,
                j.generation,
                j.offset,
                Work::DeadLetter(j.item),
                j.held,
            )
        });
        events.chain(letters)
    }
}

/// The server's reason for rejecting an event by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rejection {
    sqlstate: String,
    message: String,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the database rejects the event: {}: {}",
            self.sqlstate, self.message
        )
    }
}

/// An event the database rejects by itself, retried alone (its outcome stays Unknown).
struct ParkedEvent {
    job: Job<Box<DecodedEvent>>,
    rejection: Rejection,
    /// The delays between its attempts.
    backoff: Backoff,
    attempts: u32,
}

/// What one batch came to.
struct BatchResult {
    /// Offsets resolved, with their outcome class.
    resolved: Vec<(ResolvedOffset, OutcomeClass)>,
    /// Reason codes of the dead letters stored.
    dead_letter_reasons: Vec<&'static str>,
    /// Events the database rejected by themselves (isolated by bisecting the batch).
    rejected: Vec<(Job<Box<DecodedEvent>>, Rejection)>,
    /// Jobs whose outcome is Unknown for a reason not about them (an outage), with the error.
    failed: Option<(Batch, StoreError)>,
    /// Jobs attempted.
    attempted: usize,
    elapsed: Duration,
}

impl DbWriter {
    pub fn new(
        id: usize,
        repository: PgHistoryRepository,
        publisher: Option<Arc<DeadLetterPublisher>>,
        committer: Addr<OffsetCommitter>,
        settings: WriterSettings,
        stats: Arc<Stats>,
    ) -> Self {
        let linger = Linger::new(settings.batch_max_events, settings.batch_linger);
        let backoff = Backoff::new(settings.retry_initial, settings.retry_max);
        let batch_size = BatchSize::new(settings.batch_max_events, repository.pool().deadline());
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
                self.batch_size.written(result.attempted, result.elapsed);
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

    /// Sets an event the database rejects aside: it is retried alone, with backoff, while the
    /// writer goes on with other jobs. Its outcome stays Unknown, so its partition's position
    /// waits at its offset (and the partition's window fills and pauses it, alone).
    fn park(&mut self, job: Job<Box<DecodedEvent>>, rejection: Rejection, ctx: &mut Context<Self>) {
        self.stats.outcomes(OutcomeClass::Unknown, 1);
        self.stats.retry();
        metrics::set_stuck_event(
            &job.tp,
            job.offset,
            &job.item.event_id,
            &rejection.sqlstate,
            true,
        );
        error!(
            writer = self.id,
            partition = %job.tp,
            offset = job.offset,
            event_id = %job.item.event_id,
            sqlstate = %rejection.sqlstate,
            error = %rejection.message,
            "the database rejects this event: its partition's position waits at this offset \
             (other partitions go on); retrying it alone until the database accepts it"
        );
        // A revoke or a stop does not wait for it.
        self.committer.do_send(Parked(job.position()));
        let parked = ParkedEvent {
            job,
            rejection,
            backoff: Backoff::new(self.settings.retry_initial, self.settings.retry_max),
            attempts: 1,
        };
        self.retry_parked_later(parked, ctx);
    }

    fn retry_parked_later(&mut self, mut parked: ParkedEvent, ctx: &mut Context<Self>) {
        let delay = parked.backoff.next_delay();
        ctx.run_later(delay, move |writer, ctx| writer.retry_parked(parked, ctx));
    }

    fn retry_parked(&mut self, mut parked: ParkedEvent, ctx: &mut Context<Self>) {
        let repository = self.repository.clone();
        let stats = self.stats.clone();
        let publisher = self.publisher.clone();
        let committer = self.committer.clone();
        let replica = self.settings.replica.clone();
        let job = parked.job.clone();
        let rejected = parked.rejection.clone();
        let attempt = async move {
            // A partition revoked meanwhile is re-read by its next owner: stop retrying here.
            let assigned = committer
                .send(InspectWindows)
                .await
                .map(|windows| {
                    windows
                        .iter()
                        .any(|window| window.tp == job.tp && window.epoch == job.epoch)
                })
                .unwrap_or(true);
            if !assigned {
                return Retry::Revoked;
            }
            let pool = repository.pool();
            // Reported where an operator's `dead-letters set-aside` finds it, and answered if
            // asked. The table failing costs only this: the retry goes on.
            let report = stuck::StuckReport {
                tp: &job.tp,
                offset: job.offset,
                event_id: &job.item.event_id,
                sqlstate: &rejected.sqlstate,
                error: &rejected.message,
                replica: &replica,
            };
            match stuck::check_in(pool, &report).await {
                Ok(Some(request)) => {
                    let letter = Job {
                        tp: job.tp.clone(),
                        epoch: job.epoch,
                        generation: job.generation,
                        offset: job.offset,
                        item: DeadLetter::set_aside(
                            &job.item.event_id,
                            job.item.record.clone(),
                            &request.by,
                            request.at,
                            request.reason.as_deref(),
                            &rejected.to_string(),
                        ),
                        held: Held::nothing(),
                    };
                    let stored = pool
                        .within_deadline(write_dead_letters(
                            &repository,
                            publisher.as_deref(),
                            &stats,
                            std::slice::from_ref(&letter),
                        ))
                        .await;
                    return Retry::SetAside(match stored {
                        Ok(()) => stuck::resolved(pool, &job.tp, job.offset, &replica)
                            .await
                            .map(|()| request),
                        Err(err) => Err(err),
                    });
                }
                Ok(None) => {}
                Err(err) => debug!(error = %err, "could not record the stuck event"),
            }
            let written = write_events(
                &repository,
                publisher.as_deref(),
                &stats,
                std::slice::from_ref(&job),
            )
            .await;
            if written.is_ok() {
                if let Err(err) = stuck::written(pool, &job.tp, job.offset).await {
                    debug!(error = %err, "could not forget the stuck event");
                }
            }
            Retry::Written(written)
        };
        ctx.spawn(attempt.into_actor(self).map(move |result, writer, ctx| {
            let job = &parked.job;
            let unstick = |rejection: &Rejection| {
                metrics::set_stuck_event(
                    &job.tp,
                    job.offset,
                    &job.item.event_id,
                    &rejection.sqlstate,
                    false,
                )
            };
            match result {
                Retry::Revoked => {
                    unstick(&parked.rejection);
                    writer
                        .stats
                        .stuck_handed_over
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    info!(
                        partition = %job.tp,
                        offset = job.offset,
                        event_id = %job.item.event_id,
                        "stuck event no longer retried here: its partition was revoked"
                    );
                }
                Retry::SetAside(Ok(request)) => {
                    unstick(&parked.rejection);
                    writer.stats.dead_letter_reason(SET_ASIDE);
                    warn!(
                        partition = %job.tp,
                        offset = job.offset,
                        event_id = %job.item.event_id,
                        by = %request.by,
                        reason = request.reason.as_deref().unwrap_or(""),
                        replica = %writer.settings.replica,
                        "stuck event set aside on request: stored as a dead letter (reason \
                         set_aside); its partition moves on"
                    );
                    writer.report(vec![(job.position(), OutcomeClass::DeadLetter)]);
                }
                Retry::Written(Ok(classes)) => {
                    unstick(&parked.rejection);
                    // The database takes writes again.
                    writer.stats.writes.succeeded();
                    info!(
                        partition = %job.tp,
                        offset = job.offset,
                        event_id = %job.item.event_id,
                        attempts = parked.attempts + 1,
                        "stuck event written: its partition moves on"
                    );
                    if let Some(&class) = classes.first() {
                        writer.report(vec![(job.position(), class)]);
                    }
                }
                Retry::SetAside(Err(error)) | Retry::Written(Err(error)) => {
                    writer.stats.outcomes(OutcomeClass::Unknown, 1);
                    writer.stats.retry();
                    // During an outage the server gives no reason; the last one stands.
                    if let Some(rejection) = rejection(&error) {
                        if rejection.sqlstate != parked.rejection.sqlstate {
                            unstick(&parked.rejection);
                            metrics::set_stuck_event(
                                &job.tp,
                                job.offset,
                                &job.item.event_id,
                                &rejection.sqlstate,
                                true,
                            );
                            warn!(
                                partition = %job.tp,
                                offset = job.offset,
                                event_id = %job.item.event_id,
                                sqlstate = %rejection.sqlstate,
                                error = %rejection.message,
                                "the database rejects the stuck event for another reason now"
                            );
                        }
                        parked.rejection = rejection;
                    }
                    debug!(
                        partition = %job.tp,
                        offset = job.offset,
                        event_id = %job.item.event_id,
                        attempts = parked.attempts + 1,
                        %error,
                        "stuck event still rejected"
                    );
                    parked.attempts += 1;
                    writer.retry_parked_later(parked, ctx);
                }
            }
        }));
    }
}

/// What one retry of a stuck event came to.
enum Retry {
    /// Its partition is no longer assigned here.
    Revoked,
    /// An operator asked to set it aside: stored as a dead letter (or why not).
    SetAside(Result<stuck::SetAsideRequest, StoreError>),
    /// Written again: its outcome (or why not).
    Written(Result<Vec<OutcomeClass>, StoreError>),
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

/// The partitions of a batch's jobs, for logs: `topic[0],topic[3]`.
fn partitions_of(batch: &Batch) -> String {
    let partitions: std::collections::BTreeSet<String> = batch
        .events
        .iter()
        .map(|job| job.tp.to_string())
        .chain(batch.letters.iter().map(|job| job.tp.to_string()))
        .collect();
    partitions.into_iter().collect::<Vec<_>>().join(",")
}

/// The server's reason, when a write failed because of the data it was given — a constraint
/// (SQLSTATE class 23), a value the column cannot hold (22), a row over a limit such as an
/// index entry too large (54), a trigger's exception (P0), a check option (44), a cardinality
/// violation (21). Such an error follows the event that causes it, so the batch is bisected to
/// isolate it. Anything else — no connection, a time-out, a terminated session (57), resources
/// (53), a deadlock (40), a permission or a missing table (42) — is about the database, not
/// the event: bisecting would only multiply the failing attempts, so the batch is retried whole.
fn rejection(error: &StoreError) -> Option<Rejection> {
    let db = error.db_error()?;
    let sqlstate = db.code().code();
    let class = sqlstate.get(..2).unwrap_or_default();
    ["21", "22", "23", "44", "54", "P0"]
        .contains(&class)
        .then(|| Rejection {
            sqlstate: sqlstate.to_owned(),
            message: db.message().to_owned(),
        })
}

/// Runs one batch: the events through the per-event transaction's batched form, the dead
/// letters through their insert (and, with a dead-letter topic, a mark for its relay). The two are independent:
/// one failing leaves the other resolved. A batch of events the server rejects is bisected, so
/// that the events it accepts are written and only the rejected ones are left.
async fn execute(
    repository: PgHistoryRepository,
    publisher: Option<Arc<DeadLetterPublisher>>,
    stats: Arc<Stats>,
    batch: Batch,
) -> BatchResult {
    let started = Instant::now();
    let attempted = batch.len();
    let Batch { events, letters } = batch;
    let mut resolved = Vec::with_capacity(attempted);
    let mut rejected = Vec::new();
    let mut failed = Batch::default();
    let mut error = None;

    if !events.is_empty() {
        match write_events(&repository, publisher.as_deref(), &stats, &events).await {
            Ok(classes) => resolved.extend(events.iter().map(Job::position).zip(classes)),
            Err(err) if rejection(&err).is_some() => {
                let attempt = |chunk: &[Job<Box<DecodedEvent>>]| {
                    let (repository, publisher, stats, chunk) = (
                        repository.clone(),
                        publisher.clone(),
                        stats.clone(),
                        chunk.to_vec(),
                    );
                    async move { write_events(&repository, publisher.as_deref(), &stats, &chunk).await }
                };
                let isolation =
                    bisect::isolate(events, err, attempt, |err| rejection(err).is_some()).await;
                resolved.extend(
                    isolation
                        .done
                        .into_iter()
                        .map(|(job, class)| (job.position(), class)),
                );
                rejected.extend(
                    isolation
                        .rejected
                        .into_iter()
                        .filter_map(|(job, err)| rejection(&err).map(|rejection| (job, rejection))),
                );
                if let Some((jobs, err)) = isolation.failed {
                    failed.events = jobs;
                    error = Some(err);
                }
            }
            Err(err) => {
                failed.events = events;
                error = Some(err);
            }
        }
    }
    let mut dead_letter_reasons = Vec::new();
    if !letters.is_empty() {
        let write = write_dead_letters(&repository, publisher.as_deref(), &stats, &letters);
        match repository.pool().within_deadline(write).await {
            Ok(()) => {
                dead_letter_reasons.extend(letters.iter().map(|job| job.item.reason_code));
                resolved.extend(
                    letters
                        .iter()
                        .map(|job| (job.position(), OutcomeClass::DeadLetter)),
                );
            }
            Err(err) => {
                failed.letters = letters;
                error.get_or_insert(err);
            }
        }
    }
    BatchResult {
        resolved,
        dead_letter_reasons,
        rejected,
        failed: error.map(|error| (failed, error)),
        attempted,
        elapsed: started.elapsed(),
    }
}

/// Writes events in one transaction, under the pool's deadline (an expiry is an Unknown
/// outcome, [`StoreError::TimedOut`]); on success, stores the duplicates whose content differs
/// from the stored row as dead letters before any outcome is reported — their offsets are not
/// resolved until then, so a crash in between finds them again.
async fn write_events(
    repository: &PgHistoryRepository,
    publisher: Option<&DeadLetterPublisher>,
    stats: &Stats,
    events: &[Job<Box<DecodedEvent>>],
) -> Result<Vec<OutcomeClass>, StoreError> {
    let refs: Vec<&HistoryEvent> = events.iter().map(|job| &job.item.event).collect();
    let resolutions = repository
        .pool()
        .within_deadline(process_history_batch(repository, &refs))
        .await?;
    let classes: Vec<OutcomeClass> = resolutions
        .into_iter()
        .map(|resolution| match resolution {
            Resolution::Applied => OutcomeClass::Applied,
            Resolution::AlreadyApplied => OutcomeClass::AlreadyApplied,
        })
        .collect();
    keep_conflicts(repository, publisher, stats, events, &classes).await?;
    Ok(classes)
}

/// A redelivered `event_id` whose content differs from the stored row is not merged: the
/// stored row stays, and the other version is kept as a dead letter (reason
/// `conflicting_duplicate`, the record's own bytes) for an operator to list and look at. A
/// redelivery of the same record finds its letter stored and adds nothing. An error here is the
/// batch's: its events are written again, found applied, and compared again.
async fn keep_conflicts(
    repository: &PgHistoryRepository,
    publisher: Option<&DeadLetterPublisher>,
    stats: &Stats,
    events: &[Job<Box<DecodedEvent>>],
    classes: &[OutcomeClass],
) -> Result<(), StoreError> {
    let duplicates: Vec<&Job<Box<DecodedEvent>>> = events
        .iter()
        .zip(classes)
        .filter(|(_, class)| **class == OutcomeClass::AlreadyApplied)
        .map(|(job, _)| job)
        .collect();
    if duplicates.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = duplicates
        .iter()
        .map(|job| job.item.event_id.as_str())
        .collect();
    // The stored rows never change, so reading them after the commit is as good as inside it.
    let pool = repository.pool();
    let stored = pool.within_deadline(load_events(pool, &ids)).await?;
    let mut conflicts = Vec::new();
    for job in duplicates {
        let event = &job.item.event;
        let Some(row) = stored.get(&event.event_id) else {
            continue;
        };
        if row == event {
            continue;
        }
        stats.conflicting_duplicate();
        warn!(
            event_id = %event.event_id,
            partition = %job.tp,
            offset = job.offset,
            stored = ?row,
            redelivered = ?event,
            "conflicting duplicate: same event_id, different content; the stored row is kept \
             and this version goes to the dead-letter table (reason conflicting_duplicate)"
        );
        conflicts.push(Job {
            tp: job.tp.clone(),
            epoch: job.epoch,
            generation: job.generation,
            offset: job.offset,
            item: DeadLetter::conflicting_duplicate(row, event, job.item.record.clone()),
            // The event's job holds the record's share until it is resolved.
            held: Held::nothing(),
        });
    }
    if conflicts.is_empty() {
        return Ok(());
    }
    pool.within_deadline(write_dead_letters(repository, publisher, stats, &conflicts))
        .await
}

async fn write_dead_letters(
    repository: &PgHistoryRepository,
    publisher: Option<&DeadLetterPublisher>,
    stats: &Stats,
    letters: &[Job<DeadLetter>],
) -> Result<(), StoreError> {
    let rows: Vec<DeadLetterRow<'_>> = letters
        .iter()
        .map(|job| DeadLetterRow {
            topic: &job.tp.topic,
            partition: job.tp.partition,
            offset: job.offset,
            letter: &job.item,
        })
        .collect();
    let outcome = dead_letters::insert(repository.pool(), &rows).await?;
    for &index in &outcome.conflicts {
        let row = &rows[index];
        stats.dead_letter_conflict();
        warn!(
            partition = %letters[index].tp,
            offset = row.offset,
            reason = row.letter.reason_code,
            "a dead letter is already stored at these coordinates with other bytes (was the \
             topic recreated?); the stored one is kept"
        );
    }
    debug!(
        stored = rows.len(),
        new = outcome.new,
        "dead letters written"
    );
    if let Some(publisher) = publisher {
        // Stored is what counts: the relay publishes in the background, so a topic that
        // refuses the letter never holds its partition back.
        dead_letters::request_publication(repository.pool(), &rows, publisher.topic()).await?;
        publisher.wake();
    }
    Ok(())
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
