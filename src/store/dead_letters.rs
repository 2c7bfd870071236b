//! The dead-letter table: records that can never be recorded, kept with their raw bytes and
//! the reason, so that a poison record neither blocks its partition nor disappears.

use std::collections::{HashMap, HashSet};

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::pool::{PgPool, StoreError};
pub use crate::domain::DeadLetter;

/// One dead letter with its record's coordinates.
#[derive(Clone)]
pub struct DeadLetterRow<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub letter: &'a DeadLetter,
}

/// What storing a set of dead letters did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InsertOutcome {
    /// Letters stored by this call.
    pub new: usize,
    /// Indexes of letters whose coordinates were already taken by a letter with other bytes
    /// (a topic deleted and recreated reuses offsets). The stored letter is kept.
    pub conflicts: Vec<usize>,
}

/// Stores dead letters in one statement; a letter already stored for the same
/// (topic, partition, offset) is left as it is — a redelivery writes nothing new.
pub async fn insert(
    pool: &PgPool,
    rows: &[DeadLetterRow<'_>],
) -> Result<InsertOutcome, StoreError> {
    if rows.is_empty() {
        return Ok(InsertOutcome::default());
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
        .query(
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
    let inserted: HashSet<(String, i32, i64)> = inserted
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    let existing: Vec<usize> = (0..rows.len())
        .filter(|&i| !inserted.contains(&(topics[i].to_owned(), partitions[i], offsets[i])))
        .collect();
    if existing.is_empty() {
        return Ok(InsertOutcome {
            new: inserted.len(),
            conflicts: Vec::new(),
        });
    }
    let statement = conn.statements().await?.load_dead_letter_payloads.clone();
    let e_topics: Vec<&str> = existing.iter().map(|&i| topics[i]).collect();
    let e_partitions: Vec<i32> = existing.iter().map(|&i| partitions[i]).collect();
    let e_offsets: Vec<i64> = existing.iter().map(|&i| offsets[i]).collect();
    let stored: HashMap<(String, i32, i64), Option<Vec<u8>>> = conn
        .client
        .query(&statement, &[&e_topics, &e_partitions, &e_offsets])
        .await?
        .iter()
        .map(|row| ((row.get(0), row.get(1), row.get(2)), row.get(3)))
        .collect();
    let conflicts = existing
        .into_iter()
        .filter(|&i| {
            let key = (topics[i].to_owned(), partitions[i], offsets[i]);
            stored
                .get(&key)
                .is_some_and(|payload| payload.as_deref() != payloads[i])
        })
        .collect();
    Ok(InsertOutcome {
        new: inserted.len(),
        conflicts,
    })
}

/// Marks these letters as to be published to `topic` (the relay then publishes them), unless
/// an earlier delivery already did: a redelivered poison record is not published twice.
pub async fn request_publication(
    pool: &PgPool,
    rows: &[DeadLetterRow<'_>],
    topic: &str,
) -> Result<u64, StoreError> {
    let conn = pool.get().await?;
    let (topics, partitions, offsets) = coordinates(rows);
    // `publish_to IS NULL` also keeps this from waiting on a row the relay holds locked.
    Ok(conn
        .client
        .execute(
            "UPDATE dead_letters SET publish_to = $4 \
             WHERE (topic, partition, \"offset\") IN \
             (SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[])) \
             AND publish_to IS NULL AND published_at IS NULL",
            &[&topics, &partitions, &offsets, &topic],
        )
        .await?)
}

/// A stored dead letter waiting to be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingLetter {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub reason_code: String,
    pub reason: String,
}

/// What one round of publishing did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishRound {
    /// Letters claimed by the round (at most the limit).
    pub pending: usize,
    pub published: usize,
    pub failed: usize,
}

/// How a round claims letters and sets aside the ones that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishPolicy {
    /// How long a claim keeps other rounds (other replicas, an operator's `dead-letters
    /// publish`) off the claimed letters: longer than the round's bounded wait on the broker.
    pub lease: Duration,
    /// A letter that failed waits a time drawn under `retry_initial`, doubling with each
    /// failed attempt up to `retry_max`, before a round takes it again.
    pub retry_initial: Duration,
    pub retry_max: Duration,
    /// Take letters that are still waiting out their backoff too (an operator asking now).
    pub ignore_backoff: bool,
}

/// Publishes up to `limit` letters pending for `topic`, through `publish` (one result per
/// letter), and records how each went. No transaction is open while `publish` runs:
///
/// 1. a short transaction claims the letters (`FOR UPDATE SKIP LOCKED`, then a claim until
///    now + `lease`): several replicas, or an operator's `dead-letters publish`, never publish
///    the same letter at once;
/// 2. `publish` runs — the caller bounds its wait on the broker below the lease;
/// 3. a short transaction marks the published letters, and sets the failed ones aside with
///    their reason (`publish_attempts`, `publish_error`) until their backoff is over.
///
/// Letters that failed least go first, oldest first among equals, and a letter waiting out its
/// backoff is not taken: letters the topic refuses for good (too large) never hold back others.
pub async fn publish_pending<F, Fut>(
    pool: &PgPool,
    topic: &str,
    limit: i64,
    policy: PublishPolicy,
    publish: F,
) -> Result<PublishRound, StoreError>
where
    F: FnOnce(Vec<PendingLetter>) -> Fut,
    Fut: std::future::Future<Output = Vec<Result<(), String>>>,
{
    let pending = claim(pool, topic, limit, policy).await?;
    if pending.is_empty() {
        return Ok(PublishRound::default());
    }
    let results = publish(pending.clone()).await;
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for (letter, result) in pending.iter().zip(results) {
        match result {
            Ok(()) => ok.push(letter),
            Err(error) => failed.push((letter, error)),
        }
    }
    let round = PublishRound {
        pending: pending.len(),
        published: ok.len(),
        failed: failed.len(),
    };
    record_outcomes(pool, &ok, &failed, policy).await?;
    Ok(round)
}

/// Step 1 of [`publish_pending`]: claims the letters in one statement (its own transaction).
/// Each step runs under the pool's deadline (`database.statement_timeout_ms`): a round on a
/// connection that hangs ends as `TimedOut`, and the pool replaces its connections.
async fn claim(
    pool: &PgPool,
    topic: &str,
    limit: i64,
    policy: PublishPolicy,
) -> Result<Vec<PendingLetter>, StoreError> {
    let lease_ms = policy.lease.as_millis() as f64;
    let rows = pool
        .within_deadline(async {
            let conn = pool.get().await?;
            Ok(conn
                .client
                .query(
                    "WITH claimable AS ( \
                 SELECT topic, partition, \"offset\", publish_attempts, first_seen \
                 FROM dead_letters \
                 WHERE publish_to = $1 AND published_at IS NULL \
                   AND (publish_claimed_until IS NULL OR publish_claimed_until <= now()) \
                   AND ($4 OR publish_next_at IS NULL OR publish_next_at <= now()) \
                 ORDER BY publish_attempts, first_seen, topic, partition, \"offset\" LIMIT $2 \
                 FOR UPDATE SKIP LOCKED) \
             UPDATE dead_letters AS d \
             SET publish_claimed_until = now() + $3 * interval '1 millisecond' \
             FROM claimable AS c \
             WHERE (d.topic, d.partition, d.\"offset\") = (c.topic, c.partition, c.\"offset\") \
             RETURNING d.topic, d.partition, d.\"offset\", d.record_key, d.payload, \
                       d.reason_code, d.reason, c.publish_attempts, c.first_seen",
                    &[&topic, &limit, &lease_ms, &policy.ignore_backoff],
                )
                .await?)
        })
        .await?;
    let mut claimed: Vec<(i32, DateTime<Utc>, PendingLetter)> = rows
        .iter()
        .map(|row| {
            let letter = PendingLetter {
                topic: row.get(0),
                partition: row.get(1),
                offset: row.get(2),
                key: row.get(3),
                payload: row.get(4),
                reason_code: row.get(5),
                reason: row.get(6),
            };
            (row.get(7), row.get(8), letter)
        })
        .collect();
    claimed.sort_by(|a, b| {
        (a.0, a.1, &a.2.topic, a.2.partition, a.2.offset).cmp(&(
            b.0,
            b.1,
            &b.2.topic,
            b.2.partition,
            b.2.offset,
        ))
    });
    Ok(claimed.into_iter().map(|(_, _, letter)| letter).collect())
}

/// Step 3 of [`publish_pending`]: one short transaction; each claim is released.
async fn record_outcomes(
    pool: &PgPool,
    ok: &[&PendingLetter],
    failed: &[(&PendingLetter, String)],
    policy: PublishPolicy,
) -> Result<(), StoreError> {
    let column = |letters: &[&PendingLetter]| {
        (
            letters.iter().map(|l| l.topic.clone()).collect::<Vec<_>>(),
            letters.iter().map(|l| l.partition).collect::<Vec<_>>(),
            letters.iter().map(|l| l.offset).collect::<Vec<_>>(),
        )
    };
    pool.within_deadline(async {
        let mut conn = pool.get().await?;
        let tx = conn.client.transaction().await?;
        if !ok.is_empty() {
            let (topics, partitions, offsets) = column(ok);
            tx.execute(
                "UPDATE dead_letters SET published_at = now(), publish_error = NULL, \
                 publish_claimed_until = NULL, publish_next_at = NULL \
             WHERE (topic, partition, \"offset\") IN \
             (SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[]))",
                &[&topics, &partitions, &offsets],
            )
            .await?;
        }
        if !failed.is_empty() {
            let letters: Vec<&PendingLetter> = failed.iter().map(|(letter, _)| *letter).collect();
            let (topics, partitions, offsets) = column(&letters);
            let errors: Vec<&str> = failed.iter().map(|(_, error)| error.as_str()).collect();
            let initial_ms = policy.retry_initial.as_millis() as f64;
            let max_ms = policy.retry_max.as_millis() as f64;
            // The ceiling doubles per failed attempt (the exponent capped, so it cannot
            // overflow), and each letter's wait is drawn under it: full jitter, so letters that
            // failed together (a topic refusing them all) are not retried together.
            tx.execute(
                "UPDATE dead_letters AS d \
             SET publish_attempts = d.publish_attempts + 1, publish_error = f.error, \
                 publish_claimed_until = NULL, \
                 publish_next_at = now() + least($5, $6 * power(2, least(d.publish_attempts, 30))) \
                     * random() * interval '1 millisecond' \
             FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[]) \
                  AS f(topic, partition, \"offset\", error) \
             WHERE (d.topic, d.partition, d.\"offset\") = (f.topic, f.partition, f.\"offset\")",
                &[
                    &topics,
                    &partitions,
                    &offsets,
                    &errors,
                    &max_ms,
                    &initial_ms,
                ],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    })
    .await
}

/// How long until the next letter pending for `topic` becomes claimable (its backoff or its
/// claim over; zero if one is already), by the database's clock; `None` when nothing is
/// pending.
pub async fn next_due(pool: &PgPool, topic: &str) -> Result<Option<Duration>, StoreError> {
    let row = pool
        .within_deadline(async {
            let conn = pool.get().await?;
            Ok(conn
                .client
                .query_one(
                    "SELECT extract(epoch FROM min(greatest(coalesce(publish_next_at, now()), \
                                                    coalesce(publish_claimed_until, now()))) \
                                   - now())::float8 \
             FROM dead_letters WHERE publish_to = $1 AND published_at IS NULL",
                    &[&topic],
                )
                .await?)
        })
        .await?;
    let seconds: Option<f64> = row.get(0);
    Ok(seconds.map(|seconds| Duration::from_secs_f64(seconds.max(0.0))))
}

fn coordinates<'a>(rows: &[DeadLetterRow<'a>]) -> (Vec<&'a str>, Vec<i32>, Vec<i64>) {
    (
        rows.iter().map(|r| r.topic).collect(),
        rows.iter().map(|r| r.partition).collect(),
        rows.iter().map(|r| r.offset).collect(),
    )
}

/// A stored dead letter, as `dead-letters list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDeadLetter {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub reason_code: String,
    pub reason: String,
    pub first_seen: DateTime<Utc>,
    pub replayed_at: Option<DateTime<Utc>>,
    /// The dead-letter topic it is to be published to, if one was configured.
    pub publish_to: Option<String>,
    pub published_at: Option<DateTime<Utc>>,
    pub publish_attempts: i32,
    pub publish_error: Option<String>,
}

