//! The memory budget of one instance for the records it fetched: how many, and how many bytes,
//! the service holds from the moment it takes a record from the Kafka client until the record's
//! outcome is known — and how the rest of the budget is left to the client's prefetch.
//!
//! Every record taken carries a [`Held`] ticket. The ticket travels with the record (the
//! partition's queue, the decoded job, a writer's batch, its retries, a parked event) and gives
//! its share back when it is dropped, so whatever becomes of the record — written, found a
//! duplicate, dead-lettered, dropped with a revoked partition — the count cannot leak or count
//! twice. What a partition's window keeps of a resolved record (its offset, until the records
//! before it resolve) is bounded per partition instead (`pipeline.max_in_flight_per_partition`).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What one record costs beyond its key and payload: the record, the job and the decoded
/// event's structures, allocator slack, its window entry. An estimate, measured in
/// docs/capacity.md; it keeps a budget in bytes meaningful for the smallest records too.
pub(crate) const RECORD_OVERHEAD_BYTES: usize = 256;

/// The smallest byte budget accepted: the Kafka client's fetch response alone needs 1 MB.
pub(crate) const MIN_BUDGET_BYTES: usize = 4 << 20;

/// What a fetched record counts against the budget: its key and payload as allocated, and
/// its bookkeeping.
pub(crate) fn record_cost(key: Option<&[u8]>, payload: Option<&[u8]>) -> usize {
    allocated(key.map_or(0, <[u8]>::len))
        + allocated(payload.map_or(0, <[u8]>::len))
        + RECORD_OVERHEAD_BYTES
}

/// What `len` bytes occupy once allocated: the binary's allocator (jemalloc) hands out size
/// classes, four to each doubling above 64 bytes (16 bytes apart below), so that a payload of
/// 20.5 KB takes 24 KiB — a fifth more than its length, which a budget counting lengths would
/// let the service exceed.
pub(crate) fn allocated(len: usize) -> usize {
    match len {
        0 => 0,
        1..=8 => 8,
        _ => {
            let lg = usize::BITS - 1 - (len - 1).leading_zeros();
            let spacing = (1usize << lg.saturating_sub(2)).max(16);
            len.div_ceil(spacing) * spacing
        }
    }
}

/// The instance's budget for fetched records, split between the service and the Kafka client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Records and bytes the service itself may hold.
    pub service: Limits,
    /// The client's prefetch queue, in KiB (`queued.max.messages.kbytes`): record data as
    /// decompressed, which is how librdkafka counts it.
    pub queue_kbytes: usize,
    /// Records in the client's prefetch queue (`queued.min.messages`).
    pub queue_records: usize,
    /// What the fetch responses on their way into the queue may cost, decompressed, all brokers
    /// together: the rest of the client's half ([`Split::fetch`] sizes the requests from it).
    pub fetch_bytes: usize,
}

impl Split {
    /// Half of the bytes for the records the service holds; of the other half, the client's, a
    /// quarter for its queue and three quarters for the fetch responses on their way into it:
    /// the client fetches only while its queue is below its limit, so it holds at most its
    /// queue and one response per broker it fetches from — and a response is at least one whole
    /// record batch however small the request, which the larger share leaves room for.
    /// Records: the service holds `records`; the client queues half as many, enough to refill
    /// the service's half-emptied budget at once.
    pub fn of(records: usize, bytes: usize) -> Split {
        let eighth = bytes / 8;
        Split {
            service: Limits {
                records,
                bytes: bytes / 2,
            },
            queue_kbytes: (eighth / 1024).max(1),
            queue_records: (records / 2).max(1),
            fetch_bytes: bytes / 2 - eighth,
        }
    }

    /// The split with the client's queue shared among `partitions` queues of one partition
    /// each (librdkafka applies `queued.*` to each partition's queue once they are split off the
    /// consumer queue); at least one record and one KiB each.
    pub fn among(&self, partitions: usize) -> Split {
        let partitions = partitions.max(1);
        Split {
            queue_kbytes: (self.queue_kbytes / partitions).max(1),
            queue_records: (self.queue_records / partitions).max(1),
            ..*self
        }
    }

