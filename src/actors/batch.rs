//! A writer's batch calls: one batch of jobs, split by kind, written in one transaction per
//! kind — the events through the per-event transaction's batched form, the dead letters through
//! their insert — and what it came to. A batch the server rejects because of its data is
//! bisected (`domain::bisect`), so that the events it accepts are written and only the ones it
//! rejects by themselves are left, each with the server's reason. No actor state: the writer
//! (`actors/writer.rs`) decides what to do with the result.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::messages::{
    DecodedEvent, Epoch, Generation, Held, ResolvedOffset, TopicPartition, Work, WriteJob,
};
use crate::domain::{BatchWritten, HistoryEvent, Resolution, bisect, write_history_batch};
use crate::kafka::dead_letter_topic::DeadLetterPublisher;
use crate::metrics::{OutcomeClass, Stats};
use crate::store::dead_letters::{self, DeadLetter, DeadLetterRow};
use crate::store::repository::load_events;
use crate::store::{PgHistoryRepository, StoreError};

/// One record's work, typed by kind: the batch code never has to ask which kind a job is.
#[derive(Debug, Clone)]
pub(crate) struct Job<T> {
    pub(crate) tp: TopicPartition,
    pub(crate) epoch: Epoch,
    pub(crate) generation: Generation,
    pub(crate) offset: i64,
    pub(crate) item: T,
    /// The record's share of the budget, given back when the job is dropped (resolved). Only
    /// its drop matters, so nothing reads it.
    #[allow(dead_code)]
    pub(crate) held: Held,
}

impl<T> Job<T> {
    /// The job's record without its item, and the item.
    fn split(self) -> (Job<()>, T) {
        let Job {
            tp,
            epoch,
            generation,
            offset,
            item,
            held,
        } = self;
        let job = Job {
            tp,
            epoch,
            generation,
            offset,
            item: (),
            held,
        };
        (job, item)
    }

    /// Another job for the same record, holding none of its share of the budget (the record's
    /// own job holds it until it is resolved).
    pub(crate) fn for_same_record<U>(&self, item: U) -> Job<U> {
        Job {
            tp: self.tp.clone(),
            epoch: self.epoch,
            generation: self.generation,
            offset: self.offset,
            item,
            held: Held::nothing(),
        }
    }

    pub(crate) fn position(&self) -> ResolvedOffset {
        ResolvedOffset {
            tp: self.tp.clone(),
            epoch: self.epoch,
            generation: self.generation,
            offset: self.offset,
        }
    }
}

impl Job<()> {
    fn with<T>(self, item: T) -> Job<T> {
        Job {
            tp: self.tp,
            epoch: self.epoch,
            generation: self.generation,
            offset: self.offset,
            item,
            held: self.held,
        }
    }
}

impl From<WriteJob> for Job<Work> {
    fn from(job: WriteJob) -> Self {
        Job {
            tp: job.tp,
            epoch: job.epoch,
            generation: job.generation,
            offset: job.offset,
            item: job.work,
            held: job.held,
        }
    }
}

impl From<Job<Work>> for WriteJob {
    fn from(job: Job<Work>) -> Self {
        WriteJob {
            tp: job.tp,
            epoch: job.epoch,
            generation: job.generation,
            offset: job.offset,
            work: job.item,
            held: job.held,
        }
    }
}

/// A batch of jobs, split by kind.
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) events: Vec<Job<Box<DecodedEvent>>>,
    pub(crate) letters: Vec<Job<DeadLetter>>,
}

impl Batch {
    pub(crate) fn of(jobs: impl IntoIterator<Item = WriteJob>) -> Self {
        let jobs = jobs.into_iter();
        // Events are the rule, dead letters the exception.
        let mut batch = Batch {
            events: Vec::with_capacity(jobs.size_hint().0),
            letters: Vec::new(),
        };
        for job in jobs {
            let (job, work) = Job::from(job).split();
            match work {
                Work::Event(item) => batch.events.push(job.with(item)),
                Work::DeadLetter(item) => batch.letters.push(job.with(*item)),
            }
        }
        batch
    }

    pub(crate) fn len(&self) -> usize {
        self.events.len() + self.letters.len()
    }

    /// Splits off everything after the first `keep` jobs (events first, then letters).
    pub(crate) fn split_off(&mut self, keep: usize) -> Batch {
        let events = self.events.split_off(keep.min(self.events.len()));
        let letters_kept = keep.saturating_sub(self.events.len());
        let letters = self.letters.split_off(letters_kept.min(self.letters.len()));
        Batch { events, letters }
    }

