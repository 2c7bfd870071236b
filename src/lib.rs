//! history-service: consumes ticket status events from Kafka and keeps an
//! exactly-once-in-effect projection of them in its own PostgreSQL database.
//!
//! Layers, lowest first. A module imports only from its own layer or those below it, never
//! from a layer above, and no two source files import each other, directly or round a circle
//! (`tests/it/layers.rs` reads the sources and keeps both rules):
//! 1. the core — [`domain`]: the event and its decoder, the outcome rules of the per-event
//!    transaction, and the values every layer passes around (`domain/values.rs`:
//!    topic-partition, epoch, record, commit position and outcome, dead letter); [`offsets`]:
//!    the ordered window that decides how far a partition may be committed. No I/O, no actors,
//!    no Kafka, no PostgreSQL;
//! 2. [`config`]: layered settings, validated as plain values (PostgreSQL's URL is parsed by
//!    the store, the pass-through librdkafka properties checked by `kafka::properties`);
//! 3. [`store`]: PostgreSQL — where the database is (`store/target.rs`), the pool, the
//!    repository, migrations, the invariant check; [`kafka`]: the rdkafka consumer, its
//!    callbacks and the commit worker, which reach the actors only through
//!    `actix::Recipient`s of the messages they define ([`kafka::messages`]); [`metrics`]: what
//!    is counted; [`health`]: readiness; [`telemetry`]: logging;
//! 4. [`actors`]: the actix pipeline — Kafka supervisor, partition actors, DB writers and the
//!    OffsetCommitter;
//! 5. [`app`]: wires the service from its settings (and loads them, with every layer's
//!    checks: [`config::Settings::load`]) and runs it until shutdown; [`http`]: metrics and
//!    health endpoints; [`cli`]: the commands of the `history-service` binary.
//!
//! # A record's path
//!
//! 1. `kafka/split_queues.rs` — fetched into its partition's own queue, taken in turn;
//! 2. `kafka/mod.rs` (`item_stream`) — taken from the client in turns, while
//!    `kafka/intake.rs` says the budget (`domain/budget.rs`) has room;
//! 3. `actors/supervisor.rs` — grouped per partition, counted by `actors/window_fill.rs`;
//! 4. `actors/partition.rs` — decoded (`domain/decode.rs`), queued for its window;
//! 5. `actors/committer.rs` — admitted to the window (`offsets/window.rs`), routed by
//!    `actors/dispatcher.rs`;
//! 6. `actors/writer.rs` — batched with other partitions' (`domain/fair_queue.rs`), written by
//!    `actors/batch.rs` (`domain/outcome.rs` through `store/repository.rs`), an event the
//!    database rejects retried by `actors/parked.rs`; the outcome back to the committer;
//! 7. `kafka/commit_worker.rs` — the window's position committed, in order (`offsets/ledger.rs`).
//!
//! The development kit (embedded broker, workloads, demo, benchmark) lives apart, in the
//! `history-devkit` crate (`devkit/`), and is not linked into the production binary.
//!
//! The modules the binary, the tests and the development kit use are `pub`; the rest are
//! `pub(crate)`, and `unreachable_pub` keeps every item of theirs so.

#![warn(unreachable_pub)]

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
pub mod replica;
pub mod store;
pub mod telemetry;
