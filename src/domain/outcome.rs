//! The per-event transaction and its outcome contract, over an abstract repository.
//!
//! The rules live here, apart from PostgreSQL, so a scripted fake can prove every path:
//! Begin → TryInbox → (SaveHistory → Commit) with exactly one Rollback after a successful Begin on
//! every path without a confirmed Commit, never a Rollback after a confirmed Commit, and any
//! repository error handed back unwrapped as [`Outcome::Unknown`].

use std::collections::HashMap;
use std::future::Future;

use super::event::HistoryEvent;

/// What processing one delivery of an event came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<E> {
    /// The inbox marker and the history row were committed by this call.
    Applied,
    /// The event was already recorded: a confirmed duplicate, not an error.
    AlreadyApplied,
    /// The repository failed; whether the pair exists is not known. Carries the very error the
    /// repository returned. The record's offset stays unresolved and the event is retried.
    Unknown(E),
}

/// A known outcome: the two variants of [`Outcome`] that resolve a record's offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    Applied,
    AlreadyApplied,
}

impl<E> From<Resolution> for Outcome<E> {
    fn from(resolution: Resolution) -> Self {
        match resolution {
            Resolution::Applied => Outcome::Applied,
            Resolution::AlreadyApplied => Outcome::AlreadyApplied,
        }
    }
}

/// What claiming one event's marker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The marker was claimed by this call: the event is new, and its row was inserted.
    New,
    /// The marker was there already: the event was recorded before. With the stored row, when
    /// the repository read it in the same round trip (it may not see a row another transaction
    /// committed while this one ran).
    Stored(Option<HistoryEvent>),
}

/// What a batch came to: one [`Resolution`] per input event, in input order, and for each
/// event found [`Resolution::AlreadyApplied`] the stored row of its `event_id` when it is known
/// (read with the claim, or written by this very batch), so that a conflicting duplicate is
/// told without another round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchWritten {
    pub resolutions: Vec<Resolution>,
    pub stored: Vec<Option<HistoryEvent>>,
}

/// Opens transactions on the History database.
///
/// The futures are `Send` so a repository can be driven from any runtime, actor or task.
pub trait HistoryRepository {
    type Error;
    type Tx: HistoryTransaction<Error = Self::Error>;

    /// Starts a transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, Self::Error>> + Send;
}

/// One open transaction: claim the inbox marker, save the history row, commit or roll back.
pub trait HistoryTransaction: Send {
    type Error;

