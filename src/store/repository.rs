//! The PostgreSQL implementation of the seed's repository: one pooled connection per
//! transaction, prepared statements, set-based batch statements.

use bb8::PooledConnection;
use chrono::{DateTime, FixedOffset};

use super::pool::{PgManager, PgPool, StoreError};
use crate::domain::{HistoryEvent, HistoryRepository, HistoryTransaction};

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

    /// Takes a connection and opens a transaction on it. A database outage shows up here, as a
    /// pool time-out.
    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        let mut conn = self.pool.get_owned().await?;
        // Marked before BEGIN is sent: from here until Commit or Rollback completes, the
        // connection may be inside a transaction and must not go back to the pool as it is.
        conn.poisoned = true;
        conn.client.batch_execute("BEGIN").await?;
        Ok(PgTransaction { conn })
    }
}

/// One open transaction, holding its connection.
///
/// Dropped before Commit or Rollback completed (a cancelled future, a panic), it leaves its
/// connection poisoned: the pool closes it, and PostgreSQL aborts the transaction with the
/// session. A transaction can therefore never leak into another use of the connection.
pub struct PgTransaction {
    conn: PooledConnection<'static, PgManager>,
}

impl PgTransaction {
    async fn end(&mut self, statement: &str) -> Result<(), StoreError> {
        self.conn.client.batch_execute(statement).await?;
        self.conn.poisoned = false;
        Ok(())
    }
}

impl HistoryTransaction for PgTransaction {
    type Error = StoreError;

    async fn try_inbox(&mut self, event_id: &str) -> Result<bool, StoreError> {
        let statement = self.conn.statements().await?.try_inbox.clone();
        let row = self.conn.client.query_opt(&statement, &[&event_id]).await?;
        Ok(row.is_some())
    }

    async fn try_inbox_batch(&mut self, event_ids: &[&str]) -> Result<Vec<bool>, StoreError> {
        let statement = self.conn.statements().await?.try_inbox_batch.clone();
        let rows = self.conn.client.query(&statement, &[&event_ids]).await?;
        let inserted: std::collections::HashSet<&str> =
            rows.iter().map(|row| row.get::<_, &str>(0)).collect();
        Ok(event_ids.iter().map(|id| inserted.contains(id)).collect())
    }

    async fn save_history(&mut self, event: &HistoryEvent) -> Result<(), StoreError> {
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
        let statement = self.conn.statements().await?.save_history_batch.clone();
        let column = |get: fn(&HistoryEvent) -> &str| -> Vec<&str> {
            events.iter().map(|event| get(event)).collect()
        };
        let event_ids = column(|e| &e.event_id);
        let ticket_ids = column(|e| &e.ticket_id);
        let from = column(|e| &e.from_status);
        let to = column(|e| &e.to_status);
        let changed_at: Vec<DateTime<FixedOffset>> =
            events.iter().map(|event| event.changed_at).collect();
        self.conn
            .client
            .execute(
                &statement,
                &[&event_ids, &ticket_ids, &from, &to, &changed_at],
            )
            .await?;
        Ok(())
    }

    async fn commit(&mut self) -> Result<(), StoreError> {
        self.end("COMMIT").await
    }

    async fn rollback(&mut self) -> Result<(), StoreError> {
        self.end("ROLLBACK").await
    }
}

/// The stored history rows of these events, by `event_id` (for telling a redelivery from a
/// conflicting duplicate: same `event_id`, different content).
pub async fn load_events(
    pool: &super::PgPool,
    event_ids: &[&str],
) -> Result<std::collections::HashMap<String, HistoryEvent>, StoreError> {
    let mut conn = pool.get().await?;
    let statement = conn.statements().await?.load_history.clone();
    let rows = conn.client.query(&statement, &[&event_ids]).await?;
    Ok(rows
        .iter()
        .map(|row| {
            let changed_at: DateTime<chrono::Utc> = row.get(4);
            let event = HistoryEvent {
                event_id: row.get(0),
                ticket_id: row.get(1),
                from_status: row.get(2),
                to_status: row.get(3),
                changed_at: changed_at.fixed_offset(),
            };
            (event.event_id.clone(), event)
        })
        .collect())
}
