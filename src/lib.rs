//! history-service: consumes ticket status events from Kafka and keeps an
//! exactly-once-in-effect projection of them in its own PostgreSQL database.
//!
//! Layers, each using only those above it in this list (`tests/it/layers.rs` keeps the core, the
//! store and the metrics so; the Kafka side and the actors still import each other's message
//! types):
//! - [`domain`]: the event and its decoder, the outcome rules of the per-event transaction, and
//!   the values every layer passes around (topic-partition, epoch, record, commit position,
//!   dead letter);
//! - [`offsets`]: the ordered window that decides how far a partition may be committed;
//! - [`config`]: layered, validated settings;
//! - [`store`]: PostgreSQL — the repository, migrations, the invariant check;
//! - [`actors`]: the actix pipeline — Kafka supervisor, partition actors, DB writers and the
//!   OffsetCommitter — with [`kafka`] holding the rdkafka consumer it drives;
//! - [`app`]: wires the service from its settings and runs it until shutdown; [`http`] serves
//!   metrics and health, [`health`] decides readiness; [`metrics`] names what is counted;
//! - the development kit (embedded broker, workloads, demo, benchmark) lives apart, in the
//!   `history-devkit` crate (`devkit/`), and is not linked into the production binary;
//! - [`cli`]: the commands of the `history-service` binary.

pub mod actors;
pub mod app;
pub mod cli;
pub mod config;
pub mod domain;
pub mod health;
pub mod http;
pub mod kafka;
pub mod metrics;
pub mod offsets;
pub mod store;
pub mod telemetry;
