//! The intake: the consumer stream takes a record from the Kafka client only while the
//! instance's [`Budget`] has room, and which partitions the client fetches ([`FlowPolicy`]).
//!
//! The brake of a backlog is the wait for room: the client keeps what it prefetched (bounded
//! by the budget's other half, `Split`) and stops fetching by itself, and when a write frees
//! room the next record is taken at once — no pause, nothing fetched twice, whatever the number
//! of partitions. The wait is bounded only because the client serves rebalance callbacks while
//! it is polled: when the budget stays full longer (the database is down or slower than the
//! wait), every partition is paused, the client is polled for callbacks alone, and fetching
//! restarts once the service holds half of its budget or less.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{Consumer, ConsumerContext};
use tokio::sync::Notify;
use tracing::warn;

use crate::domain::budget::{Budget, Held, Level, Limits, record_cost};
use crate::domain::flow::{Changes, FlowPolicy};
use crate::domain::room_patience::RoomPatience;
use crate::domain::{Record, TopicPartition};

/// What the service holds of what it fetched, and the fetching decisions.
pub struct Intake {
    budget: Arc<Budget>,
    /// Woken when the level falls below a limit or to half of it.
    changed: Arc<Notify>,
    flow: Mutex<FlowPolicy<TopicPartition>>,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("budget", &self.budget)
            .finish()
    }
}

impl Intake {
    pub fn new(limits: Limits) -> Arc<Self> {
        let changed = Arc::new(Notify::new());
        let peak_gauge = metrics::gauge!(crate::metrics::HELD_RECORDS_PEAK);
        peak_gauge.set(0.0);
        // The peak as a number to compare without a lock, and under the lock the one that is
        // set, so that the gauge never ends below the peak when two threads pass it at once.
        let seen = std::sync::atomic::AtomicUsize::new(0);
        let peak = Mutex::new(0_usize);
        let observer = {
            let changed = changed.clone();
            move |before: Level, after: Level| {
                // Every level the budget passes through is seen here, so the peak misses no
                // overshoot, however short, as a sampled gauge would.
                if after.records > seen.load(Ordering::Relaxed) {
                    let mut peak = peak.lock().unwrap();
                    if after.records > *peak {
                        *peak = after.records;
                        seen.store(after.records, Ordering::Relaxed);
                        peak_gauge.set(after.records as f64);
                    }
                }
                let below =
                    |before: usize, after: usize, mark: usize| before >= mark && after < mark;
                let freed = below(before.records, after.records, limits.records)
                    || below(before.bytes, after.bytes, limits.bytes)
                    || below(before.records, after.records, limits.records / 2 + 1)
                    || below(before.bytes, after.bytes, limits.bytes / 2 + 1);
                if freed {
                    changed.notify_waiters();
                }
            }
        };
        let intake = Arc::new(Intake {
            budget: Budget::new(limits, Box::new(observer)),
            changed,
            flow: Mutex::new(FlowPolicy::new()),
        });
        let budget = Arc::downgrade(&intake.budget);
        crate::metrics::show_held_level(Box::new(move || {
            let level = budget.upgrade()?.level();
            Some((level.records, level.bytes))
        }));
        intake
    }

    pub fn level(&self) -> Level {
        self.budget.level()
    }

    pub fn limits(&self) -> Limits {
        self.budget.limits()
    }

    /// Counts a record taken from the client as held until its ticket is dropped.
    pub fn take(&self, record: &Record) -> Held {
        self.budget.take(record_cost(
            record.key.as_deref(),
            record.payload.as_deref(),
        ))
    }

    /// Whether the budget has room now.
    pub fn has_room(&self) -> bool {
        self.budget.has_room()
    }

    /// Returns true once the budget has room, false if it had none within `max_wait`: the
    /// record stream waits through a [`RoomWait`]; the unit tests below, for a plain wait.
    #[cfg(test)]
    pub async fn room(&self, max_wait: Duration) -> bool {
        self.room_by(tokio::time::Instant::now() + max_wait).await
    }

    /// Returns true once the budget has room, false if it had none by `deadline`.
    pub async fn room_by(&self, deadline: tokio::time::Instant) -> bool {
        tokio::time::timeout_at(deadline, self.until(|budget| budget.has_room()))
            .await
            .is_ok()
    }

    /// Returns once the service holds half of its budget or less.
    pub async fn low(&self) {
        self.until(|budget| budget.is_low()).await
    }

    async fn until(&self, holds: impl Fn(&Budget) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check: a release between the check and the wait still
            // wakes it.
            notified.as_mut().enable();
            if holds(&self.budget) {
                return;
            }
            notified.await;
        }
    }

    /// A fetching decision, made under the one lock the stream and the supervisor share.
    pub fn flow<R>(&self, decide: impl FnOnce(&mut FlowPolicy<TopicPartition>) -> R) -> R {
        decide(&mut self.flow.lock().unwrap())
    }
}

/// The record stream's wait for room, which outlives the stream's turns (a tick or a
/// notification interrupts it, and must not restart it) and the instance's pause: a wait that
/// paused the instance is measured until fetching resumes, so that a database slower than the
/// least wait teaches the [`RoomPatience`] its pace (over-measured by the wait for half of the
/// budget, which errs towards not pausing it again, within the most).
#[derive(Debug)]
pub(crate) struct RoomWait {
    since: Option<tokio::time::Instant>,
    patience: RoomPatience,
}

impl RoomWait {
    /// A wait for room pauses the instance after `least`, or after longer — up to `most` — when
    /// room came that slowly lately.
    pub(crate) fn new(least: Duration, most: Duration) -> Self {
        RoomWait {
            since: None,
            patience: RoomPatience::new(least, most),
        }
    }