    /// The fetch requests' sizes for a cluster of `brokers` brokers whose record batches
    /// decompress by at most `ratio`. librdkafka sends one Fetch request at a time to each broker
    /// that leads a partition it consumes, each answered with up to `fetch.max.bytes` counted
    /// on the wire — compressed — and decompresses a whole response into its queue: so
    /// `brokers` responses of `max_bytes` each cost at most `brokers × max_bytes × (ratio + 1)`
    /// (the compressed response and what it decompresses to), which this keeps within
    /// [`Split::fetch_bytes`]. Never below [`MIN_FETCH_BYTES`].
    pub fn fetch(&self, brokers: usize, ratio: usize) -> Fetch {
        let per_response = self.fetch_bytes / (brokers.max(1) * (ratio.max(1) + 1));
        let max_bytes = per_response.max(MIN_FETCH_BYTES);
        Fetch {
            max_bytes,
            partition_bytes: max_bytes.min(MAX_PARTITION_FETCH_BYTES),
            // librdkafka refuses a fetch.max.bytes below message.max.bytes (1,000,000 by
            // default), the largest request the consumer sends.
            message_max_bytes: max_bytes.min(DEFAULT_MESSAGE_MAX_BYTES),
        }
    }
}

/// The smallest fetch response asked for: a few ticket events' worth of batches. A response
/// always carries at least the first record batch of a partition, whatever its size.
pub(crate) const MIN_FETCH_BYTES: usize = 64 << 10;
/// The most one partition adds to a fetch response (librdkafka's default).
pub(crate) const MAX_PARTITION_FETCH_BYTES: usize = 1 << 20;
/// librdkafka's default `message.max.bytes`.
const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// How large the consumer's fetches are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetch {
    /// Largest fetch response, per request and so per broker (`fetch.max.bytes`).
    pub max_bytes: usize,
    /// Largest part of a response for one partition (`max.partition.fetch.bytes`).
    pub partition_bytes: usize,
    /// Largest request the consumer sends (`message.max.bytes`): librdkafka wants it at most
    /// `fetch.max.bytes`.
    pub message_max_bytes: usize,
}

/// Most records and bytes held at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub records: usize,
    pub bytes: usize,
}

/// What is held now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Level {
    pub records: usize,
    pub bytes: usize,
}

impl Level {
    /// Below both limits: another record may be taken (it may cross them by its own size, so
    /// the bound is the limits plus one record).
    pub fn has_room(&self, limits: Limits) -> bool {
        self.records < limits.records && self.bytes < limits.bytes
    }

    /// At or below half of both limits: the level at which fetching restarts after the whole
    /// instance was paused, so that the writers have half a budget of work while the client
    /// fetches again.
    pub fn is_low(&self, limits: Limits) -> bool {
        self.records <= limits.records / 2 && self.bytes <= limits.bytes / 2
    }
}

/// Told of every change of the level, with the level before it (the gauges, and waking whoever
/// waits for room).
pub(crate) type Observer = Box<dyn Fn(Level, Level) + Send + Sync>;

/// The count of what the service holds.
pub(crate) struct Budget {
    limits: Limits,
    records: AtomicUsize,
    bytes: AtomicUsize,
    observer: Observer,
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("limits", &self.limits)
            .field("level", &self.level())
            .finish()
    }
}

