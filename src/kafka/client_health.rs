//! What the Kafka client cannot do on its own behalf, told to the operator: every broker
//! unreachable, and record batches it cannot decompress.
//!
//! librdkafka reports both only as client errors, over and over, with no partition named: a
//! batch it cannot decompress (a codec this build lacks, a corrupt batch) is re-fetched every
//! `fetch.error.backoff.ms` and its partition never moves, while `/readyz` would go on saying
//! "ready". The error text names the batch's offset; its partition is the assigned one whose
//! fetch position stands at that batch with records behind it (librdkafka's statistics), so
//! the ERROR line, `/readyz` and `history_undecodable_batch` can name topic, partition and
//! offset. (Batches of several partitions failing at the same offset are not told apart by the
//! text: each of those partitions is named, with the last failure seen at that offset.) Nothing needs guarding beyond saying so: the records of that batch never reach the
//! service, so nothing past them is written, and the partition's position is never committed
//! past them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::{error, info};

use crate::domain::TopicPartition;

/// A failed decompression, as librdkafka's error text describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecompressionFailure {
    /// The batch's compression codec (the attribute bits: 1 gzip, 2 snappy, 3 lz4, 4 zstd).
    pub codec: u32,
    /// The batch's first offset.
    pub offset: i64,
    /// Its compressed size.
    pub bytes: u64,
    /// librdkafka's reason (`Local: Not implemented`, `Local: Invalid compressed data`).
    pub cause: String,
}

impl DecompressionFailure {
    /// Reads librdkafka's "Decompression (codec 0x4) of message at 17 of 14309 bytes failed:
    /// Local: Not implemented".
    pub fn parse(text: &str) -> Option<DecompressionFailure> {
        let rest = text.split("Decompression (codec 0x").nth(1)?;
        let (codec, rest) = rest.split_once(')')?;
        let codec = u32::from_str_radix(codec.trim(), 16).ok()?;
        let rest = rest.trim_start().strip_prefix("of message at ")?;
        let (offset, rest) = rest.split_once(" of ")?;
        let (bytes, rest) = rest.split_once(" bytes failed")?;
        let cause = rest.trim_start_matches(':').trim().to_owned();
        Some(DecompressionFailure {
            codec,
            offset: offset.trim().parse().ok()?,
            bytes: bytes.trim().parse().ok()?,
            cause,
        })
    }

    /// The codec's name.
    pub fn codec_name(&self) -> &'static str {
        match self.codec {
            0 => "none",
            1 => "gzip",
            2 => "snappy",
            3 => "lz4",
            4 => "zstd",
            _ => "unknown",
        }
    }

    /// What the operator can do about it.
    pub fn advice(&self) -> &'static str {
        if (1..=4).contains(&self.codec) {
            "this build reads every Kafka codec, so the batch itself is corrupt: no client can \
             read its records; once they are given up, stop the service and move the group's \
             offset of this partition past the batch (kafka-consumer-groups --reset-offsets \
             --to-offset)"
        } else {
            "the batch uses a compression codec this build does not have: deploy a build that \
             has it (history-service logs librdkafka's builtin features at start-up)"
        }
    }
}

/// A partition's fetch position as librdkafka's statistics give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchPosition {
    /// The next offset it fetches.
    pub next: i64,
    /// The partition's end.
    pub end: i64,
}

/// A partition standing still at a batch that cannot be decompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    pub failure: DecompressionFailure,
    /// The partition's fetch position when it was found.
    pub position: i64,
}

/// How long a decompression failure counts as happening now: librdkafka re-fetches a failed
/// batch every half second or so, and the statistics come every few seconds.
const FAILURE_MEMORY: Duration = Duration::from_secs(30);

