//! What the pipeline counts: Prometheus families prefixed `history_` (through the `metrics`
//! facade; a no-op until a recorder is installed). [`Stats`] keeps, besides, the few tallies the
//! process reads back itself — the outcomes and retries its exit line and the demo's report
//! print, the pauses, when the first record came — and the write health behind readiness.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::domain::{CommitReason, TopicPartition};

pub const EVENTS_TOTAL: &str = "history_events_total";
pub const DEAD_LETTERS_TOTAL: &str = "history_dead_letters_total";
pub const CONFLICTING_DUPLICATES_TOTAL: &str = "history_conflicting_duplicates_total";
pub const DEAD_LETTER_CONFLICTS_TOTAL: &str = "history_dead_letter_conflicts_total";
pub const RECORDS_FETCHED_TOTAL: &str = "history_records_fetched_total";
pub const TRANSACTION_SECONDS: &str = "history_transaction_seconds";
pub const BATCH_EVENTS: &str = "history_batch_events";
/// The most events a writer's next batch may hold (label: writer): `pipeline.batch_max_events`,
/// less after a batch timed out or while full ones take longer than `pipeline.batch_aim_ms`.
pub const BATCH_MAX_EVENTS: &str = "history_batch_max_events";
pub const RETRIES_TOTAL: &str = "history_retries_total";
pub const REBALANCES_TOTAL: &str = "history_rebalances_total";
pub const COMMITS_TOTAL: &str = "history_offset_commits_total";
pub const COMMITTED_OFFSET: &str = "history_committed_offset";
pub const CONSUMER_LAG: &str = "history_consumer_lag";
pub const IN_FLIGHT: &str = "history_in_flight";
/// Records taken from the Kafka client whose outcome is not known yet, in all partitions: what
/// `pipeline.max_in_flight` bounds.
pub const HELD_RECORDS: &str = "history_held_records";
/// `pipeline.max_in_flight`, so dashboards can compare `history_held_records` with it.
pub const HELD_RECORDS_LIMIT: &str = "history_held_records_limit";
/// The most records held at once since start-up: how much of `pipeline.max_in_flight` a
/// backlog really used (and proof that it never passed it).
pub const HELD_RECORDS_PEAK: &str = "history_held_records_peak";
/// The bytes of those records (keys, payloads and a fixed overhead each): what the service's
/// half of `pipeline.max_in_flight_bytes` bounds.
pub const HELD_BYTES: &str = "history_held_bytes";
/// The service's half of `pipeline.max_in_flight_bytes`.
pub const HELD_BYTES_LIMIT: &str = "history_held_bytes_limit";
/// Times the budget stayed full and every partition's fetching was paused.
pub const INSTANCE_PAUSES_TOTAL: &str = "history_instance_pauses_total";
pub const ASSIGNED_PARTITIONS: &str = "history_assigned_partitions";
pub const PARTITION_PAUSES_TOTAL: &str = "history_partition_pauses_total";
/// Records skipped because the group's position was behind the log start (retention deleted
/// them before they were processed): how often it happened, and how many records were lost.
pub const OFFSET_RESETS_TOTAL: &str = "history_offset_resets_total";
pub const OFFSET_RESET_SKIPPED_RECORDS_TOTAL: &str = "history_offset_reset_skipped_records_total";
/// Times a partition's log moved back within one assignment (a topic created again, a log
/// truncated): the records from there on were processed as new, and its position went back.
pub const OFFSET_REWINDS_TOTAL: &str = "history_offset_rewinds_total";
/// Records not written because the partition's previous owner listed them as done in the
/// metadata of the position it committed: rework a handover, a restart or a crash did not cost.
pub const RECORDS_SKIPPED_AS_DONE_TOTAL: &str = "history_records_skipped_as_done_total";
/// 1 while an event the database keeps rejecting holds its partition's position; labels name
/// topic, partition, offset, event_id and the server's SQLSTATE. 0 once it resolved.
pub const STUCK_EVENT: &str = "history_stuck_event";
/// Failed attempts to publish a stored dead letter to `dead_letter.topic` (the relay retries).
pub const DEAD_LETTER_PUBLISH_FAILURES_TOTAL: &str = "history_dead_letter_publish_failures_total";
/// 1 while `/readyz` would answer 200, 0 otherwise (for alerting without a blackbox probe).
pub const READY: &str = "history_ready";
/// `pipeline.max_in_flight_per_partition`, so alerts can compare `history_in_flight` with it.
pub const WINDOW_LIMIT: &str = "history_window_limit";
/// Database work abandoned at its deadline (`database.statement_timeout_ms`): a transaction that
/// did not return, its connection closed and every older one replaced.
pub const DB_TIMEOUTS_TOTAL: &str = "history_db_timeouts_total";
/// Client errors of librdkafka, by error name (the logs aggregate repeats of one error).
pub const KAFKA_CLIENT_ERRORS_TOTAL: &str = "history_kafka_client_errors_total";

