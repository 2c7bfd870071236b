//! The bb8 pool of PostgreSQL connections, each with its prepared statements.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bb8_postgres::PostgresConnectionManager;
use postgres_openssl::MakeTlsConnector;
use tokio_postgres::{Client, NoTls, Statement};

pub use super::error::StoreError;
use super::target::{PgTls, SessionLimits};

/// The pool of connections to the History database. bb8 tells a caller only that no connection
/// came in time; this pool also remembers why the last attempt to connect failed (the database
/// does not exist, refuses, is shutting down), so that what is logged says so.
///
/// It also bounds the work done on its connections ([`PgPool::within_deadline`]) and replaces
/// them when that work says the sessions are bad: see `Generation`.
#[derive(Clone)]
pub struct PgPool {
    pool: bb8::Pool<PgManager>,
    last_connect_error: ConnectErrorSlot,
    generation: Generation,
    deadline: Duration,
}

impl PgPool {
    /// Builds the pool from `builder`, recording connection errors.
    pub(super) fn build(builder: bb8::Builder<PgManager>, manager: PgManager) -> Self {
        let last_connect_error = ConnectErrorSlot::default();
        let generation = manager.generation.clone();
        let deadline = manager.limits.statement_timeout;
        let pool = builder
            .error_sink(Box::new(last_connect_error.clone()))
            .connection_customizer(Box::new(last_connect_error.clone()))
            .build_unchecked(manager);
        PgPool {
            pool,
            last_connect_error,
            generation,
            deadline,
        }
    }

    /// A connection, never one of a retired generation (those are closed on the way).
    pub async fn get(&self) -> Result<bb8::PooledConnection<'_, PgManager>, StoreError> {
        loop {
            let conn = self.pool.get().await.map_err(|err| self.explain(err))?;
            if !self.generation.is_retired(&conn) {
                return Ok(conn);
            }
        }
    }

    /// [`PgPool::get`], for holding the connection beyond the pool's borrow.
    pub async fn get_owned(&self) -> Result<bb8::PooledConnection<'static, PgManager>, StoreError> {
        loop {
            let conn = self
                .pool
                .get_owned()
                .await
                .map_err(|err| self.explain(err))?;
            if !self.generation.is_retired(&conn) {
                return Ok(conn);
            }
        }
    }

    /// The deadline of one transaction (`database.statement_timeout_ms`).
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Runs `work` — a transaction, from taking its connection to its commit — under the
    /// pool's deadline. When the deadline passes, the work is dropped where it waits: its
    /// connection, inside a transaction, is poisoned and closed (see
    /// [`PgTransaction`](super::PgTransaction)), and the error is [`StoreError::TimedOut`]. When
    /// the work timed out or failed with a [session fault](StoreError::is_session_fault), every
    /// connection opened before now is retired: a hung or read-only server makes all of its
    /// sessions so, and the retry must run on a fresh one, not on the next stale one.
    pub async fn within_deadline<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(self.deadline, work).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::TimedOut(self.deadline)),
        };
        if let Err(err) = &result {
            if err.is_session_fault() {
                self.retire_connections();
            }
        }
        result
    }

    /// Retires every connection opened so far: idle ones are closed when next taken, those in
    /// use when they are given back.
    pub fn retire_connections(&self) {
        self.generation.retire();
    }
    fn explain(&self, err: bb8::RunError<tokio_postgres::Error>) -> StoreError {
        match (err, self.last_connect_error.get()) {
            (bb8::RunError::TimedOut, Some(reason)) => StoreError::Unavailable(format!(
                "timed out waiting for a connection; the last attempt failed: {reason}"
            )),
            (err, _) => err.into(),
        }
    }
}

/// Which connections may still be used. Every connection carries the generation it was opened
/// in; retiring bumps the pool's generation, and a connection of an older one is closed rather
/// than reused (bb8 asks [`PgManager::has_broken`] when it is given back; [`PgPool::get`] skips
/// it when it is taken from the idle set, where bb8 would not look).
#[derive(Debug, Clone, Default)]
pub(crate) struct Generation(Arc<AtomicU64>);

