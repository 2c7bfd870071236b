//! Readiness: whether the service can actually consume and write, as `/readyz` and the
//! `history_ready` gauge report it. Not ready while it starts (migrations, the first
//! connection), before the consumer joined its group, while every write has kept failing for
//! longer than `pipeline.unready_after_failing_ms`, and while the database does not answer.

pub mod writes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
                stats,
                unready_after_failing,
            }),
        }
    }

    /// The flag the consumer's callbacks set once it has joined its group.
    pub fn joined(&self) -> Arc<AtomicBool> {
        self.inner.joined.clone()
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