/// 1 while a partition stands still at a record batch the Kafka client cannot decompress
/// (labels: topic, partition, the batch's offset, its codec); 0 once it moved past it.
pub const UNDECODABLE_BATCH: &str = "history_undecodable_batch";
/// Records below the group's committed position whose trace (inbox marker, dead letter) the
/// database lacks, among the newest checked when the partition was assigned: above 0, the
/// database was restored from a backup or emptied while the group's offsets stayed.
pub const DATABASE_BEHIND: &str = "history_database_behind";
/// 1 while no Kafka broker answers the client (librdkafka reported every broker down), else 0.
pub const KAFKA_UNREACHABLE: &str = "history_kafka_unreachable";
/// Brokers of the cluster the Kafka client knows of (from its statistics).
pub const KAFKA_BROKERS: &str = "history_kafka_brokers";
/// The brokers the consumer's fetch requests were sized for at start-up.
pub const FETCH_SIZED_BROKERS: &str = "history_fetch_sized_brokers";
pub const PARTITIONS_IN_TURN: &str = "history_partitions_in_turn";
/// Assigned partitions without a queue of their own, taken from the consumer queue in fetch
/// order.
pub const PARTITIONS_IN_FETCH_ORDER: &str = "history_partitions_in_fetch_order";
/// Backlogged partitions paused while others hold the seats of the rotation.
pub const PARTITIONS_WAITING_TURN: &str = "history_partitions_waiting_turn";
/// How much the fetched record batches decompressed by, over the last statistics interval.
pub const FETCH_COMPRESSION_RATIO: &str = "history_fetch_compression_ratio";
/// `kafka.max_compression_ratio`, the ratio the fetch requests were sized for.
pub const FETCH_COMPRESSION_RATIO_LIMIT: &str = "history_fetch_compression_ratio_limit";
/// What the Kafka client holds in memory: glibc's heap in use, which only librdkafka (and the
/// C libraries it uses) allocates from.
pub const KAFKA_CLIENT_HEAP_BYTES: &str = "history_kafka_client_heap_bytes";
/// The client's half of `pipeline.max_in_flight_bytes`: its queue and its fetch responses.
pub const KAFKA_CLIENT_HEAP_LIMIT: &str = "history_kafka_client_heap_limit";

/// 1, labelled with the consumer group protocol that runs (`classic`, `consumer`) and the
/// membership (`static` with `kafka.group_instance_id`, else `dynamic`).
pub const GROUP_PROTOCOL_INFO: &str = "history_group_protocol_info";
/// 1 while a topic listed in `kafka.topics` does not exist on the cluster, 0 once it does.
pub const TOPIC_MISSING: &str = "history_topic_missing";

/// Label values of `history_rebalances_total{kind}`.
pub const REBALANCE_KINDS: [&str; 3] = ["assign", "revoke", "lost"];
/// Label values of `history_offset_commits_total{result}`.
pub const COMMIT_RESULTS: [&str; 3] = ["ok", "error", "held"];

