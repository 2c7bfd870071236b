//! Schema migrations (`migrations/V{n}__name.sql`, embedded in the binary), serialized across
//! replicas that start at once by a PostgreSQL advisory lock.

use tokio_postgres::Client;
use tracing::info;

use super::database::Database;
use super::error::{StoreError, with_causes};

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The advisory lock every migrating process takes: "History!" in ASCII.
const MIGRATION_LOCK_KEY: i64 = 0x4869_7374_6f72_7921;

/// What a migration run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied by this run, as `V{n}__{name}`.
    pub applied: Vec<String>,
    /// Every migration the binary knows.
    pub known: usize,
}

/// Applies pending migrations. Idempotent; safe when several processes call it at once: the
/// advisory lock makes them take turns, and each applies only what the previous left pending.
#[tracing::instrument(skip(client))]
pub async fn run_migrations(client: &mut Client) -> Result<MigrationReport, StoreError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    let result = embedded::migrations::runner()
        .set_abort_divergent(true)
        .run_async(client)
        .await;
    // Released explicitly so a pooled session does not keep it; a lost session releases it too.
    let unlock = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await;
    let report = result.map_err(|err| StoreError::Migration(with_causes(&err)))?;
    unlock?;
    let applied: Vec<String> = report
        .applied_migrations()
        .iter()
        .map(|migration| format!("V{}__{}", migration.version(), migration.name()))
        .collect();
    let known = embedded::migrations::runner().get_migrations().len();
    info!(applied = ?applied, known, "migrations up to date");
    Ok(MigrationReport { applied, known })
}

/// Connects to `database` and applies its pending migrations, giving up after `timeout` (the
/// connection is dropped then): [`StoreError::TimedOut`]. A hung server or a fail-over that
/// leaves the old address acknowledging would otherwise hold start-up for good.
pub async fn run_migrations_within(
    database: &Database,
    timeout: std::time::Duration,
) -> Result<MigrationReport, StoreError> {
    let attempt = async {
        let mut client = database.connect().await?;
        run_migrations(&mut client).await
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::TimedOut(timeout)),
    }
}

/// Connects without TLS, outside any pool (tools and tests; the service uses [`Database`]).
pub async fn connect(config: &tokio_postgres::Config) -> Result<Client, StoreError> {
    Database::plain(config.clone()).connect().await
}

/// Creates the database if it does not exist, through the server's `postgres` database. Used
/// by `demo` and by `migrate --create-database`.
pub async fn create_database_if_missing(database: &Database) -> Result<bool, StoreError> {
    let name = database
        .config
        .get_dbname()
        .ok_or_else(|| StoreError::Migration("the database URL names no database".into()))?
        .to_owned();
    let mut admin = database.clone();
    admin.config.dbname("postgres");
    let client = admin.connect().await?;
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if exists {
        return Ok(false);
    }
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    match client
        .batch_execute(&format!("CREATE DATABASE {quoted}"))
        .await
    {
        Ok(()) => Ok(true),
        // Another process created it between the check and the CREATE.
        Err(err) if err.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) => {
            Ok(false)
        }
        Err(err) => Err(err.into()),
    }
}