/// The client's troubles, shared by its callbacks, the supervisor and readiness.
#[derive(Debug, Default)]
pub struct ClientHealth {
    /// Set while every broker is down: a record arriving checks it alone, without the lock.
    down: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Since when no broker answers, and librdkafka's last word on it.
    brokers_down: Option<(Instant, String)>,
    /// The last other client error: why the brokers do not answer (a refused connection, an
    /// authentication or TLS failure), which "every broker down" does not say.
    last_cause: Option<String>,
    /// Recent decompression failures not yet placed in a partition, by the batch's offset.
    failures: BTreeMap<i64, (DecompressionFailure, Instant)>,
    /// Partitions known to stand still at a batch that cannot be decompressed.
    undecodable: BTreeMap<TopicPartition, Undecodable>,
    /// Commits refused as from a member or generation the coordinator does not know, with
    /// no commit confirmed since: since when, the last refusal, and when it was last logged.
    commits_refused: Option<RefusedCommits>,
}

#[derive(Debug)]
struct RefusedCommits {
    since: Instant,
    error: String,
    logged: Option<Instant>,
}

/// How long every commit may be refused before it is more than a rebalance: a rebalance ends
/// within a few commit intervals, and a member the coordinator keeps refusing commits nothing.
pub(crate) const COMMITS_REFUSED_TOO_LONG: Duration = Duration::from_secs(30);

impl ClientHealth {
    /// A commit was refused as from an unknown member or an old generation. Returns how long
    /// commits have been refused when that is too long and not logged within the last
    /// [`COMMITS_REFUSED_TOO_LONG`]: the caller logs it then.
    pub fn commit_refused(&self, error: &str, now: Instant) -> Option<Duration> {
        let mut state = self.state.lock().unwrap();
        let refused = state.commits_refused.get_or_insert(RefusedCommits {
            since: now,
            error: String::new(),
            logged: None,
        });
        refused.error = error.to_owned();
        let lasting = now.saturating_duration_since(refused.since);
        let due = refused
            .logged
            .is_none_or(|at| now.saturating_duration_since(at) >= COMMITS_REFUSED_TOO_LONG);
        (lasting >= COMMITS_REFUSED_TOO_LONG && due).then(|| {
            refused.logged = Some(now);
            lasting
        })
    }

    /// A commit was confirmed: whatever refused the earlier ones is over.
    pub fn commit_confirmed(&self) {
        self.state.lock().unwrap().commits_refused = None;
    }

    /// How long every commit has been refused, and the last refusal, once that is too long.
    pub fn commits_refused(&self, now: Instant) -> Option<(Duration, String)> {
        let state = self.state.lock().unwrap();
        let refused = state.commits_refused.as_ref()?;
        let lasting = now.saturating_duration_since(refused.since);
        (lasting >= COMMITS_REFUSED_TOO_LONG).then(|| (lasting, refused.error.clone()))
    }

    /// A client error: every broker down, or a batch that failed to decompress.
    pub fn client_error(&self, code: Option<&str>, reason: &str, now: Instant) {
        let mut state = self.state.lock().unwrap();
        if code == Some("AllBrokersDown") {
            let since = state.brokers_down.as_ref().map_or(now, |(since, _)| *since);
            state.brokers_down = Some((since, reason.to_owned()));
            self.down.store(true, Ordering::Release);
            crate::metrics::set_kafka_unreachable(true);
        } else {
            state.last_cause = Some(match code {
                Some(code) => format!("{code}: {reason}"),
                None => reason.to_owned(),
            });
        }
        if let Some(failure) = DecompressionFailure::parse(reason) {
            state.failures.insert(failure.offset, (failure, now));
        }
    }

    /// A broker answered (a record arrived, or the statistics list a broker that is up).
    pub fn broker_up(&self) {
        if !self.down.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.state.lock().unwrap();
        self.down.store(false, Ordering::Release);
        crate::metrics::set_kafka_unreachable(false);
        if let Some((since, _)) = state.brokers_down.take() {
            info!(
                down_ms = since.elapsed().as_millis() as u64,
                "a Kafka broker answers again"
            );
        }
    }