/// Gives every family its HELP text and starts the counters whose labels are known in advance
/// at 0, so that `/metrics` shows them before their first event and alerts on `increase()` see
/// that first event. Families with per-partition or open-ended labels (reasons, error names)
/// appear when they are first set. Call once, after the recorder is installed.
pub fn register_families() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        EVENTS_TOTAL,
        "Records by outcome; `unknown` counts failed write attempts (retried)."
    );
    describe_counter!(
        DEAD_LETTERS_TOTAL,
        "Records that cannot be decoded, stored in dead_letters, by reason code."
    );
    describe_counter!(
        CONFLICTING_DUPLICATES_TOTAL,
        "Redeliveries of an event_id with different content (the stored row is kept)."
    );
    describe_counter!(
        DEAD_LETTER_CONFLICTS_TOTAL,
        "Dead letters whose coordinates were already stored with other bytes."
    );
    describe_counter!(RECORDS_FETCHED_TOTAL, "Records fetched from Kafka.");
    describe_histogram!(
        TRANSACTION_SECONDS,
        Unit::Seconds,
        "Duration of one write transaction (a batch)."
    );
    describe_histogram!(BATCH_EVENTS, "Events per write transaction.");
    describe_gauge!(
        BATCH_MAX_EVENTS,
        "The most events the writer's next batch may hold: pipeline.batch_max_events, less after \
         a batch timed out or while full batches take longer than pipeline.batch_aim_ms."
    );
    describe_counter!(RETRIES_TOTAL, "Writes retried after an Unknown outcome.");
    describe_counter!(REBALANCES_TOTAL, "Consumer group rebalances, by kind.");
    describe_counter!(COMMITS_TOTAL, "Offset commits, by reason and result.");
    describe_gauge!(COMMITTED_OFFSET, "The partition's last committed position.");
    describe_gauge!(
        CONSUMER_LAG,
        "Records between the end of the partition and the committed position."
    );
    describe_gauge!(
        IN_FLIGHT,
        "Records in the partition's window (unresolved, and resolved behind them)."
    );
    describe_gauge!(
        HELD_RECORDS,
        "Records taken from Kafka whose outcome is not known yet, in all partitions."
    );
    describe_gauge!(HELD_RECORDS_LIMIT, "pipeline.max_in_flight.");
    describe_gauge!(
        HELD_RECORDS_PEAK,
        "The most records held at once since start-up."
    );
    describe_gauge!(
        HELD_BYTES,
        "Bytes of the records taken from Kafka whose outcome is not known yet."
    );
    describe_gauge!(
        HELD_BYTES_LIMIT,
        "The service's half of pipeline.max_in_flight_bytes."
    );
    describe_counter!(
        INSTANCE_PAUSES_TOTAL,
        "Times the budget stayed full and every partition's fetching was paused."
    );
    describe_gauge!(ASSIGNED_PARTITIONS, "Partitions assigned to this replica.");
    describe_gauge!(
        DATABASE_BEHIND,
        "Records below the committed position whose trace the database lacks (checked at assignment)."
    );
    describe_counter!(
        PARTITION_PAUSES_TOTAL,
        "Times a partition's window filled and its fetching was paused."
    );
    describe_counter!(
        OFFSET_RESETS_TOTAL,
        "Positions reset because retention deleted records before they were recorded."
    );
    describe_counter!(
        OFFSET_RESET_SKIPPED_RECORDS_TOTAL,
        "Records skipped by offset resets: lost to the projection."
    );
    describe_counter!(
        OFFSET_REWINDS_TOTAL,
        "Times the partition's log moved back within one assignment (re-created, truncated)."
    );
    describe_counter!(
        RECORDS_SKIPPED_AS_DONE_TOTAL,
        "Records skipped because the previous owner's commit listed them as done."
    );
    describe_gauge!(
        STUCK_EVENT,
        "1 while an event the database keeps rejecting holds its partition."
    );
    describe_counter!(
        DEAD_LETTER_PUBLISH_FAILURES_TOTAL,
        "Dead letters stored but not published to dead_letter.topic."
    );
    describe_gauge!(READY, "1 while /readyz answers 200, else 0.");
    describe_counter!(
        DB_TIMEOUTS_TOTAL,
        "Write transactions abandoned at database.statement_timeout_ms (retried on a fresh connection)."
    );
    describe_gauge!(WINDOW_LIMIT, "pipeline.max_in_flight_per_partition.");
    describe_gauge!(
        GROUP_PROTOCOL_INFO,
        "1, labelled with the consumer group protocol and the membership (static or dynamic)."
    );
    describe_gauge!(
        TOPIC_MISSING,
        "1 while a topic in kafka.topics does not exist on the cluster, else 0."
    );
    describe_counter!(
        KAFKA_CLIENT_ERRORS_TOTAL,
        "Errors reported by the Kafka client, by error name."
    );
    describe_gauge!(
        UNDECODABLE_BATCH,
        "1 while the partition stands still at a record batch the client cannot decompress."
    );
    describe_gauge!(
        KAFKA_UNREACHABLE,
        "1 while no Kafka broker answers the client, else 0."
    );
    describe_gauge!(
        KAFKA_BROKERS,
        "Brokers of the cluster the Kafka client knows of."
    );
    describe_gauge!(
        FETCH_SIZED_BROKERS,
        "Brokers the consumer's fetch requests were sized for at start-up."
    );
    describe_gauge!(
        PARTITIONS_IN_TURN,
        "1 when each assigned partition has a queue of its own and the partitions take turns; \
         0 when some or all are taken in the order they were fetched (their record batches \
         outgrew their turn, or the budget cannot hold a few small batches of each partition)."
    );
    describe_gauge!(
        PARTITIONS_IN_FETCH_ORDER,
        "Assigned partitions taken from the consumer queue in the order they were fetched, \
         not in turn: after a fetched record batch outgrew a partition's share, those with \
         more records to read than fit a turn (or every assigned partition, when the budget \
         cannot give each a turn)."
    );
    describe_gauge!(
        PARTITIONS_WAITING_TURN,
        "Backlogged partitions paused until a seat of the rotation is theirs: after a fetched \
         record batch outgrew a partition's share, at most as many backlogged partitions fetch \
         at once as the client's part of the budget holds batches of that size, each for a \
         slice of time."
    );
    describe_gauge!(
        FETCH_COMPRESSION_RATIO,
        "Decompressed record bytes per fetched byte, over the last statistics interval."
    );
    describe_gauge!(
        FETCH_COMPRESSION_RATIO_LIMIT,
        "kafka.max_compression_ratio: the ratio the fetch requests were sized for."
    );
    describe_gauge!(
        KAFKA_CLIENT_HEAP_BYTES,
        "Bytes the Kafka client holds in memory (glibc's heap in use)."
    );
    describe_gauge!(
        KAFKA_CLIENT_HEAP_LIMIT,
        "The Kafka client's half of pipeline.max_in_flight_bytes."
    );

    set_kafka_unreachable(false);
    for counter in [
        CONFLICTING_DUPLICATES_TOTAL,
        DEAD_LETTER_CONFLICTS_TOTAL,
        RECORDS_FETCHED_TOTAL,
        RETRIES_TOTAL,
        PARTITION_PAUSES_TOTAL,
        INSTANCE_PAUSES_TOTAL,
        DEAD_LETTER_PUBLISH_FAILURES_TOTAL,
        DB_TIMEOUTS_TOTAL,
    ] {
        metrics::counter!(counter).increment(0);
    }
    for class in [
        OutcomeClass::Applied,
        OutcomeClass::AlreadyApplied,
        OutcomeClass::Unknown,
        OutcomeClass::DeadLetter,
    ] {
        metrics::counter!(EVENTS_TOTAL, "outcome" => class.label()).increment(0);
    }
    for kind in REBALANCE_KINDS {
        metrics::counter!(REBALANCES_TOTAL, "kind" => kind).increment(0);
    }
    for reason in [
        CommitReason::Periodic,
        CommitReason::Reassert,
        CommitReason::Revoke,
        CommitReason::Shutdown,
    ] {
        for result in COMMIT_RESULTS {
            let labels = [("reason", reason.as_str()), ("result", result)];
            metrics::counter!(COMMITS_TOTAL, &labels).increment(0);
        }
    }
}

