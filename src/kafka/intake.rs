//! How many records the service holds, fetched from Kafka and not yet out of their partitions'
//! windows — in all (the [`Intake`]) and per partition (its [`Inflow`]) — so that it takes
//! records from the Kafka client only as fast as the database writes them.
//!
//! Two limits, two means:
//! - **In all** (`pipeline.max_in_flight`): the consumer stream takes no record from the Kafka
//!   client while the service holds that many; the client keeps what it prefetched
//!   (`kafka.fetch_queue_*`) and stops fetching by itself, and when writes free room the
//!   records are taken at once. This is the flow of a healthy backlog, and it never discards a
//!   fetched record. The wait is bounded (`max_wait`), because the client serves rebalance
//!   callbacks only while it is polled; a longer stall (the database down) falls to the second
//!   limit.
//! - **Per partition** (`pipeline.max_in_flight_per_partition`): the Kafka side pauses the
//!   partition the moment what it handed over fills its window, so one stuck partition never
//!   fills the whole budget. Pausing is the expensive means: librdkafka drops what it had
//!   prefetched for the partition, and after the resume it fetches again only at its broker
//!   thread's next wake-up (up to a second when every partition is paused). Were the pause
//!   decided by the partition actor, it would come only after the actor ran, and every record
//!   handed over until then would wait in its queue (measured: tens of thousands per partition
//!   during a backlog); so the Kafka side counts what it hands over, and the actor counts what
//!   leaves its queue for the window and asks for the resume once drained. Only the Kafka side
//!   pauses and resumes, so the two never disagree about the state.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The records the service holds in all, and the wait for room.
pub struct Intake {
    budget: usize,
    held: AtomicUsize,
    room: Notify,
    /// `history_held_records`, kept current.
    gauge: metrics::Gauge,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("budget", &self.budget)
            .field("held", &self.held())
            .finish()
    }
}

impl Intake {
    pub fn new(budget: usize) -> Arc<Self> {
        Arc::new(Intake {
            budget: budget.max(1),
            held: AtomicUsize::new(0),
            room: Notify::new(),
            gauge: metrics::gauge!(crate::metrics::HELD_RECORDS),
        })
    }

    /// Records held, in all partitions.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    pub fn has_room(&self) -> bool {
        self.held() < self.budget
    }

    /// Returns once the service holds fewer records than its budget, or after `max_wait`.
    pub async fn room(&self, max_wait: Duration) {
        if self.has_room() {
            return;
        }
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            // Registered before the check: room freed between the check and the wait still
            // wakes it.
            notified.as_mut().enable();
            if self.has_room() {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }

    /// The consumer stream took a record from the client.
    pub fn taken(&self) {
        self.add(1);
    }

    /// Taken records that went to no partition (fetched just before their partition's revoke).
    pub fn dropped(&self, count: usize) {
        self.sub(count);
    }

    fn add(&self, count: usize) {
        let held = self.held.fetch_add(count, Ordering::AcqRel) + count;
        self.gauge.set(held as f64);
    }

    fn sub(&self, count: usize) {
        // Saturating: a count that went wrong must not wrap into a full intake that never
        // takes a record again.
        let before = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(count))
            })
            .expect("the update always succeeds");
        let held = before.saturating_sub(count);
        self.gauge.set(held as f64);
        if before >= self.budget && held < self.budget {
            self.room.notify_waiters();
        }
    }

    /// The count of a newly assigned partition.
    pub fn partition(self: &Arc<Self>, limit: usize) -> Arc<Inflow> {
        Arc::new(Inflow {
            intake: self.clone(),
            limit: limit.max(1),
            queued: AtomicUsize::new(0),
            window: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
        })
    }
}

/// What one partition holds.
pub struct Inflow {
    intake: Arc<Intake>,
    /// `pipeline.max_in_flight_per_partition`.
    limit: usize,
    /// Handed to the partition actor and not yet admitted to the window: in its mailbox, its
    /// queue, or an admission on its way.
    queued: AtomicUsize,
    /// The window's length as the partition actor last saw it.
    window: AtomicUsize,
    /// Fetching of the partition is paused. Changed by the Kafka side only.
    paused: AtomicBool,
}

impl std::fmt::Debug for Inflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflow")
            .field("limit", &self.limit)
            .field("queued", &self.queued())
            .field("window", &self.window.load(Ordering::Acquire))
            .field("paused", &self.is_paused())
            .finish()
    }
}

impl Inflow {
    /// Kafka side: `count` records were handed to the partition actor (they were counted in the
    /// intake when taken). True when the partition is now full and was not paused yet: the
    /// caller pauses its fetching.
    pub fn handed_over(&self, count: usize) -> bool {
        let queued = self.queued.fetch_add(count, Ordering::AcqRel) + count;
        let full = queued + self.window.load(Ordering::Acquire) >= self.limit;
        full && !self.paused.swap(true, Ordering::AcqRel)
    }

    /// Partition actor: `count` queued records were admitted to the window (whose new length
    /// it reports with [`Inflow::window`]).
    pub fn admitted(&self, count: usize) {
        self.queued.fetch_sub(count, Ordering::AcqRel);
        self.intake.sub(count);
    }