impl Budget {
    pub(crate) fn new(limits: Limits, observer: Observer) -> Arc<Budget> {
        Arc::new(Budget {
            limits: Limits {
                records: limits.records.max(1),
                bytes: limits.bytes.max(1),
            },
            records: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            observer,
        })
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    pub(crate) fn level(&self) -> Level {
        Level {
            records: self.records.load(Ordering::Acquire),
            bytes: self.bytes.load(Ordering::Acquire),
        }
    }

    pub(crate) fn has_room(&self) -> bool {
        self.level().has_room(self.limits)
    }

    pub(crate) fn is_low(&self) -> bool {
        self.level().is_low(self.limits)
    }

    /// Counts a record of `cost` bytes as held until the ticket is dropped. Never refuses:
    /// the caller asks [`Budget::has_room`] first.
    pub(crate) fn take(self: &Arc<Self>, cost: usize) -> Held {
        let records = self.records.fetch_add(1, Ordering::AcqRel);
        let bytes = self.bytes.fetch_add(cost, Ordering::AcqRel);
        let before = Level { records, bytes };
        let after = Level {
            records: records + 1,
            bytes: bytes + cost,
        };
        (self.observer)(before, after);
        Held {
            budget: Some(self.clone()),
            cost,
        }
    }

    fn give_back(&self, cost: usize) {
        let records = self.records.fetch_sub(1, Ordering::AcqRel);
        let bytes = self.bytes.fetch_sub(cost, Ordering::AcqRel);
        let before = Level { records, bytes };
        let after = Level {
            records: records - 1,
            bytes: bytes - cost,
        };
        (self.observer)(before, after);
    }
}

/// One record's share of the budget, given back when dropped.
pub struct Held {
    budget: Option<Arc<Budget>>,
    cost: usize,
}

impl Held {
    /// A ticket that holds nothing: for records that were never taken from a budget.
    pub fn nothing() -> Held {
        Held {
            budget: None,
            cost: 0,
        }
    }

    /// The bytes this ticket holds.
    pub fn cost(&self) -> usize {
        if self.budget.is_some() { self.cost } else { 0 }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.take() {
            budget.give_back(self.cost);
        }
    }
}

/// A copy of a job (a bisecting attempt, a retry of a parked event) is not the record itself:
/// it holds nothing, and the original gives the share back once, when it is dropped.
impl Clone for Held {
    fn clone(&self) -> Held {
        Held::nothing()
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Held({})", self.cost())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Mutex;

    fn budget(records: usize, bytes: usize) -> Arc<Budget> {
        Budget::new(Limits { records, bytes }, Box::new(|_, _| {}))
    }

    #[test]
    fn a_record_costs_its_bytes_as_allocated() {
        for (len, allocated_as) in [
            (0, 0),
            (1, 8),
            (9, 16),
            (17, 32),
            (33, 48),
            (65, 80),
            (129, 160),
            (256, 256),
            (257, 320),
            (20_670, 24_576),
            (1 << 20, 1 << 20),
        ] {
            assert_eq!(allocated(len), allocated_as, "{len}");
        }
        assert_eq!(
            record_cost(Some(b"ticket-42"), Some(&[b'x'; 300])),
            16 + 320 + RECORD_OVERHEAD_BYTES
        );
    }

    #[test]
    fn a_ticket_holds_its_record_until_it_is_dropped() {
        let budget = budget(10, 10_000);
        let a = budget.take(300);
        let b = budget.take(500);
        assert_eq!(
            budget.level(),
            Level {
                records: 2,
                bytes: 800
            }
        );
        drop(a);
        assert_eq!(
            budget.level(),
            Level {
                records: 1,
                bytes: 500
            }
        );
        drop(b);
        assert_eq!(budget.level(), Level::default());
    }

    #[test]
    fn a_copy_holds_nothing_and_the_original_gives_back_once() {
        let budget = budget(10, 10_000);
        let original = budget.take(300);
        let copy = original.clone();
        assert_eq!(copy.cost(), 0);
        drop(copy);
        assert_eq!(budget.level().records, 1, "the copy gave nothing back");
        drop(original);
        assert_eq!(budget.level(), Level::default());
    }

    #[test]
    fn room_ends_at_either_limit_and_fetching_restarts_at_half_of_both() {
        let limits = Limits {
            records: 10,
            bytes: 1000,
        };
        let level = |records, bytes| Level { records, bytes };
        assert!(level(9, 999).has_room(limits));
        assert!(!level(10, 0).has_room(limits), "records full");
        assert!(!level(1, 1000).has_room(limits), "bytes full");
        assert!(level(5, 500).is_low(limits));
        assert!(!level(6, 0).is_low(limits));
        assert!(!level(0, 501).is_low(limits));
    }

    #[test]
    fn the_observer_sees_every_level_in_order() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let budget = Budget::new(
            Limits {
                records: 10,
                bytes: 10_000,
            },
            Box::new({
                let seen = seen.clone();
                move |_, level| seen.lock().unwrap().push(level.records)
            }),
        );
        let a = budget.take(1);
        let b = budget.take(1);
        drop(a);
        drop(b);
        assert_eq!(*seen.lock().unwrap(), vec![1, 2, 1, 0]);
    }

