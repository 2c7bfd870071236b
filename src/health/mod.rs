//! Readiness: whether the service can actually consume and write, as `/readyz` and the
//! `history_ready` gauge report it. Not ready while it starts (migrations, the first
//! connection), while a configured topic is missing, while no Kafka broker answers, before the
//! consumer joined its group, while a partition stands still at a record batch the client cannot
//! decompress, while a partition's committed position is past what the database holds, while
//! every write has kept failing for longer than
//! `pipeline.unready_after_failing_ms`, and while the database does not answer.

pub(crate) mod behind;
pub(crate) mod writes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::kafka::client_health::ClientHealth;
use crate::kafka::topic_watch::MissingTopics;
use crate::metrics::{self, Stats};
use crate::store::{Database, PgPool, StoreError};

pub use behind::DatabaseBehind;
pub use writes::WriteHealth;

/// Shared by the start-up sequence, the consumer's callbacks (joined), the writers (through
/// [`Stats::writes`]) and the HTTP endpoints.
#[derive(Clone)]
pub struct Readiness {
    inner: Arc<Inner>,
}

struct Inner {
    phase: Mutex<Phase>,
    joined: Arc<AtomicBool>,
    /// Configured topics the cluster does not have (the Kafka layer's topic watch keeps it).
    missing_topics: Arc<MissingTopics>,
    /// Brokers unreachable, partitions standing at batches that cannot be decompressed (the
    /// consumer's callbacks keep it).
    client: Arc<ClientHealth>,
    /// Partitions whose committed position is past what the database holds.
    behind: Arc<DatabaseBehind>,
    /// The WARN that the consumer has not joined for long was written.
    told_not_joined: AtomicBool,
    stats: Arc<Stats>,
    unready_after_failing: Duration,
}

enum Phase {
    /// Still starting; why it is not running yet.
    Starting(String),
    /// Running: the pool the writers use, and the database to ask why when it does not answer.
    Running {
        pool: PgPool,
        database: Box<Database>,
        since: Instant,
    },
}

/// How long a consumer may take to join its group before that is more than a slow start: a
/// join takes a heartbeat or two (classic: the group's rebalance, within its session timeout).
pub const NOT_JOINED_TOO_LONG: Duration = Duration::from_secs(30);

/// How long the readiness query may take, then how long the connection attempt that finds out
/// why: together under a Kubernetes probe's 3 s time-out.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);
const WHY_TIMEOUT: Duration = Duration::from_millis(1000);

impl Readiness {
    pub fn new(stats: Arc<Stats>, unready_after_failing: Duration) -> Self {
        Readiness {
            inner: Arc::new(Inner {
                phase: Mutex::new(Phase::Starting("not started yet".to_owned())),
                joined: Arc::new(AtomicBool::new(false)),
                missing_topics: Arc::default(),
                client: Arc::default(),
                behind: Arc::default(),
                told_not_joined: AtomicBool::new(false),
                stats,
                unready_after_failing,
            }),
        }
    }

    /// The flag the consumer's callbacks set once it has joined its group.
    pub fn joined(&self) -> Arc<AtomicBool> {
        self.inner.joined.clone()
    }

    /// The set of configured topics found missing, which the topic watch keeps.
    pub fn missing_topics(&self) -> Arc<MissingTopics> {
        self.inner.missing_topics.clone()
    }

    /// What the consumer's callbacks report of the Kafka client's troubles.
    pub fn client_health(&self) -> Arc<ClientHealth> {
        self.inner.client.clone()
    }

    /// The partitions found behind in the database, which the check at assignment keeps.
    pub fn database_behind(&self) -> Arc<DatabaseBehind> {
        self.inner.behind.clone()
    }

    /// Still starting, for this reason.
    pub fn starting(&self, reason: impl Into<String>) {
        *self.inner.phase.lock().unwrap() = Phase::Starting(reason.into());
    }

    /// Started: from now on readiness asks the database itself.
    pub fn running(&self, pool: PgPool, database: Database) {
        *self.inner.phase.lock().unwrap() = Phase::Running {
            pool,
            database: Box::new(database),
            since: Instant::now(),
        };
    }