    /// Claims the inbox marker: `true` if this transaction inserted it, `false` if it existed.
    fn try_inbox(
        &mut self,
        event_id: &str,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Claims many markers at once; returns, in input order, whether each id was inserted by
    /// this transaction. The ids are distinct.
    fn try_inbox_batch(
        &mut self,
        event_ids: &[&str],
    ) -> impl Future<Output = Result<Vec<bool>, Self::Error>> + Send;

    /// Inserts the history row of an event whose marker this transaction claimed.
    fn save_history(
        &mut self,
        event: &HistoryEvent,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Inserts the history rows of events whose markers this transaction claimed.
    fn save_history_batch(
        &mut self,
        events: &[&HistoryEvent],
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Claims the markers of events with distinct ids and inserts the history rows of those it
    /// claimed; returns, in input order, what each claim found ([`Claim`]).
    ///
    /// By default [`try_inbox_batch`](Self::try_inbox_batch) then, if anything was claimed,
    /// [`save_history_batch`](Self::save_history_batch), reading no stored row. A repository
    /// may do both in one statement instead (one round trip; a statement is atomic by itself),
    /// and answer the stored rows of the events already there in the same round trip.
    fn claim_and_save_batch(
        &mut self,
        events: &[&HistoryEvent],
    ) -> impl Future<Output = Result<Vec<Claim>, Self::Error>> + Send {
        async move {
            let ids: Vec<&str> = events.iter().map(|event| event.event_id.as_str()).collect();
            let inserted = self.try_inbox_batch(&ids).await?;
            let new_events: Vec<&HistoryEvent> = events
                .iter()
                .zip(&inserted)
                .filter(|&(_, &is_new)| is_new)
                .map(|(&event, _)| event)
                .collect();
            if !new_events.is_empty() {
                self.save_history_batch(&new_events).await?;
            }
            Ok(inserted
                .into_iter()
                .map(|new| if new { Claim::New } else { Claim::Stored(None) })
                .collect())
        }
    }

    fn commit(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    fn rollback(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// Records one event at most once: the per-event transaction, with its outcome.
pub async fn process_history_once<R: HistoryRepository>(
    repository: &R,
    event: &HistoryEvent,
) -> Outcome<R::Error> {
    let mut tx = match repository.begin().await {
        Ok(tx) => tx,
        // Nothing was opened, so there is nothing to roll back.
        Err(err) => return Outcome::Unknown(err),
    };
    let outcome = match tx.try_inbox(&event.event_id).await {
        Ok(false) => Outcome::AlreadyApplied,
        Ok(true) => match tx.save_history(event).await {
            Ok(()) => match tx.commit().await {
                Ok(()) => return Outcome::Applied,
                Err(err) => Outcome::Unknown(err),
            },
            Err(err) => Outcome::Unknown(err),
        },
        Err(err) => Outcome::Unknown(err),
    };
    // Cleanup only: the outcome is already decided, and a failed rollback changes nothing
    // about it (the server aborts a transaction whose session ends).
    let _ = tx.rollback().await;
    outcome
}

/// Records a batch of events in one transaction, with every event getting the outcome it would
/// have got alone: `Ok` holds one [`Resolution`] per input event, in input order; `Err` means
/// every event of the batch is [`Outcome::Unknown`] with that error.
///
/// Events sharing an `event_id` within the batch: the first is `Applied` (if new), the rest
/// `AlreadyApplied`. A batch of nothing but duplicates is rolled back, like the single path.
pub async fn process_history_batch<R: HistoryRepository>(
    repository: &R,
    events: &[&HistoryEvent],
) -> Result<Vec<Resolution>, R::Error> {
    write_history_batch(repository, events)
        .await
        .map(|written| written.resolutions)
}

/// [`process_history_batch`], answering also the stored rows of the duplicates it found
/// ([`BatchWritten`]).
pub async fn write_history_batch<R: HistoryRepository>(
    repository: &R,
    events: &[&HistoryEvent],
) -> Result<BatchWritten, R::Error> {
    if events.is_empty() {
        return Ok(BatchWritten {
            resolutions: Vec::new(),
            stored: Vec::new(),
        });
    }
    let mut tx = repository.begin().await?;
    let plan = BatchPlan::new(events);
    let result = run_batch(&mut tx, &plan).await;
    match result {
        Ok(BatchCommit::Committed(written)) => Ok(written),
        Ok(BatchCommit::NothingNew(written)) => {
            let _ = tx.rollback().await;
            Ok(written)
        }
        Err(err) => {
            let _ = tx.rollback().await;
            Err(err)
        }
    }
}

enum BatchCommit {
    /// Something new was written and the commit was confirmed.
    Committed(BatchWritten),
    /// Every event was a duplicate; the transaction is still open and needs its rollback.
    NothingNew(BatchWritten),
}

async fn run_batch<T: HistoryTransaction>(
    tx: &mut T,
    plan: &BatchPlan<'_>,
) -> Result<BatchCommit, T::Error> {
    let firsts: Vec<&HistoryEvent> = plan
        .first_of_id
        .iter()
        .map(|&index| plan.events[index])
        .collect();
    let claims = tx.claim_and_save_batch(&firsts).await?;
    let written = plan.written(claims);
    if !written.resolutions.contains(&Resolution::Applied) {
        return Ok(BatchCommit::NothingNew(written));
    }
    tx.commit().await?;
    Ok(BatchCommit::Committed(written))
}

/// Which input events carry the first occurrence of each `event_id`.
struct BatchPlan<'a> {
    events: &'a [&'a HistoryEvent],
    /// For each distinct id, the index of the event that first carried it.
    first_of_id: Vec<usize>,
    /// For each input event, the index of its id among the distinct ids (in order of first
    /// occurrence).
    id_slot: Vec<usize>,
}

impl<'a> BatchPlan<'a> {
    fn new(events: &'a [&'a HistoryEvent]) -> Self {
        // Every event of every batch is hashed here: the standard SipHash cost more than the
        // rest of the plan (its keys are event ids, deduplicated within one batch only).
        let mut slots: HashMap<&str, usize, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(events.len(), Default::default());
        let mut first_of_id = Vec::with_capacity(events.len());
        let id_slot = events
            .iter()
            .enumerate()
            .map(|(index, event)| {
                *slots.entry(event.event_id.as_str()).or_insert_with(|| {
                    first_of_id.push(index);
                    first_of_id.len() - 1
                })
            })
            .collect();
        BatchPlan {
            events,
            first_of_id,
            id_slot,
        }
    }

    /// Each input event's resolution and, for a duplicate, the stored row of its id: the one
    /// the claim read, or the batch's own first event of that id when the batch inserted it.
    fn written(&self, claims: Vec<Claim>) -> BatchWritten {
        let mut resolutions = Vec::with_capacity(self.events.len());
        let mut stored = Vec::with_capacity(self.events.len());
        for (index, &slot) in self.id_slot.iter().enumerate() {
            let first = self.first_of_id[slot];
            match &claims[slot] {
                Claim::New if first == index => {
                    resolutions.push(Resolution::Applied);
                    stored.push(None);
                }
                Claim::New => {
                    resolutions.push(Resolution::AlreadyApplied);
                    stored.push(Some(self.events[first].clone()));
                }
                Claim::Stored(row) => {
                    resolutions.push(Resolution::AlreadyApplied);
                    stored.push(row.clone());
                }
            }
        }
        BatchWritten {
            resolutions,
            stored,
        }
    }
}
