//! PostgreSQL: the connection pool, the repository of the per-event transaction, migrations
//! and the invariant check.

pub mod database;
pub mod dead_letters;
pub mod error;
pub mod migrate;
pub mod pool;
pub mod repository;
pub mod stuck;
pub mod target;
pub mod traces;
pub mod verify;

pub use database::{Database, connect_pool};
pub use pool::{PgConnection, PgPool, StoreError};
pub use repository::{PgHistoryRepository, PgTransaction};
pub use target::{PgTls, SessionLimits, describe_target};
