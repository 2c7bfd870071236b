//! The pure core: the event, its decoding, the outcome rules of the per-event transaction, and
//! the values every layer passes around. Nothing here does I/O or knows of actors, Kafka or
//! PostgreSQL (a test in `tests/it/layers.rs` keeps it so), so all of it is tested without a
//! broker or a database.

pub mod backoff;
pub(crate) mod batch_size;
pub(crate) mod bisect;
pub(crate) mod budget;
pub mod decode;
pub mod event;
pub(crate) mod fair_queue;
pub(crate) mod flow;
pub mod linger;
pub mod outcome;
pub(crate) mod room_patience;
pub(crate) mod rotation;
pub(crate) mod traces;
pub(crate) mod turns;
pub mod values;

#[cfg(test)]
mod event_props;
#[cfg(test)]
mod fake_repository;
#[cfg(test)]
mod outcome_tests;

pub use decode::{DecodeError, Field};
pub use event::HistoryEvent;
pub use outcome::{
    BatchWritten, Claim, HistoryRepository, HistoryTransaction, Outcome, Resolution,
    process_history_batch, process_history_once, write_history_batch,
};
pub use values::{
    CommitOutcome, CommitPosition, CommitReason, DeadLetter, Epoch, Generation, PartitionMap,
    Record, TopicPartition,
};
