//! How the consumer's fetch requests are sized, and the watch that the sizing still holds.
//!
//! librdkafka keeps one Fetch request in flight per broker it reads from, each answered with up
//! to `fetch.max.bytes` on the wire, and decompresses a whole response into its queue. So what
//! a prefetch costs depends on how many brokers there are and how much their batches
//! decompress by: the requests are sized at start-up for the cluster's brokers (one metadata
//! request) and `kafka.max_compression_ratio` ([`Split::fetch`]). Both can change later — a
//! broker added, a producer switched to zstd — so the client's statistics are watched: the
//! brokers it knows of and the ratio of the record bytes it decompressed to the bytes it
//! received, each exported, and each a WARN (once) when past what the sizing assumed — with
//! what librdkafka really holds in memory (`history_kafka_client_heap_bytes`,
//! [`super::client_memory`]) beside the share it was sized for.

use std::sync::Mutex;

use rdkafka::statistics::Statistics;
use tracing::warn;

use crate::domain::budget::{Fetch, Split};

/// What the fetch requests were sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchSizing {
    pub brokers: usize,
    pub ratio: usize,
    pub fetch: Fetch,
    /// The client's share of the budget: its queue and its responses.
    pub client_bytes: usize,
}

impl FetchSizing {
    pub fn new(budget: &Split, brokers: usize, ratio: usize) -> Self {
        FetchSizing {
            brokers,
            ratio,
            fetch: budget.fetch(brokers, ratio),
            client_bytes: budget.queue_kbytes * 1024 + budget.fetch_bytes,
        }
    }
}

/// What one fetch response may cost however small its request: Kafka always returns the first
/// record batch of a partition whole, and producers' batches reach about a megabyte once
/// decompressed (librdkafka's `batch.size` is 1,000,000 bytes), with their compressed copy.
pub(crate) const ONE_BATCH_BYTES: usize = 5 << 18;

impl FetchSizing {
    /// The budget that leaves every broker room for one whole batch, when this one does not.
    pub fn budget_needed_for_batches(
        &self,
        budget_bytes: usize,
        fetch_bytes: usize,
    ) -> Option<usize> {
        let needed = self.brokers * ONE_BATCH_BYTES;
        (fetch_bytes < needed)
            .then(|| (budget_bytes as u128 * needed as u128 / fetch_bytes.max(1) as u128) as usize)
    }
}

/// Totals of one statistics report: bytes received from the brokers, record bytes decompressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Received {
    pub wire: u64,
    pub records: u64,
}

impl Received {
    /// The totals of a statistics report: every broker's received bytes, every partition's
    /// record bytes (keys and values, as decompressed).
    pub(crate) fn of(statistics: &Statistics) -> Received {
        Received {
            wire: statistics
                .brokers
                .values()
                .map(|broker| broker.rxbytes)
                .sum(),
            records: statistics
                .topics
                .values()
                .flat_map(|topic| topic.partitions.values())
                .map(|partition| partition.rxbytes)
                .sum(),
        }
    }

    /// The ratio over the interval since `before`, when enough was fetched to tell (requests
    /// other than fetches — heartbeats, metadata — would otherwise make a quiet interval look
    /// like anything).
    pub(crate) fn ratio_since(&self, before: Received) -> Option<f64> {
        let wire = self.wire.checked_sub(before.wire)?;
        let records = self.records.checked_sub(before.records)?;
        (wire >= MEASURABLE_BYTES).then(|| records as f64 / wire as f64)
    }
}

/// Received bytes below which an interval's ratio is not measured.
const MEASURABLE_BYTES: u64 = 256 << 10;

/// The watch over the statistics.
#[derive(Debug)]
pub struct SizingWatch {
    sizing: FetchSizing,
    state: Mutex<WatchState>,
}

#[derive(Debug, Default)]
struct WatchState {
    last: Option<Received>,
    warned_brokers: bool,
    warned_ratio: bool,
}

impl SizingWatch {
    pub fn new(sizing: FetchSizing) -> Self {
        crate::metrics::set_fetch_sizing(sizing.brokers, sizing.ratio, sizing.client_bytes);
        SizingWatch {
            sizing,
            state: Mutex::new(WatchState::default()),
        }
    }

    /// One statistics report.
    pub fn observe(&self, statistics: &Statistics) {
        let brokers = statistics
            .brokers
            .values()
            .filter(|broker| broker.nodeid >= 0)
            .count();
        let received = Received::of(statistics);
        let mut state = self.state.lock().unwrap();
        let ratio = state.last.and_then(|before| received.ratio_since(before));
        state.last = Some(received);
        crate::metrics::set_fetch_observed(brokers, ratio, super::client_memory::heap_bytes());
        if brokers > self.sizing.brokers && !state.warned_brokers {
            state.warned_brokers = true;
            warn!(
                brokers,
                sized_for = self.sizing.brokers,
                fetch_max_bytes = self.sizing.fetch.max_bytes,
                "the cluster has more brokers than the fetch requests were sized for at start-up: \
                 the Kafka client's prefetch may exceed its share of pipeline.max_in_flight_bytes \
                 until the service is restarted (which sizes them again)"
            );
        }
        if let Some(ratio) = ratio.filter(|ratio| *ratio > self.sizing.ratio as f64) {
            if !state.warned_ratio {
                state.warned_ratio = true;
                warn!(
                    ratio = format!("{ratio:.1}"),
                    sized_for = self.sizing.ratio,
                    "the fetched record batches decompress by more than kafka.max_compression_ratio: \
                     the Kafka client's prefetch may exceed its share of \
                     pipeline.max_in_flight_bytes; raise kafka.max_compression_ratio to this"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_too_small_for_one_batch_per_broker_says_what_would_do() {
        let budget = Split::of(8000, 32 << 20);
        let nine = FetchSizing::new(&budget, 9, 10);
        assert_eq!(
            nine.budget_needed_for_batches(32 << 20, budget.fetch_bytes),
            None
        );
        let twelve = FetchSizing::new(&budget, 12, 10);
        let needed = twelve
            .budget_needed_for_batches(32 << 20, budget.fetch_bytes)
            .unwrap();
        assert_eq!(Split::of(8000, needed).fetch_bytes, 12 * ONE_BATCH_BYTES);
    }

    #[test]
    fn the_ratio_is_measured_over_an_interval_with_enough_fetched() {
        let before = Received {
            wire: 1 << 20,
            records: 5 << 20,
        };
        let after = Received {
            wire: 2 << 20,
            records: 13 << 20,
        };
        assert_eq!(after.ratio_since(before), Some(8.0));
        let quiet = Received {
            wire: before.wire + 1000,
            records: before.records + 5000,
        };
        assert_eq!(quiet.ratio_since(before), None, "too little to tell");
        // A restarted client's totals start again.
        assert_eq!(before.ratio_since(after), None);
    }
}