/// How many records a partition's window may hold, for comparison with `history_in_flight`.
pub fn set_window_limit(limit: usize) {
    metrics::gauge!(WINDOW_LIMIT).set(limit as f64);
}

/// Sets `history_batch_max_events` of writer `writer`.
pub fn set_batch_max_events(writer: usize, events: usize) {
    metrics::gauge!(BATCH_MAX_EVENTS, "writer" => writer.to_string()).set(events as f64);
}

/// What the service may hold in all, for comparison with `history_held_records` and
/// `history_held_bytes`.
pub fn set_held_limits(records: usize, bytes: usize) {
    metrics::gauge!(HELD_RECORDS_LIMIT).set(records as f64);
    metrics::gauge!(HELD_BYTES_LIMIT).set(bytes as f64);
}

/// Outcome classes, as the `outcome` label of `history_events_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    Applied,
    AlreadyApplied,
    Unknown,
    DeadLetter,
}

impl OutcomeClass {
    pub fn label(self) -> &'static str {
        match self {
            OutcomeClass::Applied => "applied",
            OutcomeClass::AlreadyApplied => "already_applied",
            OutcomeClass::Unknown => "unknown",
            OutcomeClass::DeadLetter => "dead_letter",
        }
    }
}

/// The tallies the process reads back itself, shared by the actors. Everything else is counted
/// only in Prometheus.
#[derive(Debug, Default)]
pub struct Stats {
    pub applied: AtomicU64,
    pub already_applied: AtomicU64,
    pub unknown: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub retries: AtomicU64,
    pub pauses: AtomicU64,
    /// Events the database kept rejecting whose retries stopped because their partition was
    /// revoked: their next owner writes them.
    pub stuck_handed_over: AtomicU64,
    /// When the first record was fetched: the demo measures its throughput from here.
    pub first_fetch: std::sync::OnceLock<std::time::Instant>,
    /// Whether writes succeed, for readiness.
    pub writes: crate::health::writes::WriteHealth,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub applied: u64,
    pub already_applied: u64,
    pub unknown: u64,
    pub dead_lettered: u64,
    pub retries: u64,
    pub pauses: u64,
}