    /// The jobs again, as they came to the writer.
    pub(crate) fn into_jobs(self) -> impl Iterator<Item = WriteJob> {
        let events = self.events.into_iter().map(|job| {
            let (job, item) = job.split();
            WriteJob::from(job.with(Work::Event(item)))
        });
        let letters = self.letters.into_iter().map(|job| {
            let (job, item) = job.split();
            WriteJob::from(job.with(Work::DeadLetter(Box::new(item))))
        });
        events.chain(letters)
    }
}

/// The server's reason for rejecting an event by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub(crate) sqlstate: String,
    pub(crate) message: String,
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

/// What one batch came to.
pub(crate) struct BatchResult {
    /// Offsets resolved, with their outcome class.
    pub(crate) resolved: Vec<(ResolvedOffset, OutcomeClass)>,
    /// Reason codes of the dead letters stored.
    pub(crate) dead_letter_reasons: Vec<&'static str>,
    /// Events the database rejected by themselves (isolated by bisecting the batch).
    pub(crate) rejected: Vec<(Job<Box<DecodedEvent>>, Rejection)>,
    /// Jobs whose outcome is Unknown for a reason not about them (an outage), with the error.
    pub(crate) failed: Option<(Batch, StoreError)>,
    /// Jobs attempted.
    pub(crate) attempted: usize,
    pub(crate) elapsed: Duration,
}

/// The partitions of a batch's jobs, for logs: `topic[0],topic[3]`.
pub(crate) fn partitions_of(batch: &Batch) -> String {
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
pub(crate) fn rejection(error: &StoreError) -> Option<Rejection> {
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
pub(crate) async fn execute(
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
pub(crate) async fn write_events(
    repository: &PgHistoryRepository,
    publisher: Option<&DeadLetterPublisher>,
    stats: &Stats,
    events: &[Job<Box<DecodedEvent>>],
) -> Result<Vec<OutcomeClass>, StoreError> {
    let refs: Vec<&HistoryEvent> = events.iter().map(|job| &job.item.event).collect();
    let BatchWritten {
        resolutions,
        stored,
    } = repository
        .pool()
        .within_deadline(write_history_batch(repository, &refs))
        .await?;
    let classes: Vec<OutcomeClass> = resolutions
        .into_iter()
        .map(|resolution| match resolution {
            Resolution::Applied => OutcomeClass::Applied,
            Resolution::AlreadyApplied => OutcomeClass::AlreadyApplied,
        })
        .collect();
    keep_conflicts(repository, publisher, stats, events, &classes, stored).await?;
    Ok(classes)
}

/// A redelivered `event_id` whose content differs from the stored row is not merged: the
/// stored row stays, and the other version is kept as a dead letter (reason
/// `conflicting_duplicate`, the record's own bytes) for an operator to list and look at. A
/// redelivery of the same record finds its letter stored and adds nothing. An error here is the
/// batch's: its events are written again, found applied, and compared again.
///
/// The stored rows come with the batch's answer (`stored`); only those its statement could not
/// see (committed by another transaction while it ran) are read here, in a round trip of their
/// own.
async fn keep_conflicts(
    repository: &PgHistoryRepository,
    publisher: Option<&DeadLetterPublisher>,
    stats: &Stats,
    events: &[Job<Box<DecodedEvent>>],
    classes: &[OutcomeClass],
    mut stored: Vec<Option<HistoryEvent>>,
) -> Result<(), StoreError> {
    let duplicates: Vec<usize> = classes
        .iter()
        .enumerate()
        .filter(|(_, class)| **class == OutcomeClass::AlreadyApplied)
        .map(|(index, _)| index)
        .collect();
    if duplicates.is_empty() {
        return Ok(());
    }
    let unseen: Vec<&str> = duplicates
        .iter()
        .filter(|&&index| stored[index].is_none())
        .map(|&index| events[index].item.event_id.as_str())
        .collect();
    let pool = repository.pool();
    if !unseen.is_empty() {
        // The stored rows never change, so reading them after the commit is as good as inside
        // it.
        let loaded = pool.within_deadline(load_events(pool, &unseen)).await?;
        for &index in &duplicates {
            if stored[index].is_none() {
                stored[index] = loaded.get(&events[index].item.event_id).cloned();
            }
        }
    }
    let mut conflicts = Vec::new();
    for index in duplicates {
        let job = &events[index];
        let event = &job.item.event;
        let Some(row) = &stored[index] else {
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
        conflicts.push(job.for_same_record(DeadLetter::conflicting_duplicate(
            row,
            event,
            job.item.record.clone(),
        )));
    }
    if conflicts.is_empty() {
        return Ok(());
    }
    pool.within_deadline(write_dead_letters(repository, publisher, stats, &conflicts))
        .await
}

pub(crate) async fn write_dead_letters(
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