    #[test]
    fn the_split_gives_the_service_half_the_bytes_and_the_client_a_queue_and_its_responses() {
        let split = Split::of(8000, 32 << 20);
        assert_eq!(
            split.service,
            Limits {
                records: 8000,
                bytes: 16 << 20
            }
        );
        assert_eq!(split.queue_kbytes, 4 << 10);
        assert_eq!(split.queue_records, 4000);
        assert_eq!(split.fetch_bytes, 12 << 20);
        let parts = split.service.bytes + split.queue_kbytes * 1024 + split.fetch_bytes;
        assert_eq!(parts, 32 << 20, "the parts add up to the budget");
    }

    #[test]
    fn fetches_shrink_with_the_brokers_and_the_compression_ratio() {
        let split = Split::of(8000, 32 << 20);
        let one = split.fetch(1, 1);
        assert_eq!(
            one.max_bytes,
            6 << 20,
            "uncompressed: the response and its records"
        );
        assert_eq!(one.partition_bytes, 1 << 20);
        assert_eq!(one.message_max_bytes, 1_000_000);
        let three = split.fetch(3, 10);
        assert_eq!(three.max_bytes, (12 << 20) / 33);
        assert_eq!(three.partition_bytes, three.max_bytes);
        assert_eq!(three.message_max_bytes, three.max_bytes);
        let many = split.fetch(100, 100);
        assert_eq!(many.max_bytes, MIN_FETCH_BYTES, "never below the floor");
        assert_eq!(
            split.fetch(0, 0),
            split.fetch(1, 1),
            "no broker counts as one"
        );
    }

    proptest! {
        /// Whatever the budget, the brokers and the ratio, the responses of every broker,
        /// decompressed, fit in the client's share — unless the floor binds.
        #[test]
        fn every_brokers_response_decompressed_fits_the_share(
            bytes in MIN_BUDGET_BYTES..(1usize << 32),
            brokers in 1usize..64,
            ratio in 1usize..200,
        ) {
            let split = Split::of(8000, bytes);
            let fetch = split.fetch(brokers, ratio);
            let cost = brokers * fetch.max_bytes * (ratio + 1);
            prop_assert!(
                cost <= split.fetch_bytes || fetch.max_bytes == MIN_FETCH_BYTES,
                "{brokers} brokers at {ratio}: {cost} > {}", split.fetch_bytes
            );
            prop_assert!(fetch.partition_bytes <= fetch.max_bytes);
            prop_assert!(fetch.message_max_bytes <= fetch.max_bytes);
        }
    }

    proptest! {
        /// Whatever order records are taken and dropped in, the level is the sum of the
        /// tickets alive, and all of it comes back.
        #[test]
        fn the_level_is_the_sum_of_the_live_tickets(
            steps in proptest::collection::vec((any::<bool>(), 0usize..5000, any::<prop::sample::Index>()), 0..200)
        ) {
            let budget = budget(1000, 1 << 30);
            let mut live: Vec<Held> = Vec::new();
            for (take, cost, index) in steps {
                if take || live.is_empty() {
                    live.push(budget.take(cost));
                } else {
                    live.swap_remove(index.index(live.len()));
                }
                let expected = Level {
                    records: live.len(),
                    bytes: live.iter().map(Held::cost).sum(),
                };
                prop_assert_eq!(budget.level(), expected);
            }
            live.clear();
            prop_assert_eq!(budget.level(), Level::default());
        }
    }
}