impl StatsSnapshot {
    /// Records whose offset is resolved.
    pub fn resolved(&self) -> u64 {
        self.applied + self.already_applied + self.dead_lettered
    }
}

impl Stats {
    pub fn new() -> Arc<Self> {
        Arc::new(Stats::default())
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StatsSnapshot {
            applied: get(&self.applied),
            already_applied: get(&self.already_applied),
            unknown: get(&self.unknown),
            dead_lettered: get(&self.dead_lettered),
            retries: get(&self.retries),
            pauses: get(&self.pauses),
        }
    }

    pub fn outcomes(&self, class: OutcomeClass, count: u64) {
        if count == 0 {
            return;
        }
        let counter = match class {
            OutcomeClass::Applied => &self.applied,
            OutcomeClass::AlreadyApplied => &self.already_applied,
            OutcomeClass::Unknown => &self.unknown,
            OutcomeClass::DeadLetter => &self.dead_lettered,
        };
        counter.fetch_add(count, Ordering::Relaxed);
        metrics::counter!(EVENTS_TOTAL, "outcome" => class.label()).increment(count);
    }

    pub fn dead_letter_reason(&self, reason_code: &'static str) {
        metrics::counter!(DEAD_LETTERS_TOTAL, "reason" => reason_code).increment(1);
    }

    pub fn conflicting_duplicate(&self) {
        metrics::counter!(CONFLICTING_DUPLICATES_TOTAL).increment(1);
    }

    pub fn dead_letter_conflict(&self) {
        metrics::counter!(DEAD_LETTER_CONFLICTS_TOTAL).increment(1);
    }

    pub fn records_fetched(&self, count: u64) {
        self.first_fetch.get_or_init(std::time::Instant::now);
        metrics::counter!(RECORDS_FETCHED_TOTAL).increment(count);
    }

    pub fn transaction(&self, elapsed: Duration, events: usize) {
        metrics::histogram!(TRANSACTION_SECONDS).record(elapsed.as_secs_f64());
        metrics::histogram!(BATCH_EVENTS).record(events as f64);
    }

    /// A partition's window filled up and its fetching was paused (backpressure).
    pub fn pause(&self) {
        self.pauses.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(PARTITION_PAUSES_TOTAL).increment(1);
    }

    /// A write was abandoned at its deadline.
    pub fn db_timeout(&self) {
        metrics::counter!(DB_TIMEOUTS_TOTAL).increment(1);
    }

    pub fn retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(RETRIES_TOTAL).increment(1);
    }

    pub fn rebalance(&self, kind: &'static str) {
        metrics::counter!(REBALANCES_TOTAL, "kind" => kind).increment(1);
    }

    pub fn commit(&self, reason: &'static str, result: &'static str) {
        metrics::counter!(COMMITS_TOTAL, "reason" => reason, "result" => result).increment(1);
    }
}