    /// Whether every broker is unreachable now: since when, and librdkafka's last word on it
    /// with the last client error that says why.
    pub fn brokers_down(&self) -> Option<(Duration, String)> {
        let state = self.state.lock().unwrap();
        state.brokers_down.as_ref().map(|(since, reason)| {
            let why = match &state.last_cause {
                Some(cause) => format!("{reason}; last: {cause}"),
                None => reason.clone(),
            };
            (since.elapsed(), why)
        })
    }

    /// Places recent decompression failures in the partitions whose fetch position stands at
    /// them (`positions`: the assigned partitions'), and forgets partitions that moved on.
    /// Returns the partitions found standing still now, for the caller to report.
    pub fn place_failures(
        &self,
        positions: &[(TopicPartition, FetchPosition)],
        now: Instant,
    ) -> Vec<(TopicPartition, Undecodable)> {
        let mut state = self.state.lock().unwrap();
        state
            .failures
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) < FAILURE_MEMORY);
        let mut found = Vec::new();
        for (tp, position) in positions {
            if let Some(known) = state.undecodable.get(tp) {
                if position.next == known.position {
                    continue;
                }
                // Its position moved (the group's offset was moved past the batch).
                let known = state.undecodable.remove(tp).expect("present");
                set_gauge(tp, &known.failure, false);
                info!(
                    %tp,
                    offset = known.failure.offset,
                    position = position.next,
                    "the partition moved past the batch it could not decompress"
                );
            }
            if position.next >= position.end {
                continue;
            }
            // A failed batch starting at the partition's fetch position. (A position inside a
            // batch — committed by a client that could read it — is not matched: a partition
            // merely waiting with records behind it must never be named.)
            let Some((failure, _)) = state.failures.get(&position.next) else {
                continue;
            };
            let undecodable = Undecodable {
                failure: failure.clone(),
                position: position.next,
            };
            state.undecodable.insert(tp.clone(), undecodable.clone());
            found.push((tp.clone(), undecodable));
        }
        for (tp, undecodable) in &found {
            set_gauge(tp, &undecodable.failure, true);
            let failure = &undecodable.failure;
            error!(
                %tp,
                offset = failure.offset,
                position = undecodable.position,
                codec = %failure.codec_name(),
                bytes = failure.bytes,
                cause = %failure.cause,
                "records of this partition cannot be decompressed: the partition stands still \
                 at this batch and its position is not committed past it; {}",
                failure.advice()
            );
        }
        found
    }

    /// The partition is no longer assigned here.
    pub fn forget(&self, tp: &TopicPartition) {
        let mut state = self.state.lock().unwrap();
        if let Some(known) = state.undecodable.remove(tp) {
            set_gauge(tp, &known.failure, false);
        }
    }

    /// The partitions standing still at a batch they cannot decompress.
    pub fn undecodable(&self) -> Vec<(TopicPartition, Undecodable)> {
        let state = self.state.lock().unwrap();
        state
            .undecodable
            .iter()
            .map(|(tp, undecodable)| (tp.clone(), undecodable.clone()))
            .collect()
    }
}

