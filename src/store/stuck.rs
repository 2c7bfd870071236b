//! The `stuck_events` table: each event the database rejects by itself, reported by the
//! replica retrying it, and the operator's request to set one aside. The replica checks in at
//! every retry ([`check_in`]) and learns of a request there; `history-service dead-letters
//! set-aside` makes the request ([`request_set_aside`]) and waits for the replica's answer
//! ([`lookup`]).

use chrono::{DateTime, Utc};

use super::pool::{PgPool, StoreError};
use crate::domain::TopicPartition;

/// What a retrying replica reports of its stuck event.
#[derive(Debug, Clone)]
pub(crate) struct StuckReport<'a> {
    pub tp: &'a TopicPartition,
    pub offset: i64,
    pub event_id: &'a str,
    pub sqlstate: &'a str,
    pub error: &'a str,
    pub replica: &'a str,
}

/// An operator's request to set a stuck event aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetAsideRequest {
    pub by: String,
    pub reason: Option<String>,
    pub at: DateTime<Utc>,
}

/// A row of `stuck_events`, as the operator's command reads it.
#[derive(Debug, Clone)]
pub(crate) struct StuckEvent {
    pub event_id: String,
    pub sqlstate: String,
    pub error: String,
    pub replica: String,
    pub stuck_since: DateTime<Utc>,
    pub request: Option<SetAsideRequest>,
    pub resolved_by: Option<String>,
    pub resolved_at: Option<DateTime<Utc>>,
}

/// Records (or refreshes) the stuck event and answers the operator's pending request to set it
/// aside, if there is one. Under the pool's deadline.
pub(crate) async fn check_in(
    pool: &PgPool,
    report: &StuckReport<'_>,
) -> Result<Option<SetAsideRequest>, StoreError> {
    pool.within_deadline(async {
        let conn = pool.get().await?;
        let row = conn
            .client
            .query_one(
                "INSERT INTO stuck_events \
                     (topic, partition, \"offset\", event_id, sqlstate, error, replica) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (topic, partition, \"offset\") DO UPDATE SET \
                     event_id = EXCLUDED.event_id, sqlstate = EXCLUDED.sqlstate, \
                     error = EXCLUDED.error, replica = EXCLUDED.replica, last_retry_at = now() \
                 RETURNING set_aside_by, set_aside_reason, set_aside_at, resolved_at",
                &[
                    &&*report.tp.topic,
                    &report.tp.partition,
                    &report.offset,
                    &report.event_id,
                    &report.sqlstate,
                    &report.error,
                    &report.replica,
                ],
            )
            .await?;
        let by: Option<String> = row.get(0);
        let at: Option<DateTime<Utc>> = row.get(2);
        let resolved_at: Option<DateTime<Utc>> = row.get(3);
        // A request already answered is not one: a later delivery of the record (a replay, a
        // log moved back) is retried as any other.
        Ok(match (by, at, resolved_at) {
            (Some(by), Some(at), None) => Some(SetAsideRequest {
                by,
                reason: row.get(1),
                at,
            }),
            _ => None,
        })
    })
    .await
}

/// Says the request for this event is answered: it is a dead letter now, stored by `replica`.
pub(crate) async fn resolved(
    pool: &PgPool,
    tp: &TopicPartition,
    offset: i64,
    replica: &str,
) -> Result<(), StoreError> {
    pool.within_deadline(async {
        let conn = pool.get().await?;
        conn.client
            .execute(
                "UPDATE stuck_events SET resolved_by = $4, resolved_at = now() \
                 WHERE topic = $1 AND partition = $2 AND \"offset\" = $3",
                &[&&*tp.topic, &tp.partition, &offset, &replica],
            )
            .await?;
        Ok(())
    })
    .await
}

/// Forgets a stuck event that was written after all (nothing to set aside any more).
pub(crate) async fn written(
    pool: &PgPool,
    tp: &TopicPartition,
    offset: i64,
) -> Result<(), StoreError> {
    pool.within_deadline(async {
        let conn = pool.get().await?;
        conn.client
            .execute(
                "DELETE FROM stuck_events \
                 WHERE topic = $1 AND partition = $2 AND \"offset\" = $3 AND resolved_at IS NULL",
                &[&&*tp.topic, &tp.partition, &offset],
            )
            .await?;
        Ok(())
    })
    .await
}

/// The stuck event at these coordinates, if a replica reported one there.
pub(crate) async fn lookup(
    pool: &PgPool,
    tp: &TopicPartition,
    offset: i64,
) -> Result<Option<StuckEvent>, StoreError> {
    let conn = pool.get().await?;
    let row = conn
        .client
        .query_opt(
            "SELECT event_id, sqlstate, error, replica, stuck_since, set_aside_by, \
                    set_aside_reason, set_aside_at, resolved_by, resolved_at \
             FROM stuck_events WHERE topic = $1 AND partition = $2 AND \"offset\" = $3",
            &[&&*tp.topic, &tp.partition, &offset],
        )
        .await?;
    Ok(row.map(|row| {
        let by: Option<String> = row.get(5);
        let at: Option<DateTime<Utc>> = row.get(7);
        StuckEvent {
            event_id: row.get(0),
            sqlstate: row.get(1),
            error: row.get(2),
            replica: row.get(3),
            stuck_since: row.get(4),
            request: by.zip(at).map(|(by, at)| SetAsideRequest {
                by,
                reason: row.get(6),
                at,
            }),
            resolved_by: row.get(8),
            resolved_at: row.get(9),
        }
    }))
}

/// Asks the replica holding the stuck event to set it aside. The first request stands: asking
/// again changes nothing. `false` if no stuck event is recorded there.
pub(crate) async fn request_set_aside(
    pool: &PgPool,
    tp: &TopicPartition,
    offset: i64,
    by: &str,
    reason: Option<&str>,
) -> Result<bool, StoreError> {
    let conn = pool.get().await?;
    let updated = conn
        .client
        .execute(
            "UPDATE stuck_events \
             SET set_aside_by = COALESCE(set_aside_by, $4), \
                 set_aside_reason = CASE WHEN set_aside_by IS NULL THEN $5 ELSE set_aside_reason END, \
                 set_aside_at = COALESCE(set_aside_at, now()) \
             WHERE topic = $1 AND partition = $2 AND \"offset\" = $3",
            &[&&*tp.topic, &tp.partition, &offset, &by, &reason],
        )
        .await?;
    Ok(updated > 0)
}
