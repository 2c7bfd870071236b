//! history-service: consumes ticket status events from Kafka and keeps an
//! exactly-once-in-effect projection of them in its own PostgreSQL database.
//!
//! Layers, each using only those above it in this list:
//! - [`domain`]: the event and its decoder, the outcome rules of the per-event transaction;
//! - [`offsets`]: the ordered window that decides how far a partition may be committed;
//! - [`config`]: layered, validated settings;
//! - [`store`]: PostgreSQL — the repository, migrations, the invariant check;
//! - [`cli`]: the commands of the `history-service` binary.

pub mod cli;
pub mod config;
pub mod domain;
pub mod offsets;
pub mod store;
pub mod telemetry;
