//! The PostgreSQL implementation of `domain::HistoryRepository`: one pooled connection per
//! transaction, prepared statements, set-based batch statements.

use bb8::PooledConnection;
use chrono::{DateTime, FixedOffset};

use super::pool::{PgManager, PgPool, StoreError};
use foldhash::fast::RandomState;

use crate::domain::{Claim, HistoryEvent, HistoryRepository, HistoryTransaction};

/// Opens transactions on connections of the pool.
#[derive(Clone)]
pub struct PgHistoryRepository {
    pool: PgPool,
}

impl PgHistoryRepository {
    pub fn new(pool: PgPool) -> Self {
        PgHistoryRepository { pool }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

impl HistoryRepository for PgHistoryRepository {
    type Error = StoreError;
    type Tx = PgTransaction;

    /// Takes a connection for a transaction. A database outage shows up here, as a pool
    /// time-out. `BEGIN` is sent before the first statement that needs it (a batch written in
    /// one statement needs none).
    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        let mut conn = self.pool.get_owned().await?;
        // Marked before anything is sent: from here until Commit or Rollback completes, the
        // connection may be inside a transaction and must not go back to the pool as it is.
        conn.poisoned = true;
        Ok(PgTransaction {
            conn,
            state: TxState::NotBegun,
        })
    }
}

/// How a batch's transaction starts. The session plans every statement for the data at hand
/// (see `super::pool::PLAN_CACHE_OPTION`), and that includes the foreign-key check PostgreSQL
/// runs for each history row: planned anew per row, it cost about 7 µs of the server's CPU per
/// event. The batch statement's own plan does not depend on the tables' sizes (it reads only
/// its input), so this transaction lets cached plans be reused; the setting ends with it.
pub const BATCH_TRANSACTION: &str = "BEGIN; SET LOCAL plan_cache_mode = auto";

/// Where a [`PgTransaction`] stands on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxState {
    /// Nothing sent yet.
    NotBegun,
    /// `BEGIN` was sent: Commit and Rollback end the transaction.
    Open,
    /// One self-contained statement ran without `BEGIN` (the server committed it on its own,
    /// if it succeeded): there is nothing left to commit or roll back.
    Finished,
}

/// One open transaction, holding its connection.
///
/// Dropped before Commit or Rollback completed (a cancelled future, a panic), it leaves its
/// connection poisoned: the pool closes it, and PostgreSQL aborts the transaction with the
/// session. A transaction can therefore never leak into another use of the connection.
pub struct PgTransaction {
    conn: PooledConnection<'static, PgManager>,
    state: TxState,
}

impl PgTransaction {
    /// Sends `BEGIN` if the transaction has not begun (a statement after a self-contained one
    /// would run in a transaction of its own).
    async fn open(&mut self) -> Result<(), StoreError> {
        if self.state != TxState::Open {
            self.conn.client.batch_execute("BEGIN").await?;
            self.state = TxState::Open;
        }
        Ok(())
    }

    async fn end(&mut self, statement: &str) -> Result<(), StoreError> {
        if self.state == TxState::Open {
            self.conn.client.batch_execute(statement).await?;
        }
        self.state = TxState::Finished;
        self.conn.poisoned = false;
        Ok(())
    }
}

impl HistoryTransaction for PgTransaction {
    type Error = StoreError;

    async fn try_inbox(&mut self, event_id: &str) -> Result<bool, StoreError> {
        self.open().await?;
        let statement = self.conn.statements().await?.try_inbox.clone();
        let row = self.conn.client.query_opt(&statement, &[&event_id]).await?;
        Ok(row.is_some())
    }

    async fn try_inbox_batch(&mut self, event_ids: &[&str]) -> Result<Vec<bool>, StoreError> {
        self.open().await?;
        let statement = self.conn.statements().await?.try_inbox_batch.clone();
        let rows = self.conn.client.query(&statement, &[&event_ids]).await?;
        let inserted: std::collections::HashSet<&str> =
            rows.iter().map(|row| row.get::<_, &str>(0)).collect();
        Ok(event_ids.iter().map(|id| inserted.contains(id)).collect())
    }

    async fn save_history(&mut self, event: &HistoryEvent) -> Result<(), StoreError> {
        self.open().await?;
        let statement = self.conn.statements().await?.save_history.clone();
        self.conn
            .client
            .execute(
                &statement,
                &[
                    &event.event_id,
                    &event.ticket_id,
                    &event.from_status,
                    &event.to_status,
                    &event.changed_at,
                ],
            )
            .await?;
        Ok(())
    }

    async fn save_history_batch(&mut self, events: &[&HistoryEvent]) -> Result<(), StoreError> {
        self.open().await?;
        let statement = self.conn.statements().await?.save_history_batch.clone();
        let columns = Columns::of(events);
        self.conn
            .client
            .execute(&statement, &columns.params())
            .await?;
        Ok(())
    }

