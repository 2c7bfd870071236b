//! PostgreSQL: the connection pool, the repository of the per-event transaction, migrations
//! and the invariant check.

pub(crate) mod database;
pub mod dead_letters;
pub(crate) mod error;
pub mod migrate;
pub(crate) mod pool;
pub mod repository;
pub(crate) mod stuck;
pub(crate) mod target;
pub(crate) mod traces;
pub mod verify;

pub use database::{Database, connect_pool};
pub use pool::{PgConnection, PgPool, StoreError};
pub use repository::{PgHistoryRepository, PgTransaction};
pub use target::{PgTls, SessionLimits, describe_target};