/// Which dead letters to list or replay.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterFilter {
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    pub reason_code: Option<String>,
    /// Include letters already replayed.
    pub include_replayed: bool,
    pub limit: i64,
}

/// Dead letters matching the filter, oldest coordinates first.
pub async fn list(
    client: &tokio_postgres::Client,
    filter: &DeadLetterFilter,
) -> Result<Vec<StoredDeadLetter>, StoreError> {
    let rows = client
        .query(
            "SELECT topic, partition, \"offset\", record_key, payload, reason_code, reason, \
             first_seen, replayed_at, publish_to, published_at, publish_attempts, publish_error \
             FROM dead_letters \
             WHERE ($1::text IS NULL OR topic = $1) \
               AND ($2::int IS NULL OR partition = $2) \
               AND ($3::bigint IS NULL OR \"offset\" = $3) \
               AND ($4::text IS NULL OR reason_code = $4) \
               AND ($5 OR replayed_at IS NULL) \
             ORDER BY topic, partition, \"offset\" LIMIT $6",
            &[
                &filter.topic,
                &filter.partition,
                &filter.offset,
                &filter.reason_code,
                &filter.include_replayed,
                &filter.limit,
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| StoredDeadLetter {
            topic: row.get(0),
            partition: row.get(1),
            offset: row.get(2),
            key: row.get(3),
            payload: row.get(4),
            reason_code: row.get(5),
            reason: row.get(6),
            first_seen: row.get(7),
            replayed_at: row.get(8),
            publish_to: row.get(9),
            published_at: row.get(10),
            publish_attempts: row.get(11),
            publish_error: row.get(12),
        })
        .collect())
}

/// Counts of dead letters per reason code.
pub async fn count_by_reason(
    client: &tokio_postgres::Client,
) -> Result<Vec<(String, i64)>, StoreError> {
    let rows = client
        .query(
            "SELECT reason_code, count(*) FROM dead_letters GROUP BY 1 ORDER BY 2 DESC, 1",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// Marks a dead letter as replayed now.
pub async fn mark_replayed(
    client: &tokio_postgres::Client,
    letter: &StoredDeadLetter,
) -> Result<(), StoreError> {
    client
        .execute(
            "UPDATE dead_letters SET replayed_at = now() \
             WHERE topic = $1 AND partition = $2 AND \"offset\" = $3",
            &[&letter.topic, &letter.partition, &letter.offset],
        )
        .await?;
    Ok(())
}
