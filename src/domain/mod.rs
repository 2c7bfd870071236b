//! The pure core: the event, its decoding, and the outcome rules of the per-event transaction.
//! Nothing here does I/O, so all of it is tested without a broker or a database.

pub mod bisect;
pub mod event;
pub mod outcome;

#[cfg(test)]
mod event_props;
#[cfg(test)]
mod fake_repository;
#[cfg(test)]
mod outcome_tests;

pub use event::{DecodeError, Field, HistoryEvent};
pub use outcome::{
    HistoryRepository, HistoryTransaction, Outcome, Resolution, process_history_batch,
    process_history_once,
};
