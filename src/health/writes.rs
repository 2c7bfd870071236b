//! How the writes have been going, for readiness: kept in [`Stats`](crate::metrics::Stats),
//! which every writer holds, and read by [`Readiness`](super::Readiness). A file of its own so
//! that the metrics can hold it without importing the readiness check, which reads them.

use std::fmt::Display;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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