fn partition_labels(tp: &TopicPartition) -> [(&'static str, String); 2] {
    [
        ("topic", tp.topic.to_string()),
        ("partition", tp.partition.to_string()),
    ]
}

pub fn set_committed_offset(tp: &TopicPartition, offset: i64) {
    metrics::gauge!(COMMITTED_OFFSET, &partition_labels(tp)).set(offset as f64);
}

pub fn set_consumer_lag(tp: &TopicPartition, lag: i64) {
    metrics::gauge!(CONSUMER_LAG, &partition_labels(tp)).set(lag as f64);
}

pub fn set_in_flight(tp: &TopicPartition, len: usize) {
    in_flight(tp).set(len as f64);
}

/// The partition's in-flight gauge, for an owner that sets it at every admit and every move of
/// its window: looked up once, rather than labels built and found each time.
pub fn in_flight(tp: &TopicPartition) -> metrics::Gauge {
    metrics::gauge!(IN_FLIGHT, &partition_labels(tp))
}

pub fn set_ready(ready: bool) {
    metrics::gauge!(READY).set(if ready { 1.0 } else { 0.0 });
}

/// Says which group protocol runs, and whether as a static member.
pub fn set_group_protocol(protocol: &'static str, static_member: bool) {
    let membership = if static_member { "static" } else { "dynamic" };
    metrics::gauge!(GROUP_PROTOCOL_INFO, "protocol" => protocol, "membership" => membership)
        .set(1.0);
}

/// Whether a configured topic is missing from the cluster.
pub fn set_topic_missing(topic: &str, missing: bool) {
    metrics::gauge!(TOPIC_MISSING, "topic" => topic.to_owned()).set(if missing {
        1.0
    } else {
        0.0
    });
}

pub fn set_assigned_partitions(count: usize) {
    metrics::gauge!(ASSIGNED_PARTITIONS).set(count as f64);
}

/// Declares a partition's offset-reset and rewind counters at 0, so the first is an increase.
pub fn init_offset_resets(tp: &TopicPartition) {
    let labels = partition_labels(tp);
    metrics::counter!(OFFSET_RESETS_TOTAL, &labels).increment(0);
    metrics::counter!(OFFSET_RESET_SKIPPED_RECORDS_TOTAL, &labels).increment(0);
    metrics::counter!(OFFSET_REWINDS_TOTAL, &labels).increment(0);
    metrics::counter!(RECORDS_SKIPPED_AS_DONE_TOTAL, &labels).increment(0);
}

/// Records of a partition skipped: its previous owner listed them as done.
pub fn records_skipped_as_done(tp: &TopicPartition, records: u64) {
    metrics::counter!(RECORDS_SKIPPED_AS_DONE_TOTAL, &partition_labels(tp)).increment(records);
}

/// A partition's log moved back within its assignment.
pub fn offset_rewind(tp: &TopicPartition) {
    metrics::counter!(OFFSET_REWINDS_TOTAL, &partition_labels(tp)).increment(1);
}

/// An offset reset skipped `skipped` records the broker no longer had.
pub fn offset_reset(tp: &TopicPartition, skipped: u64) {
    let labels = partition_labels(tp);
    metrics::counter!(OFFSET_RESETS_TOTAL, &labels).increment(1);
    metrics::counter!(OFFSET_RESET_SKIPPED_RECORDS_TOTAL, &labels).increment(skipped);
}

/// One Kafka client error, labelled by its code name (bounded, never free text).
pub fn kafka_client_error(name: &str) {
    metrics::counter!(KAFKA_CLIENT_ERRORS_TOTAL, "error" => name.to_owned()).increment(1);
}

/// Sets `history_stuck_event` for an event the database rejects: 1 while it is stuck, 0 once
/// it resolved (the series stays, at 0, so an alert on it clears).
pub fn set_stuck_event(
    tp: &TopicPartition,
    offset: i64,
    event_id: &str,
    sqlstate: &str,
    stuck: bool,
) {
    let [topic, partition] = partition_labels(tp);
    let labels = [
        topic,
        partition,
        ("offset", offset.to_string()),
        ("event_id", event_id.to_owned()),
        ("sqlstate", sqlstate.to_owned()),
    ];
    metrics::gauge!(STUCK_EVENT, &labels).set(if stuck { 1.0 } else { 0.0 });
}

/// Sets `history_database_behind` for a partition just checked (0: every trace present).
pub fn set_database_behind(tp: &TopicPartition, untraced: usize) {
    metrics::gauge!(DATABASE_BEHIND, &partition_labels(tp)).set(untraced as f64);
}

/// Sets `history_undecodable_batch` for a batch the client cannot decompress: 1 while its
/// partition stands still at it, 0 once it moved on (the series stays, so an alert clears).
pub fn set_undecodable_batch(tp: &TopicPartition, offset: i64, codec: &str, stuck: bool) {
    let [topic, partition] = partition_labels(tp);
    let labels = [
        topic,
        partition,
        ("offset", offset.to_string()),
        ("codec", codec.to_owned()),
    ];
    metrics::gauge!(UNDECODABLE_BATCH, &labels).set(if stuck { 1.0 } else { 0.0 });
}

/// Whether every Kafka broker is unreachable.
pub fn set_kafka_unreachable(unreachable: bool) {
    metrics::gauge!(KAFKA_UNREACHABLE).set(if unreachable { 1.0 } else { 0.0 });
}

/// What the fetch requests were sized for: brokers, the compression ratio, the client's share.
pub fn set_fetch_sizing(brokers: usize, ratio: usize, client_bytes: usize) {
    metrics::gauge!(FETCH_SIZED_BROKERS).set(brokers as f64);
    metrics::gauge!(FETCH_COMPRESSION_RATIO_LIMIT).set(ratio as f64);
    metrics::gauge!(KAFKA_CLIENT_HEAP_LIMIT).set(client_bytes as f64);
}

/// Whether the partitions take turns (`crate::kafka::split_queues`).
pub fn set_partitions_in_turn(in_turn: bool) {
    metrics::gauge!(PARTITIONS_IN_TURN).set(if in_turn { 1.0 } else { 0.0 });
}

/// How many assigned partitions are taken in fetch order (`crate::kafka::split_queues`).
pub fn set_partitions_in_fetch_order(partitions: usize) {
    metrics::gauge!(PARTITIONS_IN_FETCH_ORDER).set(partitions as f64);
}

/// How many backlogged partitions wait for their turn (`crate::domain::rotation`).
pub fn set_partitions_waiting_turn(partitions: usize) {
    metrics::gauge!(PARTITIONS_WAITING_TURN).set(partitions as f64);
}

/// What the client's statistics say of the cluster and the fetched batches, and what the
/// client holds in memory.
pub fn set_fetch_observed(brokers: usize, ratio: Option<f64>, heap: Option<u64>) {
    metrics::gauge!(KAFKA_BROKERS).set(brokers as f64);
    if let Some(ratio) = ratio {
        metrics::gauge!(FETCH_COMPRESSION_RATIO).set(ratio);
    }
    if let Some(heap) = heap {
        metrics::gauge!(KAFKA_CLIENT_HEAP_BYTES).set(heap as f64);
    }
}

/// Failed attempts to publish a dead letter to `dead_letter.topic` (the letter is stored; the
/// relay retries it).
pub fn dead_letter_publish_failures(count: u64) {
    metrics::counter!(DEAD_LETTER_PUBLISH_FAILURES_TOTAL).increment(count);
}

/// Where `history_held_records` and `history_held_bytes` are read from when `/metrics` is
/// rendered: each live budget's level, `None` once it is gone. The level changes twice per
/// record, on the thread that takes it and on the writer's that drops it; a gauge kept in step
/// cost each change two more atomic updates of cache lines the other core holds.
pub(crate) type HeldLevel = Box<dyn Fn() -> Option<(usize, usize)> + Send + Sync>;

static HELD_LEVELS: Mutex<Vec<HeldLevel>> = Mutex::new(Vec::new());

/// Adds a budget's level to what the held gauges show.
pub(crate) fn show_held_level(level: HeldLevel) {
    HELD_LEVELS.lock().unwrap().push(level);
}

/// Sets the gauges read at a scrape rather than on every change: called just before `/metrics`
/// is rendered.
pub fn sample_for_scrape() {
    let mut levels = HELD_LEVELS.lock().unwrap();
    let mut held = (0, 0);
    levels.retain(|level| match level() {
        Some((records, bytes)) => {
            held = (held.0 + records, held.1 + bytes);
            true
        }
        None => false,
    });
    drop(levels);
    metrics::gauge!(HELD_RECORDS).set(held.0 as f64);
    metrics::gauge!(HELD_BYTES).set(held.1 as f64);
}
