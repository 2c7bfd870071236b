//! Readiness: whether the service can actually consume and write, as `/readyz` and the
//! `history_ready` gauge report it. Not ready while it starts (migrations, the first
//! connection), before the consumer joined its group, while every write has kept failing for
//! longer than `pipeline.unready_after_failing_ms`, and while the database does not answer.

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::metrics::{self, Stats};
use crate::store::{Database, PgPool, StoreError};

/// How the writes have been going: every batch reports its success or failure here. Cheap on
/// the hot path: a success while nothing is failing is one atomic load.
#[derive(Debug, Default)]
pub struct WriteHealth {
    failing: AtomicBool,
    streak: Mutex<Option<FailingStreak>>,
}

/// Writes failing without a success in between: since when, and the latest error.
#[derive(Debug, Clone)]
struct FailingStreak {
    since: Instant,
    last_error: String,
}

impl WriteHealth {
    /// What a batch came to: whether anything of it was resolved, and its error if some of it
    /// failed. A batch that resolved anything shows the database takes writes.
    pub fn batch(&self, resolved_any: bool, error: Option<&impl Display>) {
        match error {
            Some(error) if !resolved_any => self.failed(error),
            _ => self.succeeded(),
        }
    }

    /// A batch was written: any failing streak is over.
    pub fn succeeded(&self) {
        if self.failing.load(Ordering::Relaxed) {
            let mut streak = self.streak.lock().unwrap();
            *streak = None;
            // Under the lock, so a concurrent failure cannot be cleared by a stale store.
            self.failing.store(false, Ordering::Relaxed);
        }
    }

    /// A batch failed (its outcome is Unknown, it will be retried).
    pub fn failed(&self, error: &dyn Display) {
        self.failed_at(Instant::now(), error);
    }

    fn failed_at(&self, now: Instant, error: &dyn Display) {
        let mut streak = self.streak.lock().unwrap();
        match &mut *streak {
            Some(streak) => streak.last_error = error.to_string(),
            None => {
                *streak = Some(FailingStreak {
                    since: now,
                    last_error: error.to_string(),
                })
            }
        }
        self.failing.store(true, Ordering::Relaxed);
    }

    /// Why writes make the service unready: they have all failed for at least `limit`.
    pub fn unready_reason(&self, now: Instant, limit: Duration) -> Option<String> {
        let streak = self.streak.lock().unwrap().clone()?;
        let failing_for = now.saturating_duration_since(streak.since);
        (failing_for >= limit).then(|| {
            format!(
                "every write has failed for {}s: {}",
                failing_for.as_secs(),
                streak.last_error
            )
        })
    }
}

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
            let conn = pool.get().await?;
            conn.client.simple_query("SELECT 1").await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(30);

    #[test]
    fn writes_that_never_failed_keep_the_service_ready() {
        let health = WriteHealth::default();
        health.succeeded();
        assert_eq!(health.unready_reason(Instant::now(), LIMIT), None);
    }

    #[test]
    fn failing_for_the_limit_makes_it_unready_with_the_last_error() {
        let health = WriteHealth::default();
        let start = Instant::now();
        health.failed_at(start, &"first");
        health.failed_at(start + Duration::from_secs(10), &"42P01: no such table");
        assert_eq!(
            health.unready_reason(start + Duration::from_secs(29), LIMIT),
            None
        );
        let reason = health
            .unready_reason(start + Duration::from_secs(31), LIMIT)
            .unwrap();
        assert!(reason.contains("42P01: no such table"), "{reason}");
        assert!(reason.contains("31s"), "{reason}");
    }

    #[test]
    fn a_batch_that_resolved_anything_counts_as_a_success() {
        let health = WriteHealth::default();
        let start = Instant::now();
        health.failed_at(start, &"down");
        health.batch(true, Some(&"one event rejected"));
        assert_eq!(health.unready_reason(Instant::now() + LIMIT, LIMIT), None);
        health.batch(false, Some(&"every event rejected"));
        let reason = health
            .unready_reason(Instant::now() + LIMIT, LIMIT)
            .unwrap();
        assert!(reason.contains("every event rejected"), "{reason}");
        health.batch(false, None::<&String>);
        assert_eq!(health.unready_reason(Instant::now() + LIMIT, LIMIT), None);
    }

    #[test]
    fn one_success_ends_the_streak() {
        let health = WriteHealth::default();
        let start = Instant::now();
        health.failed_at(start, &"down");
        health.succeeded();
        assert_eq!(
            health.unready_reason(start + Duration::from_secs(60), LIMIT),
            None
        );
        // A new streak counts from its own first failure.
        health.failed_at(start + Duration::from_secs(50), &"down again");
        assert_eq!(
            health.unready_reason(start + Duration::from_secs(60), LIMIT),
            None
        );
        assert!(
            health
                .unready_reason(start + Duration::from_secs(81), LIMIT)
                .is_some()
        );
    }
}