    /// Why the service is not ready, or `None` if it is.
    pub async fn not_ready_reason(&self) -> Option<String> {
        let (pool, database, since) = match &*self.inner.phase.lock().unwrap() {
            Phase::Starting(reason) => return Some(format!("starting: {reason}")),
            Phase::Running {
                pool,
                database,
                since,
            } => (pool.clone(), (**database).clone(), *since),
        };
        let missing = self.inner.missing_topics.names();
        if !missing.is_empty() {
            // Nothing is consumed from them: a misspelled name, or a topic not created yet.
            // Said before the group: with no topic to consume, the consumer may never join.
            return Some(format!(
                "topics in kafka.topics do not exist: {} (consumed once created)",
                missing.join(", ")
            ));
        }
        if let Some((down, reason)) = self.inner.client.brokers_down() {
            return Some(format!(
                "no Kafka broker answers ({reason}) for {} s: check kafka.brokers, the network \
                 and the brokers' listeners",
                down.as_secs()
            ));
        }
        if !self.inner.joined.load(Ordering::Relaxed) {
            let waited = since.elapsed();
            if waited < NOT_JOINED_TOO_LONG {
                return Some("the consumer has not joined its group yet".to_owned());
            }
            let reason = format!(
                "the consumer has not joined its group after {} s: the group's coordinator keeps \
                 it out (another replica running with the same kafka.group_instance_id, or a \
                 group of the other kafka.group_protocol that the broker cannot migrate?)",
                waited.as_secs()
            );
            if !self.inner.told_not_joined.swap(true, Ordering::Relaxed) {
                warn!("{reason}");
            }
            return Some(reason);
        }
        let undecodable = self.inner.client.undecodable();
        if !undecodable.is_empty() {
            let partitions: Vec<String> = undecodable
                .iter()
                .map(|(tp, undecodable)| {
                    format!(
                        "{tp} at offset {} ({}: {})",
                        undecodable.failure.offset,
                        undecodable.failure.codec_name(),
                        undecodable.failure.cause
                    )
                })
                .collect();
            return Some(format!(
                "partitions stand still at record batches the Kafka client cannot decompress: \
                 {}; {}",
                partitions.join(", "),
                undecodable[0].1.failure.advice()
            ));
        }
        if let Some((lasting, error)) = self.inner.client.commits_refused(Instant::now()) {
            return Some(format!(
                "every offset commit has been refused for {} s ({error}): the group's \
                 coordinator does not know this member (kafka.group_protocol changed while \
                 members of the other protocol run, or two replicas with one \
                 kafka.group_instance_id?)",
                lasting.as_secs()
            ));
        }
        let behind = self.inner.behind.findings();
        if !behind.is_empty() {
            return Some(format!(
                "the database lacks records the group committed past (restored from a backup, \
                 or emptied?): {}",
                behind.join("; ")
            ));
        }
        if let Some(reason) = self
            .inner
            .stats
            .writes
            .unready_reason(Instant::now(), self.inner.unready_after_failing)
        {
            return Some(reason);
        }
        let probe = async {
            let mut conn = pool.get().await?;
            // Closed rather than reused if the probe is abandoned at its time-out: a connection
            // that did not answer is not given to a writer.
            conn.poisoned = true;
            conn.client.simple_query("SELECT 1").await?;
            conn.poisoned = false;
            Ok::<_, StoreError>(())
        };
        let why = match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            Ok(Ok(())) => return None,
            Ok(Err(err)) => err.to_string(),
            // The pool is still trying; a connection of our own tells why it does not succeed.
            Err(_) => match tokio::time::timeout(WHY_TIMEOUT, database.connect()).await {
                Ok(Err(err)) => err.to_string(),
                Ok(Ok(_)) => "no pooled connection answered in time".to_owned(),
                Err(_) => format!(
                    "no answer within {} ms",
                    (PROBE_TIMEOUT + WHY_TIMEOUT).as_millis()
                ),
            },
        };
        Some(format!("the database does not answer: {why}"))
    }

    /// [`Readiness::not_ready_reason`], also setting the `history_ready` gauge.
    pub async fn check(&self) -> Option<String> {
        let reason = self.not_ready_reason().await;
        metrics::set_ready(reason.is_none());
        reason
    }
}
