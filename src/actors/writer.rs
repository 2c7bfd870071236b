//! A DbWriter gathers jobs into batches (up to `batch_max_events`, waiting at most
//! `batch_linger_ms`) and runs one transaction per batch. Every record's outcome is reported:
//! resolved offsets to the OffsetCommitter; an Unknown batch is retried with exponential
//! backoff, and its offsets stay unresolved (so uncommitted) until the database answers.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::{debug, info, warn};

use super::committer::OffsetCommitter;
use super::messages::{Resolved, ResolvedOffset, Work, WriteJob, WriteJobs};
use crate::domain::{HistoryEvent, Resolution, process_history_batch};
use crate::kafka::dead_letter_topic::DeadLetterPublisher;
use crate::metrics::{OutcomeClass, Stats};
use crate::store::dead_letters::{self, DeadLetterRow};
use crate::store::repository::load_events;
use crate::store::{PgHistoryRepository, StoreError};

/// The writer's tuning, from `[pipeline]`.
#[derive(Debug, Clone)]
pub struct WriterSettings {
    pub batch_max_events: usize,
    pub batch_linger: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
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
    /// Jobs waiting for the next batch, oldest first (a deque: batches are taken from the
    /// front of a buffer that can hold tens of thousands of jobs).
    buffer: VecDeque<WriteJob>,
    state: State,
    /// The next backoff delay; reset by a success.
    next_delay: Duration,
    attempt: u32,
}