    /// One round trip: `BEGIN` (with the plan setting of [`BATCH_TRANSACTION`]), the batch in
    /// one statement and `COMMIT` are sent together. The Commit that follows has nothing left to
    /// do. Any of the three failing makes the outcome Unknown (a `COMMIT` after a failed
    /// statement is a silent rollback, so the statement's own result is what counts); and were
    /// `BEGIN` to fail, the statement would still be atomic on its own.
    async fn claim_and_save_batch(
        &mut self,
        events: &[&HistoryEvent],
    ) -> Result<Vec<Claim>, StoreError> {
        let statement = self.conn.statements().await?.claim_and_save_batch.clone();
        let columns = Columns::of(events);
        let params = columns.params();
        let rows = if self.state == TxState::NotBegun {
            let client = &self.conn.client;
            // Requests go out in the order the futures are first polled: join! polls in order.
            let (begun, rows, committed) = futures::join!(
                client.batch_execute(BATCH_TRANSACTION),
                client.query(&statement, &params),
                client.batch_execute("COMMIT"),
            );
            self.state = TxState::Finished;
            begun?;
            let rows = rows?;
            committed?;
            rows
        } else {
            self.conn.client.query(&statement, &params).await?
        };
        // The statement answers the events whose marker was already there, each with its stored
        // row as the statement's snapshot sees it (not one another transaction committed while
        // this one waited on its marker): read here, a redelivery is compared with what is
        // stored without a round trip of its own.
        if rows.is_empty() {
            return Ok(vec![Claim::New; events.len()]);
        }
        let mut already: std::collections::HashMap<&str, Option<HistoryEvent>, RandomState> =
            std::collections::HashMap::with_capacity_and_hasher(rows.len(), RandomState::default());
        for row in &rows {
            let event_id: &str = row.get(0);
            let stored = row
                .get::<_, Option<String>>(1)
                .map(|ticket_id| history_event(event_id.to_owned(), ticket_id, row, 2));
            already.insert(event_id, stored);
        }
        Ok(events
            .iter()
            .map(|event| match already.remove(event.event_id.as_str()) {
                Some(stored) => Claim::Stored(stored),
                None => Claim::New,
            })
            .collect())
    }

    async fn commit(&mut self) -> Result<(), StoreError> {
        self.end("COMMIT").await
    }

    async fn rollback(&mut self) -> Result<(), StoreError> {
        self.end("ROLLBACK").await
    }
}

/// The events of a batch as one array per column, the parameters of the batch statements.
struct Columns<'a> {
    event_ids: Vec<&'a str>,
    ticket_ids: Vec<&'a str>,
    from: Vec<&'a str>,
    to: Vec<&'a str>,
    changed_at: Vec<DateTime<FixedOffset>>,
}

impl<'a> Columns<'a> {
    fn of(events: &[&'a HistoryEvent]) -> Self {
        let column = |get: fn(&'a HistoryEvent) -> &'a str| -> Vec<&'a str> {
            events.iter().map(|&event| get(event)).collect()
        };
        Columns {
            event_ids: column(|e| &e.event_id),
            ticket_ids: column(|e| &e.ticket_id),
            from: column(|e| &e.from_status),
            to: column(|e| &e.to_status),
            changed_at: events.iter().map(|event| event.changed_at).collect(),
        }
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 5] {
        [
            &self.event_ids,
            &self.ticket_ids,
            &self.from,
            &self.to,
            &self.changed_at,
        ]
    }
}

/// The stored history rows of these events, by `event_id` (for telling a redelivery from a
/// conflicting duplicate: same `event_id`, different content).
pub async fn load_events(
    pool: &PgPool,
    event_ids: &[&str],
) -> Result<std::collections::HashMap<String, HistoryEvent>, StoreError> {
    let mut conn = pool.get().await?;
    let statement = conn.statements().await?.load_history.clone();
    let rows = conn.client.query(&statement, &[&event_ids]).await?;
    Ok(rows
        .iter()
        .map(|row| {
            let event = history_event(row.get(0), row.get(1), row, 2);
            (event.event_id.clone(), event)
        })
        .collect())
}

/// A stored history row: its id and ticket, then from column `rest` on the statuses and the
/// time of the change.
fn history_event(
    event_id: String,
    ticket_id: String,
    row: &tokio_postgres::Row,
    rest: usize,
) -> HistoryEvent {
    let changed_at: DateTime<chrono::Utc> = row.get(rest + 2);
    HistoryEvent {
        event_id,
        ticket_id,
        from_status: row.get(rest),
        to_status: row.get(rest + 1),
        changed_at: changed_at.fixed_offset(),
    }
}