fn set_gauge(tp: &TopicPartition, failure: &DecompressionFailure, stuck: bool) {
    crate::metrics::set_undecodable_batch(tp, failure.offset, failure.codec_name(), stuck);
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "Decompression (codec 0x4) of message at 17 of 14309 bytes failed: Local: \
                        Not implemented";

    #[test]
    fn librdkafkas_text_is_read() {
        assert_eq!(
            DecompressionFailure::parse(TEXT),
            Some(DecompressionFailure {
                codec: 4,
                offset: 17,
                bytes: 14309,
                cause: "Local: Not implemented".to_owned(),
            })
        );
        assert_eq!(DecompressionFailure::parse("Connection refused"), None);
        assert_eq!(
            DecompressionFailure::parse(
                "Decompression (codec 0xZ) of message at 1 of 2 bytes failed"
            ),
            None
        );
    }

    fn tp(partition: i32) -> TopicPartition {
        TopicPartition::new("t", partition)
    }

    #[test]
    fn a_failure_is_placed_in_the_partition_standing_at_its_batch() {
        let health = ClientHealth::default();
        let now = Instant::now();
        health.client_error(Some("NotImplemented"), TEXT, now);
        let positions = [
            // Moving along elsewhere, caught up, and standing at the batch.
            (tp(0), FetchPosition { next: 30, end: 90 }),
            (tp(1), FetchPosition { next: 17, end: 17 }),
            (tp(2), FetchPosition { next: 17, end: 40 }),
        ];
        let found = health.place_failures(&positions, now);
        let names: Vec<i32> = found.iter().map(|(tp, _)| tp.partition).collect();
        assert_eq!(names, vec![2], "only the partition standing at the batch");
        assert_eq!(health.undecodable().len(), 1);
        // Found once: the next statistics do not report it again.
        assert!(health.place_failures(&positions, now).is_empty());
        // The group's offset moved past the batch: forgotten.
        let moved = [(tp(2), FetchPosition { next: 25, end: 40 })];
        health.place_failures(&moved, now + FAILURE_MEMORY);
        assert!(health.undecodable().is_empty());
    }

    #[test]
    fn old_failures_are_forgotten() {
        let health = ClientHealth::default();
        let then = Instant::now();
        health.client_error(None, TEXT, then);
        let positions = [(tp(0), FetchPosition { next: 17, end: 40 })];
        assert!(
            health
                .place_failures(&positions, then + FAILURE_MEMORY)
                .is_empty()
        );
    }

    #[test]
    fn all_brokers_down_lasts_until_one_answers() {
        let health = ClientHealth::default();
        let now = Instant::now();
        assert!(health.brokers_down().is_none());
        health.client_error(Some("AllBrokersDown"), "1/1 brokers are down", now);
        health.client_error(
            Some("Authentication"),
            "SASL authentication error: Authentication failed",
            now,
        );
        health.client_error(Some("AllBrokersDown"), "3/3 brokers are down", now);
        let (_, reason) = health.brokers_down().unwrap();
        assert_eq!(
            reason,
            "3/3 brokers are down; last: Authentication: SASL authentication error: \
             Authentication failed"
        );
        health.broker_up();
        assert!(health.brokers_down().is_none());
    }

    #[test]
    fn codecs_this_build_has_mean_a_corrupt_batch() {
        let mut failure = DecompressionFailure::parse(TEXT).unwrap();
        assert_eq!(failure.codec_name(), "zstd");
        assert!(failure.advice().contains("corrupt"));
        failure.codec = 5;
        assert!(failure.advice().contains("does not have"));
    }

    #[test]
    fn commits_refused_longer_than_a_rebalance_are_told_every_so_often_until_one_lands() {
        let health = ClientHealth::default();
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        // A rebalance: refused for a few seconds, then a commit lands.
        assert_eq!(health.commit_refused("UnknownMemberId", at(0)), None);
        assert_eq!(health.commit_refused("UnknownMemberId", at(5)), None);
        assert_eq!(health.commits_refused(at(5)), None);
        health.commit_confirmed();
        // Refused from 10 s on, for good.
        assert_eq!(health.commit_refused("UnknownMemberId", at(10)), None);
        assert_eq!(health.commit_refused("UnknownMemberId", at(39)), None);
        assert_eq!(
            health.commit_refused("UnknownMemberId", at(40)),
            Some(Duration::from_secs(30))
        );
        // Told once per 30 s, not at every refusal.
        assert_eq!(health.commit_refused("UnknownMemberId", at(41)), None);
        assert_eq!(health.commit_refused("UnknownMemberId", at(69)), None);
        assert_eq!(
            health.commit_refused("UnknownMemberId", at(70)),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            health.commits_refused(at(71)),
            Some((Duration::from_secs(61), "UnknownMemberId".to_owned()))
        );
        health.commit_confirmed();
        assert_eq!(health.commits_refused(at(72)), None);
    }
}