impl Generation {
    fn current(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn retire(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    fn is_retired(&self, conn: &PgConnection) -> bool {
        conn.generation < self.current()
    }
}

/// Why the pool's last attempt to connect failed; cleared by the next connection made.
#[derive(Debug, Clone, Default)]
struct ConnectErrorSlot(Arc<Mutex<Option<String>>>);

impl ConnectErrorSlot {
    fn get(&self) -> Option<String> {
        self.0.lock().unwrap().clone()
    }
}

impl bb8::ErrorSink<tokio_postgres::Error> for ConnectErrorSlot {
    fn sink(&self, error: tokio_postgres::Error) {
        *self.0.lock().unwrap() = Some(super::error::describe(&error));
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<tokio_postgres::Error>> {
        Box::new(self.clone())
    }
}

impl bb8::CustomizeConnection<PgConnection, tokio_postgres::Error> for ConnectErrorSlot {
    fn on_acquire<'a>(
        &'a self,
        _connection: &'a mut PgConnection,
    ) -> Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a>> {
        *self.0.lock().unwrap() = None;
        Box::pin(async { Ok(()) })
    }
}

/// A pooled connection: the client, its prepared statements, and whether it must be discarded.
pub struct PgConnection {
    pub client: Client,
    statements: Option<Statements>,
    /// Set when the connection may be left inside a transaction (a transaction dropped before
    /// Commit or Rollback finished). Such a connection is closed, never reused.
    pub(crate) poisoned: bool,
    /// The pool's [`Generation`] when it was opened.
    generation: u64,
}

impl PgConnection {
    /// The prepared statements, prepared on first use: the tables may not exist yet when the
    /// connection is made (before migrations).
    pub async fn statements(&mut self) -> Result<&Statements, tokio_postgres::Error> {
        if self.statements.is_none() {
            self.statements = Some(Statements::prepare(&self.client).await?);
        }
        Ok(self.statements.as_ref().expect("prepared above"))
    }
}

/// The statements of the hot path, prepared once per connection.
pub struct Statements {
    pub try_inbox: Statement,
    pub save_history: Statement,
    pub try_inbox_batch: Statement,
    pub save_history_batch: Statement,
    pub claim_and_save_batch: Statement,
    pub insert_dead_letters: Statement,
    pub load_history: Statement,
    pub load_dead_letter_payloads: Statement,
}

impl Statements {
    async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        let (
            try_inbox,
            save_history,
            try_inbox_batch,
            save_history_batch,
            claim_and_save_batch,
            insert_dead_letters,
            load_history,
            load_dead_letter_payloads,
        ) = futures::try_join!(
            client.prepare(
                "INSERT INTO inbox (event_id) VALUES ($1) \
                 ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
            ),
            client.prepare(
                "INSERT INTO history_events \
                 (event_id, ticket_id, from_status, to_status, changed_at) \
                 VALUES ($1, $2, $3, $4, $5)"
            ),
            // Sorted (by bytes, the key columns' order) so that concurrent batches lock markers in
            // one order and cannot deadlock.
            client.prepare(
                "INSERT INTO inbox (event_id) \
                 SELECT id FROM unnest($1::text[]) AS input(id) ORDER BY id COLLATE \"C\" \
                 ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
            ),
            client.prepare(
                "INSERT INTO history_events \
                 (event_id, ticket_id, from_status, to_status, changed_at) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], \
                 $5::timestamptz[])"
            ),
            // A batch in one statement: the markers claimed (sorted, as above), and the rows of
            // the events whose marker was claimed, in key order too (neighbouring index pages
            // are touched one after another). The foreign key is checked at the end of the
            // statement, when the markers are there. It answers the events whose marker was
            // already there — the redeliveries, a few — rather than every row written: PostgreSQL
            // then sends, and the service reads, a row per duplicate instead of one per event.
            // (A data-modifying WITH runs to completion whether or not the query reads it.)
            client.prepare(
                "WITH input AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], \
                 $4::text[], $5::timestamptz[]) \
                 AS input(event_id, ticket_id, from_status, to_status, changed_at)), \
                 claimed AS (INSERT INTO inbox (event_id) \
                 SELECT event_id FROM input ORDER BY event_id COLLATE \"C\" \
                 ON CONFLICT (event_id) DO NOTHING RETURNING event_id), \
                 saved AS (INSERT INTO history_events \
                 (event_id, ticket_id, from_status, to_status, changed_at) \
                 SELECT input.* FROM input JOIN claimed USING (event_id) \
                 ORDER BY event_id COLLATE \"C\") \
                 SELECT input.event_id, stored.ticket_id, stored.from_status, stored.to_status, \
                 stored.changed_at FROM input LEFT JOIN LATERAL \
                 (SELECT * FROM history_events AS row WHERE row.event_id = input.event_id \
                 LIMIT 1) AS stored ON true \
                 WHERE NOT EXISTS (SELECT FROM claimed WHERE claimed.event_id = input.event_id)"
            ),
            client.prepare(
                "INSERT INTO dead_letters (topic, partition, \"offset\", record_key, payload, \
                 reason_code, reason, field, record_timestamp) \
                 SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::bytea[], \
                 $5::bytea[], $6::text[], $7::text[], $8::text[], $9::timestamptz[]) \
                 ON CONFLICT (topic, partition, \"offset\") DO NOTHING \
                 RETURNING topic, partition, \"offset\""
            ),
            client.prepare(
                "SELECT event_id, ticket_id, from_status, to_status, changed_at \
                 FROM history_events WHERE event_id = ANY($1::text[])"
            ),
            client.prepare(
                "SELECT topic, partition, \"offset\", payload FROM dead_letters \
                 WHERE (topic, partition, \"offset\") IN \
                 (SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[]))"
            ),
        )?;
        Ok(Statements {
            try_inbox,
            save_history,
            try_inbox_batch,
            save_history_batch,
            claim_and_save_batch,
            insert_dead_letters,
            load_history,
            load_dead_letter_payloads,
        })
    }
}

/// bb8-postgres's manager (plain or TLS), plus the prepared statements, the poisoned flag and
/// the generation.
pub struct PgManager {
    inner: Manager,
    limits: SessionLimits,
    generation: Generation,
}

enum Manager {
    Plain(PostgresConnectionManager<NoTls>),
    Tls(PostgresConnectionManager<MakeTlsConnector>),
}

/// The session setting every pooled connection starts with.
///
/// Plan each execution for the data as it is then: a generic plan cached while the tables
/// were small keeps scanning them whole once they hold millions of rows (the lookup of stored
/// events behind conflict detection did: 20 ms per batch at 200,000). It is a startup option
/// rather than a `SET`: a `SET` issued inside a transaction is undone by its rollback (a first
/// batch of only duplicates is rolled back), and no code path can lose a startup option.
///
/// The one exception is the batch transaction ([`super::repository::BATCH_TRANSACTION`]): it
/// sets `auto` for itself alone, because the setting also makes PostgreSQL re-plan the
/// foreign-key check it runs for every history row, and that statement's plan never changes.
pub(crate) const PLAN_CACHE_OPTION: &str = "-c plan_cache_mode=force_custom_plan";

/// `config` with [`PLAN_CACHE_OPTION`] added to whatever options the URL already gives.
pub(crate) fn with_plan_cache_option(config: tokio_postgres::Config) -> tokio_postgres::Config {
    with_options(config, PLAN_CACHE_OPTION)
}

/// `config` with `added` after whatever options it already has (the later setting wins).
fn with_options(mut config: tokio_postgres::Config, added: &str) -> tokio_postgres::Config {
    let options = match config.get_options() {
        Some(existing) if !existing.trim().is_empty() => format!("{existing} {added}"),
        _ => added.to_owned(),
    };
    config.options(options);
    config
}

impl PgManager {
    /// Connections with [`PLAN_CACHE_OPTION`] and the server's side of `limits` as startup
    /// options (a startup option cannot be lost to a rollback).
    pub fn new(config: tokio_postgres::Config, tls: PgTls, limits: SessionLimits) -> Self {
        let config = with_options(with_plan_cache_option(config), &limits.startup_options());
        let inner = match tls {
            PgTls::Plain => Manager::Plain(PostgresConnectionManager::new(config, NoTls)),
            PgTls::Tls(tls) => Manager::Tls(PostgresConnectionManager::new(config, tls)),
        };
        PgManager {
            inner,
            limits,
            generation: Generation::default(),
        }
    }
}

impl bb8::ManageConnection for PgManager {
    type Connection = PgConnection;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<PgConnection, tokio_postgres::Error> {
        // Read before connecting: a connection that was being opened while the pool retired its
        // generation belongs to the retired one.
        let generation = self.generation.current();
        let client = match &self.inner {
            Manager::Plain(manager) => manager.connect().await?,
            Manager::Tls(manager) => manager.connect().await?,
        };
        Ok(PgConnection {
            client,
            statements: None,
            poisoned: false,
            generation,
        })
    }

    async fn is_valid(&self, conn: &mut PgConnection) -> Result<(), tokio_postgres::Error> {
        conn.client.simple_query("").await.map(|_| ())
    }

    fn has_broken(&self, conn: &mut PgConnection) -> bool {
        conn.poisoned || conn.client.is_closed() || self.generation.is_retired(conn)
    }
}