    /// Returns true once the budget has room, false when the wait under way outlasted the
    /// pace room came at lately: the instance pauses then, and the wait goes on until fetching
    /// resumes and this is called again.
    pub(crate) async fn room(&mut self, intake: &Intake) -> bool {
        if self.since.is_none() && intake.has_room() {
            return true;
        }
        let since = *self.since.get_or_insert_with(tokio::time::Instant::now);
        let deadline = since + self.patience.limit(since.into_std());
        if !intake.room_by(deadline).await {
            return false;
        }
        self.came(since);
        true
    }

    /// How long the wait under way lasts before the instance pauses.
    pub(crate) fn limit(&mut self) -> Duration {
        let since = self.since.unwrap_or_else(tokio::time::Instant::now);
        self.patience.limit(since.into_std())
    }

    fn came(&mut self, since: tokio::time::Instant) {
        let now = tokio::time::Instant::now();
        self.patience.waited(now.into_std(), now - since);
        self.since = None;
    }
}

/// Tells the client what a fetching decision changed.
pub(crate) fn apply<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    changes: &Changes<TopicPartition>,
) {
    for (partitions, pause) in [(&changes.pause, true), (&changes.resume, false)] {
        if partitions.is_empty() {
            continue;
        }
        let mut tpl = TopicPartitionList::with_capacity(partitions.len());
        for tp in partitions {
            tpl.add_partition(&tp.topic, tp.partition);
        }
        let result = if pause {
            consumer.pause(&tpl)
        } else {
            consumer.resume(&tpl)
        };
        if let Err(err) = result {
            warn!(partitions = ?partitions, pause, error = %err, "pause/resume failed");
        }
    }
}

/// The partitions the client has assigned now (the supervisor learns of changes later).
pub(crate) fn assignment<C: ConsumerContext>(consumer: &impl Consumer<C>) -> Vec<TopicPartition> {
    consumer
        .assignment()
        .map(|tpl| {
            tpl.elements()
                .iter()
                .map(|element| TopicPartition::new(element.topic(), element.partition()))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(bytes: usize) -> Record {
        Record {
            offset: 0,
            key: None,
            payload: Some(vec![b'x'; bytes]),
            timestamp_ms: None,
        }
    }

    fn intake(records: usize, bytes: usize) -> Arc<Intake> {
        Intake::new(Limits { records, bytes })
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_for_room_is_woken_by_the_release_that_frees_it() {
        let intake = intake(2, 1 << 20);
        let a = intake.take(&record(10));
        let _b = intake.take(&record(10));
        let waiter = tokio::spawn({
            let intake = intake.clone();
            async move {
                let started = tokio::time::Instant::now();
                let room = intake.room(Duration::from_secs(60)).await;
                (room, started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "no room yet");
        drop(a);
        let (room, waited) = waiter.await.unwrap();
        assert!(room);
        assert_eq!(
            waited,
            Duration::from_secs(1),
            "woken by the release, not the deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_fill_the_budget_as_records_do() {
        let intake = intake(1000, 4096);
        let big = intake.take(&record(5000));
        assert!(!intake.room(Duration::from_millis(100)).await);
        drop(big);
        assert!(intake.room(Duration::from_millis(100)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_for_room_ends_at_its_deadline_without_room() {
        let intake = intake(1, 1 << 20);
        let _held = intake.take(&record(1));
        let started = tokio::time::Instant::now();
        assert!(!intake.room(Duration::from_millis(500)).await);
        assert_eq!(started.elapsed(), Duration::from_millis(500));
    }

    const LEAST: Duration = Duration::from_millis(500);
    const MOST: Duration = Duration::from_secs(2);

    #[tokio::test(start_paused = true)]
    async fn a_wait_interrupted_goes_on_from_where_it_began() {
        let intake = intake(1, 1 << 20);
        let _held = intake.take(&record(1));
        let mut wait = RoomWait::new(LEAST, MOST);
        let started = tokio::time::Instant::now();
        // A tick of the stream interrupts the wait after 300 ms.
        let interrupted =
            tokio::time::timeout(Duration::from_millis(300), wait.room(&intake)).await;
        assert!(interrupted.is_err());
        assert!(!wait.room(&intake).await);
        assert_eq!(started.elapsed(), LEAST, "not 300 ms more than the least");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_paused_the_instance_teaches_the_pace_of_a_slow_database() {
        let intake = intake(1, 1 << 20);
        let held = intake.take(&record(1));
        let mut wait = RoomWait::new(LEAST, MOST);
        assert!(!wait.room(&intake).await, "no room within the least wait");
        // The batch commits 0.7 s after the wait began; fetching resumes.
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(held);
        assert!(wait.room(&intake).await);
        // Batches take 0.7 s: the next waits end with room, none pauses.
        for _ in 0..3 {
            let held = intake.take(&record(1));
            let release = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(700)).await;
                drop(held);
            });
            let started = tokio::time::Instant::now();
            assert!(wait.room(&intake).await, "paused for a batch of 0.7 s");
            assert_eq!(started.elapsed(), Duration::from_millis(700));
            release.await.unwrap();
        }
        // Hung: paused within the most.
        let _held = intake.take(&record(1));
        let started = tokio::time::Instant::now();
        assert!(!wait.room(&intake).await);
        assert_eq!(started.elapsed(), MOST);
    }

    #[tokio::test(start_paused = true)]
    async fn the_low_water_wait_ends_only_at_half_the_budget() {
        let intake = intake(4, 1 << 20);
        let mut held: Vec<Held> = (0..4).map(|_| intake.take(&record(1))).collect();
        let waiter = tokio::spawn({
            let intake = intake.clone();
            async move { intake.low().await }
        });
        held.pop();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "3 of 4 held: room, but not low");
        held.pop();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("2 of 4 is half")
            .unwrap();
    }
}
