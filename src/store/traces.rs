//! Which traces of resolved records the database holds ([`crate::domain::traces`]): inbox
//! markers by `event_id`, dead letters by their coordinates.

use std::collections::HashSet;

use super::pool::{PgPool, StoreError};
use crate::domain::TopicPartition;
use crate::domain::traces::Found;

/// Of these markers and of the dead letters at these offsets of `tp`, the ones stored. Runs
/// under the pool's deadline.
pub(crate) async fn found(
    pool: &PgPool,
    tp: &TopicPartition,
    markers: &[&str],
    dead_letters: &[i64],
) -> Result<Found, StoreError> {
    pool.within_deadline(async {
        let conn = pool.get().await?;
        let markers: HashSet<String> = conn
            .client
            .query(
                "SELECT event_id FROM inbox WHERE event_id = ANY($1::text[])",
                &[&markers],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let dead_letters: HashSet<i64> = conn
            .client
            .query(
                "SELECT \"offset\" FROM dead_letters \
                 WHERE topic = $1 AND partition = $2 AND \"offset\" = ANY($3::bigint[])",
                &[&&*tp.topic, &tp.partition, &dead_letters],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        Ok(Found {
            markers,
            dead_letters,
        })
    })
    .await
}
