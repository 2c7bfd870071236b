//! An event the database rejects by itself, parked: retried alone, with backoff, while its
//! writer serves other jobs. Its outcome stays Unknown, so its partition's position waits at its
//! offset (and the partition's window fills and pauses it, alone). Each retry first asks whether
//! the partition is still assigned here and whether an operator asked to set the event aside
//! (`dead-letters set-aside`, through the `stuck_events` table); then writes it again. The
//! writer (`actors/writer.rs`) schedules the retries and reports what resolves.

use std::sync::Arc;

use actix::Addr;
use tracing::{debug, error, info, warn};

use super::batch::{Job, Rejection, rejection, write_dead_letters, write_events};
use super::committer::OffsetCommitter;
use super::messages::{DecodedEvent, ResolvedOffset, RetryBegins};
use crate::domain::backoff::Backoff;
use crate::domain::values::SET_ASIDE;
use crate::kafka::dead_letter_topic::DeadLetterPublisher;
use crate::metrics::{self, OutcomeClass, Stats};
use crate::store::dead_letters::DeadLetter;
use crate::store::stuck;
use crate::store::{PgHistoryRepository, StoreError};

/// An event the database rejects by itself, retried alone.
pub(crate) struct ParkedEvent {
    job: Job<Box<DecodedEvent>>,
    rejection: Rejection,
    /// The delays between its attempts.
    backoff: Backoff,
    attempts: u32,
}

/// What a retry needs of its writer.
#[derive(Clone)]
pub(crate) struct Retrying {
    pub(crate) repository: PgHistoryRepository,
    pub(crate) publisher: Option<Arc<DeadLetterPublisher>>,
    pub(crate) committer: Addr<OffsetCommitter>,
    pub(crate) stats: Arc<Stats>,
    /// How this replica names itself in `stuck_events`.
    pub(crate) replica: Arc<str>,
}

/// What one retry of a stuck event came to.
pub(crate) enum Retry {
    /// Its partition is no longer assigned here.
    Revoked,
    /// An operator asked to set it aside: stored as a dead letter (or why not).
    SetAside(Result<stuck::SetAsideRequest, StoreError>),
    /// Written again: its outcome (or why not).
    Written(Result<Vec<OutcomeClass>, StoreError>),
}

/// Where a parked event stands after a retry.
pub(crate) enum Settled {
    /// No longer this writer's: resolved (the outcome to report), or handed over with its
    /// partition (nothing to report).
    Done(Option<(ResolvedOffset, OutcomeClass)>),
    /// Still rejected: retry it after its next delay.
    Again,
}

impl ParkedEvent {
    /// Parks `job`, which the database rejected for `rejection`: counted, named in the log and
    /// in `history_stuck_event`.
    pub(crate) fn park(
        job: Job<Box<DecodedEvent>>,
        rejection: Rejection,
        backoff: Backoff,
        writer: usize,
        stats: &Stats,
    ) -> Self {
        stats.outcomes(OutcomeClass::Unknown, 1);
        stats.retry();
        mark_stuck(&job, &rejection, true);
        error!(
            writer,
            partition = %job.tp,
            offset = job.offset,
            event_id = %job.item.event_id,
            sqlstate = %rejection.sqlstate,
            error = %rejection.message,
            "the database rejects this event: its partition's position waits at this offset \
             (other partitions go on); retrying it alone until the database accepts it"
        );
        ParkedEvent {
            job,
            rejection,
            backoff,
            attempts: 1,
        }
    }

    pub(crate) fn position(&self) -> ResolvedOffset {
        self.job.position()
    }

    /// How long to wait before the next attempt.
    pub(crate) fn next_delay(&mut self) -> std::time::Duration {
        self.backoff.next_delay()
    }

    /// One retry: unless its partition was revoked meanwhile (its next owner re-reads it) or an
    /// operator set it aside, the event is written again.
    pub(crate) fn attempt(&self, with: Retrying) -> impl Future<Output = Retry> + 'static {
        let job = self.job.clone();
        let rejected = self.rejection.clone();
        let Retrying {
            repository,
            publisher,
            committer,
            stats,
            replica,
        } = with;
        async move {
            // From here until it settles the retry is a write under way: a revoke waits for it.
            let assigned = committer
                .send(RetryBegins(job.position()))
                .await
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
                    let letter = job.for_same_record(DeadLetter::set_aside(
                        &job.item.event_id,
                        job.item.record.clone(),
                        &request.by,
                        request.at,
                        request.reason.as_deref(),
                        &rejected.to_string(),
                    ));
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
        }
    }

    /// Takes in what a retry came to: counted, logged, the stuck-event gauge kept true.
    pub(crate) fn settle(&mut self, result: Retry, stats: &Stats, replica: &str) -> Settled {
        let job = &self.job;
        let unstick = |rejection: &Rejection| mark_stuck(job, rejection, false);
        match result {
            Retry::Revoked => {
                unstick(&self.rejection);
                stats
                    .stuck_handed_over
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                info!(
                    partition = %job.tp,
                    offset = job.offset,
                    event_id = %job.item.event_id,
                    "stuck event no longer retried here: its partition was revoked"
                );
                Settled::Done(None)
            }
            Retry::SetAside(Ok(request)) => {
                unstick(&self.rejection);
                stats.dead_letter_reason(SET_ASIDE);
                warn!(
                    partition = %job.tp,
                    offset = job.offset,
                    event_id = %job.item.event_id,
                    by = %request.by,
                    reason = request.reason.as_deref().unwrap_or(""),
                    replica,
                    "stuck event set aside on request: stored as a dead letter (reason \
                     set_aside); its partition moves on"
                );
                Settled::Done(Some((job.position(), OutcomeClass::DeadLetter)))
            }
            Retry::Written(Ok(classes)) => {
                unstick(&self.rejection);
                // The database takes writes again.
                stats.writes.succeeded();
                info!(
                    partition = %job.tp,
                    offset = job.offset,
                    event_id = %job.item.event_id,
                    attempts = self.attempts + 1,
                    "stuck event written: its partition moves on"
                );
                Settled::Done(classes.first().map(|&class| (job.position(), class)))
            }
            Retry::SetAside(Err(error)) | Retry::Written(Err(error)) => {
                stats.outcomes(OutcomeClass::Unknown, 1);
                stats.retry();
                // During an outage the server gives no reason; the last one stands.
                if let Some(rejection) = rejection(&error) {
                    if rejection.sqlstate != self.rejection.sqlstate {
                        unstick(&self.rejection);
                        mark_stuck(job, &rejection, true);
                        warn!(
                            partition = %job.tp,
                            offset = job.offset,
                            event_id = %job.item.event_id,
                            sqlstate = %rejection.sqlstate,
                            error = %rejection.message,
                            "the database rejects the stuck event for another reason now"
                        );
                    }
                    self.rejection = rejection;
                }
                debug!(
                    partition = %job.tp,
                    offset = job.offset,
                    event_id = %job.item.event_id,
                    attempts = self.attempts + 1,
                    %error,
                    "stuck event still rejected"
                );
                self.attempts += 1;
                Settled::Again
            }
        }
    }
}

/// `history_stuck_event` of the event, for this reason: 1 while it is stuck, 0 once not.
fn mark_stuck(job: &Job<Box<DecodedEvent>>, rejection: &Rejection, stuck: bool) {
    metrics::set_stuck_event(
        &job.tp,
        job.offset,
        &job.item.event_id,
        &rejection.sqlstate,
        stuck,
    );
}