/// What one batch came to.
struct BatchResult {
    /// Jobs resolved, with their outcome class.
    resolved: Vec<(WriteJob, OutcomeClass)>,
    /// Jobs whose outcome is Unknown, with the error.
    failed: Option<(Vec<WriteJob>, WriteError)>,
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
        let next_delay = settings.retry_initial;
        DbWriter {
            id,
            repository,
            publisher,
            committer,
            settings,
            stats,
            buffer: VecDeque::new(),
            state: State::Idle,
            next_delay,
            attempt: 0,
        }
    }

    fn schedule(&mut self, ctx: &mut Context<Self>) {
        let full = self.buffer.len() >= self.settings.batch_max_events;
        match &self.state {
            State::Idle if self.buffer.is_empty() => {}
            State::Idle if full || self.settings.batch_linger.is_zero() => self.write_next(ctx),
            State::Idle => {
                let timer = ctx.run_later(self.settings.batch_linger, |writer, ctx| {
                    writer.state = State::Idle;
                    writer.write_next(ctx);
                });
                self.state = State::Lingering(timer);
            }
            State::Lingering(timer) if full => {
                ctx.cancel_future(*timer);
                self.write_next(ctx);
            }
            State::Lingering(_) | State::Writing | State::BackingOff => {}
        }
    }

    fn write_next(&mut self, ctx: &mut Context<Self>) {
        if self.buffer.is_empty() {
            self.state = State::Idle;
            return;
        }
        let take = self.buffer.len().min(self.settings.batch_max_events);
        let batch: Vec<WriteJob> = self.buffer.drain(..take).collect();
        self.write(batch, ctx);
    }

    fn write(&mut self, batch: Vec<WriteJob>, ctx: &mut Context<Self>) {
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
        self.stats.writes.batch(
            !result.resolved.is_empty(),
            result.failed.as_ref().map(|f| &f.1),
        );
        self.stats.transaction(
            result.elapsed,
            result.resolved.len() + result.failed.as_ref().map_or(0, |f| f.0.len()),
        );
        if !result.resolved.is_empty() {
            let mut counts = [0u64; 4];
            let resolved = result
                .resolved
                .into_iter()
                .map(|(job, class)| {
                    counts[class as usize] += 1;
                    if let Work::DeadLetter(letter) = &job.work {
                        self.stats.dead_letter_reason(letter.reason_code);
                    }
                    ResolvedOffset {
                        tp: job.tp,
                        epoch: job.epoch,
                        offset: job.offset,
                    }
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
            self.committer.do_send(Resolved(resolved));
        }
        match result.failed {
            None => {
                if self.attempt > 0 {
                    info!(
                        writer = self.id,
                        attempts = self.attempt,
                        "database answers again"
                    );
                }
                self.attempt = 0;
                self.next_delay = self.settings.retry_initial;
                self.state = State::Idle;
                self.schedule(ctx);
            }
            Some((jobs, error)) => {
                self.stats
                    .outcomes(OutcomeClass::Unknown, jobs.len() as u64);
                self.stats.retry();
                self.attempt += 1;
                let delay = self.next_delay;
                self.next_delay = (delay * 2).min(self.settings.retry_max);
                warn!(
                    writer = self.id,
                    records = jobs.len(),
                    attempt = self.attempt,
                    retry_in_ms = delay.as_millis() as u64,
                    %error,
                    "write failed, outcome unknown: retrying"
                );
                self.state = State::BackingOff;
                ctx.run_later(delay, move |writer, ctx| writer.write(jobs, ctx));
            }
        }
    }
}

/// Why a batch's outcome is Unknown.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("publishing to the dead-letter topic failed: {0}")]
    Publish(#[from] rdkafka::error::KafkaError),
}

/// Runs one batch: the events through the per-event transaction's batched form, the dead
/// letters through their insert (and the dead-letter topic, if any). The two are independent:
/// one failing leaves the other resolved.
async fn execute(
    repository: PgHistoryRepository,
    publisher: Option<Arc<DeadLetterPublisher>>,
    stats: Arc<Stats>,
    batch: Vec<WriteJob>,
) -> BatchResult {
    let started = Instant::now();
    let (events, letters): (Vec<WriteJob>, Vec<WriteJob>) = batch
        .into_iter()
        .partition(|job| matches!(job.work, Work::Event(_)));
    let mut resolved = Vec::with_capacity(events.len() + letters.len());
    let mut failed_jobs = Vec::new();
    let mut error = None;

    if !events.is_empty() {
        match write_events(&repository, &events).await {
            Ok(classes) => {
                report_conflicts(&repository, &stats, &events, &classes).await;
                resolved.extend(events.into_iter().zip(classes));
            }
            Err(err) => {
                failed_jobs.extend(events);
                error = Some(WriteError::Store(err));
            }
        }
    }
    if !letters.is_empty() {
        match write_dead_letters(&repository, publisher.as_deref(), &stats, &letters).await {
            Ok(()) => resolved.extend(
                letters
                    .into_iter()
                    .map(|job| (job, OutcomeClass::DeadLetter)),
            ),
            Err(err) => {
                failed_jobs.extend(letters);
                error.get_or_insert(err);
            }
        }
    }
    BatchResult {
        resolved,
        failed: error.map(|error| (failed_jobs, error)),
        elapsed: started.elapsed(),
    }
}

fn event_of(job: &WriteJob) -> &HistoryEvent {
    match &job.work {
        Work::Event(event) => event,
        Work::DeadLetter(_) => unreachable!("only event jobs are passed here"),
    }
}

async fn write_events(
    repository: &PgHistoryRepository,
    events: &[WriteJob],
) -> Result<Vec<OutcomeClass>, StoreError> {
    let refs: Vec<&HistoryEvent> = events.iter().map(event_of).collect();
    let resolutions = process_history_batch(repository, &refs).await?;
    Ok(resolutions
        .into_iter()
        .map(|resolution| match resolution {
            Resolution::Applied => OutcomeClass::Applied,
            Resolution::AlreadyApplied => OutcomeClass::AlreadyApplied,
        })
        .collect())
}

/// A redelivered `event_id` whose content differs from the stored row is not merged: the
/// stored row stays, and the conflict is counted and logged for an operator to look at.
async fn report_conflicts(
    repository: &PgHistoryRepository,
    stats: &Stats,
    events: &[WriteJob],
    classes: &[OutcomeClass],
) {
    let duplicates: Vec<&WriteJob> = events
        .iter()
        .zip(classes)
        .filter(|(_, class)| **class == OutcomeClass::AlreadyApplied)
        .map(|(job, _)| job)
        .collect();
    if duplicates.is_empty() {
        return;
    }
    let ids: Vec<&str> = duplicates
        .iter()
        .map(|job| event_of(job).event_id.as_str())
        .collect();
    // The stored rows never change, so reading them after the commit is as good as inside it.
    let stored = match load_events(repository.pool(), &ids).await {
        Ok(stored) => stored,
        Err(err) => {
            debug!(error = %err, "could not compare duplicates with their stored rows");
            return;
        }
    };
    for job in duplicates {
        let event = event_of(job);
        if let Some(row) = stored.get(&event.event_id) {
            if !row.same_content(event) {
                stats.conflicting_duplicate();
                warn!(
                    event_id = %event.event_id,
                    partition = %job.tp,
                    offset = job.offset,
                    stored = ?row,
                    redelivered = ?event,
                    "conflicting duplicate: same event_id, different content; the stored row is kept"
                );
            }
        }
    }
}

async fn write_dead_letters(
    repository: &PgHistoryRepository,
    publisher: Option<&DeadLetterPublisher>,
    stats: &Stats,
    letters: &[WriteJob],
) -> Result<(), WriteError> {
    let rows: Vec<DeadLetterRow<'_>> = letters
        .iter()
        .map(|job| match &job.work {
            Work::DeadLetter(letter) => DeadLetterRow {
                topic: &job.tp.topic,
                partition: job.tp.partition,
                offset: job.offset,
                letter,
            },
            Work::Event(_) => unreachable!("only dead-letter jobs are passed here"),
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
        // Only what no earlier delivery published: a redelivered poison record is not
        // published twice (a crash between publishing and marking may still repeat one).
        let pending: Vec<DeadLetterRow<'_>> = dead_letters::unpublished(repository.pool(), &rows)
            .await?
            .into_iter()
            .map(|index| rows[index].clone())
            .collect();
        if !pending.is_empty() {
            publisher.publish(&pending).await?;
            dead_letters::mark_published(repository.pool(), &pending).await?;
        }
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
        self.buffer.extend(msg.0);
        self.schedule(ctx);
    }
}
