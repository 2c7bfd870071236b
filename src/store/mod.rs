//! PostgreSQL: the connection pool, the repository of the per-event transaction, migrations
//! and the invariant check.

pub mod database;
pub mod dead_letters;
pub mod error;
pub mod migrate;
pub mod pool;
pub mod repository;
pub mod verify;

pub use database::{Database, PgTls};
pub use pool::{PgConnection, PgPool, StoreError, connect_pool};
pub use repository::{PgHistoryRepository, PgTransaction};
