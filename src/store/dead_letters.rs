//! The dead-letter table: records that can never be recorded, kept with their raw bytes and
//! the reason, so that a poison record neither blocks its partition nor disappears.

use chrono::{DateTime, Utc};

use super::pool::{PgPool, StoreError};
use crate::domain::DecodeError;

/// An undecodable record, as it will be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub reason_code: &'static str,
    pub reason: String,
    pub field: Option<&'static str>,
    pub record_timestamp: Option<DateTime<Utc>>,
}

impl DeadLetter {
    pub fn new(
        error: &DecodeError,
        key: Option<Vec<u8>>,
        payload: Option<Vec<u8>>,
        timestamp_ms: Option<i64>,
    ) -> Self {
        DeadLetter {
            key,
            payload,
            reason_code: error.code(),
            reason: error.to_string(),
            field: error.field().map(|field| field.name()),
            record_timestamp: timestamp_ms.and_then(DateTime::<Utc>::from_timestamp_millis),
        }
    }
}

/// One dead letter with its record's coordinates.
pub struct DeadLetterRow<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub letter: &'a DeadLetter,
}

/// Stores dead letters in one statement; a letter already stored for the same
/// (topic, partition, offset) is left as it is. Returns how many were new.
pub async fn insert(pool: &PgPool, rows: &[DeadLetterRow<'_>]) -> Result<u64, StoreError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut conn = pool.get().await?;
    let statement = conn.statements().await?.insert_dead_letters.clone();
    let topics: Vec<&str> = rows.iter().map(|r| r.topic).collect();
    let partitions: Vec<i32> = rows.iter().map(|r| r.partition).collect();
    let offsets: Vec<i64> = rows.iter().map(|r| r.offset).collect();
    let keys: Vec<Option<&[u8]>> = rows.iter().map(|r| r.letter.key.as_deref()).collect();
    let payloads: Vec<Option<&[u8]>> = rows.iter().map(|r| r.letter.payload.as_deref()).collect();
    let codes: Vec<&str> = rows.iter().map(|r| r.letter.reason_code).collect();
    let reasons: Vec<&str> = rows.iter().map(|r| r.letter.reason.as_str()).collect();
    let fields: Vec<Option<&str>> = rows.iter().map(|r| r.letter.field).collect();
    let stamps: Vec<Option<DateTime<Utc>>> =
        rows.iter().map(|r| r.letter.record_timestamp).collect();
    let inserted = conn
        .client
        .execute(
            &statement,
            &[
                &topics,
                &partitions,
                &offsets,
                &keys,
                &payloads,
                &codes,
                &reasons,
                &fields,
                &stamps,
            ],
        )
        .await?;
    Ok(inserted)
}
