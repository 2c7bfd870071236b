//! Readiness: whether the service can actually consume and write, as `/readyz` and the
//! `history_ready` gauge report it. Not ready while it starts (migrations, the first
//! connection), before the consumer joined its group, while every write has kept failing for
//! longer than `pipeline.unready_after_failing_ms`, and while the database does not answer.

pub mod writes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kafka::topic_watch::MissingTopics;
use crate::metrics::{self, Stats};
use crate::store::{Database, PgPool, StoreError};

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
    },
}

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

    /// Still starting, for this reason.
    pub fn starting(&self, reason: impl Into<String>) {
        *self.inner.phase.lock().unwrap() = Phase::Starting(reason.into());
    }

    /// Started: from now on readiness asks the database itself.
    pub fn running(&self, pool: PgPool, database: Database) {
        *self.inner.phase.lock().unwrap() = Phase::Running {
            pool,
            database: Box::new(database),
        };
    }

    /// Why the service is not ready, or `None` if it is.
    pub async fn not_ready_reason(&self) -> Option<String> {
        let (pool, database) = match &*self.inner.phase.lock().unwrap() {
            Phase::Starting(reason) => return Some(format!("starting: {reason}")),
            Phase::Running { pool, database } => (pool.clone(), (**database).clone()),
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
        if !self.inner.joined.load(Ordering::Relaxed) {
            return Some("the consumer has not joined its group yet".to_owned());
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