    /// Partition actor: the window now holds `window` records.
    pub fn window(&self, window: usize) {
        let before = self.window.swap(window, Ordering::AcqRel);
        if window > before {
            self.intake.add(window - before);
        } else {
            self.intake.sub(before - window);
        }
    }

    /// Paused, with nothing queued and the window drained to half: time to fetch again.
    pub fn drained(&self) -> bool {
        self.paused.load(Ordering::Acquire)
            && self.queued.load(Ordering::Acquire) == 0
            && self.window.load(Ordering::Acquire) <= self.limit / 2
    }

    /// Kafka side, when the actor asked for the resume: true (and no longer paused) if it is
    /// still drained; false if records arrived meanwhile or it was resumed already.
    pub fn resume(&self) -> bool {
        self.drained() && self.paused.swap(false, Ordering::AcqRel)
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Records handed over and not yet admitted.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

impl Drop for Inflow {
    /// A partition's records leave the count with its assignment: they are dropped with its
    /// actor, or resolve in a window that is gone.
    fn drop(&mut self) {
        let held = *self.queued.get_mut() + *self.window.get_mut();
        self.intake.sub(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_pauses_once_when_what_it_holds_reaches_the_limit() {
        let inflow = Intake::new(100).partition(10);
        assert!(!inflow.handed_over(4));
        inflow.window(4);
        inflow.admitted(4);
        assert!(!inflow.handed_over(5), "9 held: room for one more");
        assert!(inflow.handed_over(1), "10 held: full");
        assert!(!inflow.handed_over(7), "already paused");
        assert!(inflow.is_paused());
        assert_eq!(inflow.queued(), 13);
    }

    #[test]
    fn records_still_queued_count_against_the_limit_before_they_reach_the_window() {
        let inflow = Intake::new(100).partition(10);
        assert!(
            inflow.handed_over(10),
            "a burst fills it before the actor ran"
        );
    }

    #[test]
    fn it_resumes_only_when_nothing_is_queued_and_the_window_is_at_half() {
        let inflow = Intake::new(100).partition(10);
        assert!(inflow.handed_over(12));
        inflow.window(10);
        inflow.admitted(10);
        assert!(!inflow.drained(), "two still queued");
        inflow.window(8);
        inflow.admitted(2);
        assert!(!inflow.drained(), "window above half");
        inflow.window(5);
        assert!(inflow.drained());
        assert!(inflow.resume());
        assert!(!inflow.is_paused());
        assert!(!inflow.resume(), "a second request finds it resumed");
    }

    #[test]
    fn a_resume_request_overtaken_by_new_records_leaves_it_paused() {
        let inflow = Intake::new(100).partition(10);
        assert!(inflow.handed_over(10));
        inflow.window(0);
        inflow.admitted(10);
        assert!(inflow.drained(), "the actor asks for the resume");
        assert!(
            !inflow.handed_over(3),
            "handed over before the request was served"
        );
        assert!(!inflow.resume());
        assert!(inflow.is_paused());
    }

    #[test]
    fn an_unpaused_partition_is_never_drained() {
        let inflow = Intake::new(100).partition(10);
        assert!(!inflow.drained());
        assert!(!inflow.resume());
    }

    /// What the consumer stream does with `count` records of one partition.
    fn take(intake: &Intake, inflow: &Inflow, count: usize) -> bool {
        (0..count).for_each(|_| intake.taken());
        inflow.handed_over(count)
    }

    #[test]
    fn the_intake_counts_every_record_from_its_take_to_leaving_the_window() {
        let intake = Intake::new(100);
        let a = intake.partition(1000);
        let b = intake.partition(1000);
        take(&intake, &a, 30);
        take(&intake, &b, 20);
        intake.taken();
        intake.dropped(1);
        assert_eq!(intake.held(), 50);
        a.window(30);
        a.admitted(30);
        assert_eq!(
            intake.held(),
            50,
            "admitted records are still held, in the window"
        );
        a.window(10);
        assert_eq!(intake.held(), 30);
        drop(b);
        assert_eq!(
            intake.held(),
            10,
            "a revoked partition's records leave with it"
        );
        drop(a);
        assert_eq!(intake.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_intake_waits_for_room_and_is_woken_when_the_windows_drain() {
        let intake = Intake::new(10);
        let inflow = intake.partition(100);
        take(&intake, &inflow, 10);
        inflow.window(10);
        inflow.admitted(10);
        assert!(!intake.has_room());
        let waiter = tokio::spawn({
            let intake = intake.clone();
            async move {
                let started = tokio::time::Instant::now();
                intake.room(Duration::from_secs(60)).await;
                started.elapsed()
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "no room yet");
        inflow.window(9);
        let waited = waiter.await.unwrap();
        assert_eq!(
            waited,
            Duration::from_secs(1),
            "woken by the drain, not the deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_for_room_ends_at_its_deadline_so_the_client_is_still_polled() {
        let intake = Intake::new(10);
        let inflow = intake.partition(100);
        take(&intake, &inflow, 10);
        let started = tokio::time::Instant::now();
        intake.room(Duration::from_millis(100)).await;
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }
}
