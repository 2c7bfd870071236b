//! Generated ticket-event streams like the Ticket service's outbox publisher produces: keyed by
//! `ticket_id`, with redelivered duplicates and, on request, poison records. Deterministic for
//! a seed, so a failing run can be replayed.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message};

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRecord {
    pub key: Vec<u8>,
    /// `None` produces a tombstone.
    pub payload: Option<Vec<u8>>,
    /// Explicit partition (duplicates sent elsewhere), or `None` to partition by key.
    pub partition: Option<i32>,
    pub kind: RecordKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKind {
    /// The first delivery of an event.
    Event { event_id: String },
    /// A redelivery of an earlier event, byte for byte.
    Duplicate { event_id: String },
    /// A record that can never be decoded; `reason` is the expected reason code.
    Poison { reason: &'static str },
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    /// Records in all, duplicates and poison included.
    pub records: usize,
    /// Fraction of records that redeliver an earlier event.
    pub duplicates: f64,
    /// Fraction of records that are poison.
    pub poison: f64,
    /// Partitions of the topic; a share of duplicates goes to another partition than the
    /// original (a publisher whose partitioner changed) when there are several.
    pub partitions: i32,
    /// Prefix of every `event_id`, so runs against one database do not collide.
    pub id_prefix: String,
    /// Distinct tickets the events are spread over.
    pub tickets: u32,
    /// Payload size limit of the consumer, to make oversized poison.
    pub max_payload_bytes: usize,
    pub seed: u64,
}

const TRANSITIONS: [(&str, &str); 6] = [
    ("new", "open"),
    ("open", "in_progress"),
    ("in_progress", "waiting"),
    ("waiting", "in_progress"),
    ("in_progress", "resolved"),
    ("resolved", "closed"),
];

/// The payload of one event, as the Ticket service's outbox stores it.
pub fn event_payload(
    event_id: &str,
    ticket_id: &str,
    from: &str,
    to: &str,
    changed_at: DateTime<Utc>,
) -> Vec<u8> {
    format!(
        r#"{{"event_id":"{event_id}","ticket_id":"{ticket_id}","from_status":"{from}","to_status":"{to}","changed_at":"{}"}}"#,
        changed_at.format("%Y-%m-%dT%H:%M:%S%.3fZ")
    )
    .into_bytes()
}

/// An event with a free-text `note` of about `note_bytes` beside the five fields the service
/// reads, as a ticket system that ships its comments along might send it: prose from a
/// vocabulary of 400 words, so that it compresses as text does (zstd about 5 times, lz4 about
/// 2.5), deterministic for `seed`.
pub fn noted_event_payload(
    event_id: &str,
    ticket_id: &str,
    note_bytes: usize,
    seed: u64,
) -> Vec<u8> {
    // The vocabulary is the same for every note: words of 2 to 9 letters.
    let mut vocabulary_rng = SmallRng::seed_from_u64(0x5eed);
    let vocabulary: Vec<String> = (0..400)
        .map(|_| {
            let letters = vocabulary_rng.random_range(2..10);
            (0..letters)
                .map(|_| (b'a' + vocabulary_rng.random_range(0..26u8)) as char)
                .collect()
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut note = String::with_capacity(note_bytes + 16);
    while note.len() < note_bytes {
        note.push_str(&vocabulary[rng.random_range(0..vocabulary.len())]);
        note.push(if rng.random_bool(0.08) { '.' } else { ' ' });
    }
    format!(
        r#"{{"event_id":"{event_id}","ticket_id":"{ticket_id}","from_status":"open","to_status":"in_progress","changed_at":"2026-10-03T08:00:00.000Z","note":"{note}"}}"#
    )
    .into_bytes()
}

/// The three records of the seed scenario: event-ticket-900, the same again, event-ticket-901.
pub fn seed_records() -> Vec<PlannedRecord> {
    let at = |minute| Utc.with_ymd_and_hms(2026, 10, 3, 8, minute, 0).unwrap();
    let e900 = event_payload("event-ticket-900", "ticket-42", "open", "resolved", at(0));
    let e901 = event_payload("event-ticket-901", "ticket-42", "resolved", "closed", at(1));
    let record = |payload: Vec<u8>, kind| PlannedRecord {
        key: b"ticket-42".to_vec(),
        payload: Some(payload),
        partition: None,
        kind,
    };
    vec![
        record(
            e900.clone(),
            RecordKind::Event {
                event_id: "event-ticket-900".into(),
            },
        ),
        record(
            e900,
            RecordKind::Duplicate {
                event_id: "event-ticket-900".into(),
            },
        ),
        record(
            e901,
            RecordKind::Event {
                event_id: "event-ticket-901".into(),
            },
        ),
    ]
}

/// Every kind of poison record, cycled through by the generator.
pub const POISON_KINDS: [&str; 10] = [
    "not_json",
    "not_object",
    "missing_field",
    "empty_field",
    "wrong_type",
    "too_long",
    "bad_timestamp",
    "null_payload",
    "not_utf8",
    "too_large",
];

fn poison_payload(kind: &'static str, n: usize, max_payload_bytes: usize) -> Option<Vec<u8>> {
    let body = match kind {
        "not_json" => format!("ticket {n} moved to resolved"),
        "not_object" => format!("[\"event-{n}\"]"),
        "missing_field" => format!(
            r#"{{"event_id":"poison-{n}","ticket_id":"t","from_status":"open","changed_at":"2026-10-03T08:00:00Z"}}"#
        ),
        "empty_field" => format!(
            r#"{{"event_id":"poison-{n}","ticket_id":"","from_status":"open","to_status":"closed","changed_at":"2026-10-03T08:00:00Z"}}"#
        ),
        "wrong_type" => format!(
            r#"{{"event_id":{n},"ticket_id":"t","from_status":"open","to_status":"closed","changed_at":"2026-10-03T08:00:00Z"}}"#
        ),
        "too_long" => format!(
            r#"{{"event_id":"poison-{n}","ticket_id":"t","from_status":"{}","to_status":"closed","changed_at":"2026-10-03T08:00:00Z"}}"#,
            "x".repeat(200)
        ),
        "bad_timestamp" => format!(
            r#"{{"event_id":"poison-{n}","ticket_id":"t","from_status":"open","to_status":"closed","changed_at":"yesterday"}}"#
        ),
        "null_payload" => return None,
        "not_utf8" => {
            let mut bytes = b"{\"event_id\":\"poison-".to_vec();
            bytes.extend_from_slice(&[0xff, 0xfe]);
            bytes.extend_from_slice(b"\"}");
            return Some(bytes);
        }
        "too_large" => format!(
            r#"{{"event_id":"poison-{n}","padding":"{}"}}"#,
            "p".repeat(max_payload_bytes + 1)
        ),
        other => unreachable!("unknown poison kind {other}"),
    };
    Some(body.into_bytes())
}

/// How many distinct events a stream carries: the rows a correct consumer ends with.
pub fn distinct_events(records: &[PlannedRecord]) -> usize {
    records
        .iter()
        .filter(|r| matches!(r.kind, RecordKind::Event { .. }))
        .count()
}

/// Generates a stream as the spec says.
pub fn generate(spec: &WorkloadSpec) -> Vec<PlannedRecord> {
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    let mut records = Vec::with_capacity(spec.records);
    // The events produced so far, to redeliver: payload, key, original partition if explicit.
    let mut produced: Vec<(String, Vec<u8>, Vec<u8>)> = Vec::new();
    let mut ticket_state: HashMap<u32, usize> = HashMap::new();
    let start = Utc.with_ymd_and_hms(2026, 10, 1, 0, 0, 0).unwrap();
    let mut poison_count = 0usize;
    for n in 0..spec.records {
        let roll: f64 = rng.random();
        if roll < spec.poison {
            let kind = POISON_KINDS[poison_count % POISON_KINDS.len()];
            poison_count += 1;
            records.push(PlannedRecord {
                key: format!("poison-{n}").into_bytes(),
                payload: poison_payload(kind, n, spec.max_payload_bytes),
                partition: None,
                kind: RecordKind::Poison { reason: kind },
            });
            continue;
        }
        if roll < spec.poison + spec.duplicates && !produced.is_empty() {
            let pick = rng.random_range(0..produced.len());
            let (event_id, key, payload) = produced[pick].clone();
            let partition = (spec.partitions > 1 && rng.random_bool(0.3))
                .then(|| rng.random_range(0..spec.partitions));
            records.push(PlannedRecord {
                key,
                payload: Some(payload),
                partition,
                kind: RecordKind::Duplicate { event_id },
            });
            continue;
        }
        let ticket = rng.random_range(0..spec.tickets.max(1));
        let step = ticket_state.entry(ticket).or_insert(0);
        let (from, to) = TRANSITIONS[*step % TRANSITIONS.len()];
        *step += 1;
        let event_id = format!("{}-{n}", spec.id_prefix);
        let ticket_id = format!("ticket-{ticket}");
        let changed_at = start + chrono::Duration::milliseconds(n as i64 * 250);
        let payload = event_payload(&event_id, &ticket_id, from, to, changed_at);
        produced.push((
            event_id.clone(),
            ticket_id.clone().into_bytes(),
            payload.clone(),
        ));
        records.push(PlannedRecord {
            key: ticket_id.into_bytes(),
            payload: Some(payload),
            partition: None,
            kind: RecordKind::Event { event_id },
        });
    }
    records
}

/// Where each produced record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub index: usize,
    pub partition: i32,
    pub offset: i64,
}

struct DeliveryCollector {
    delivered: std::sync::Mutex<Vec<Delivered>>,
    failed: std::sync::atomic::AtomicUsize,
}

impl ClientContext for DeliveryCollector {}

impl ProducerContext for DeliveryCollector {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, result: &DeliveryResult<'_>, index: Box<usize>) {
        match result {
            Ok(message) => self.delivered.lock().unwrap().push(Delivered {
                index: *index,
                partition: message.partition(),
                offset: message.offset(),
            }),
            Err(_) => {
                self.failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// Sends one planned record, its index as the delivery opaque, waiting while the producer's
/// queue is full (a broker down, or a burst).
pub fn send<C>(
    producer: &ThreadedProducer<C>,
    topic: &str,
    planned: &PlannedRecord,
    index: usize,
) -> Result<(), KafkaError>
where
    C: ProducerContext<DeliveryOpaque = Box<usize>> + 'static,
{
    let mut opaque = Box::new(index);
    loop {
        let mut record = BaseRecord::with_opaque_to(topic, opaque).key(&planned.key[..]);
        if let Some(payload) = &planned.payload {
            record = record.payload(&payload[..]);
        }
        if let Some(partition) = planned.partition {
            record = record.partition(partition);
        }
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), record)) => {
                opaque = record.delivery_opaque;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((err, _)) => return Err(err),
        }
    }
}

/// Produces the records (idempotent producer, acks=all) and waits for every delivery.
/// Returns where each landed, in input order.
pub fn produce(
    brokers: &str,
    topic: &str,
    records: &[PlannedRecord],
) -> Result<Vec<Delivered>, KafkaError> {
    produce_with(brokers, topic, records, &[])
}

/// [`produce`], with more librdkafka properties set on the producer (security, compression).
pub fn produce_with(
    brokers: &str,
    topic: &str,
    records: &[PlannedRecord],
    properties: &[(&str, &str)],
) -> Result<Vec<Delivered>, KafkaError> {
    let context = DeliveryCollector {
        delivered: std::sync::Mutex::new(Vec::with_capacity(records.len())),
        failed: Default::default(),
    };
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("message.max.bytes", "10000000")
        .set("queue.buffering.max.messages", "200000");
    for (key, value) in properties {
        config.set(*key, *value);
    }
    let producer: ThreadedProducer<DeliveryCollector> = config.create_with_context(context)?;
    for (index, planned) in records.iter().enumerate() {
        send(&producer, topic, planned, index)?;
    }
    producer.flush(Duration::from_secs(120))?;
    let context = producer.context();
    let failed = context.failed.load(std::sync::atomic::Ordering::Relaxed);
    if failed > 0 {
        return Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fail));
    }
    let mut delivered = std::mem::take(&mut *context.delivered.lock().unwrap());
    delivered.sort_by_key(|d| d.index);
    Ok(delivered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_service::domain::HistoryEvent;

    fn spec() -> WorkloadSpec {
        WorkloadSpec {
            records: 2000,
            duplicates: 0.1,
            poison: 0.02,
            partitions: 4,
            id_prefix: "t".into(),
            tickets: 50,
            max_payload_bytes: 4096,
            seed: 7,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        assert_eq!(generate(&spec()), generate(&spec()));
    }

    #[test]
    fn events_decode_and_poison_fails_with_its_reason() {
        for record in generate(&spec()) {
            let decoded = HistoryEvent::decode(record.payload.as_deref(), 4096);
            match record.kind {
                RecordKind::Event { event_id } | RecordKind::Duplicate { event_id } => {
                    assert_eq!(decoded.unwrap().event_id, event_id)
                }
                RecordKind::Poison { reason } => assert_eq!(decoded.unwrap_err().code(), reason),
            }
        }
    }

    #[test]
    fn the_mix_is_roughly_as_asked() {
        let records = generate(&spec());
        let duplicates = records
            .iter()
            .filter(|r| matches!(r.kind, RecordKind::Duplicate { .. }))
            .count();
        let poison = records
            .iter()
            .filter(|r| matches!(r.kind, RecordKind::Poison { .. }))
            .count();
        assert!((150..250).contains(&duplicates), "{duplicates}");
        assert!((20..60).contains(&poison), "{poison}");
    }

    #[test]
    fn the_seed_records_decode_to_the_seed_events() {
        let seed = seed_records();
        let events: Vec<HistoryEvent> = seed
            .iter()
            .map(|r| HistoryEvent::decode(r.payload.as_deref(), 1024).unwrap())
            .collect();
        assert_eq!(events[0], events[1]);
        assert_eq!(events[2].event_id, "event-ticket-901");
        assert_eq!(events[2].ticket_id, "ticket-42");
    }
}
