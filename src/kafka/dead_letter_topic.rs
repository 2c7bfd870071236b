//! Publishing dead letters to a Kafka topic as well, with headers naming where each came from
//! and why — the convention of Kafka Connect's and Spring's dead-letter topics.

use std::time::Duration;

use std::sync::Arc;

use futures::future::join_all;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::config::KafkaSettings;
use crate::domain::backoff::Backoff;
use crate::metrics;
use crate::store::dead_letters::{self, PendingLetter, PublishRound};
use crate::store::{PgPool, StoreError};

pub const HEADER_TOPIC: &str = "history.dlq.original.topic";
pub const HEADER_PARTITION: &str = "history.dlq.original.partition";
pub const HEADER_OFFSET: &str = "history.dlq.original.offset";
pub const HEADER_REASON_CODE: &str = "history.dlq.reason.code";
pub const HEADER_REASON: &str = "history.dlq.reason";

/// How many letters one round of the relay publishes at most.
const ROUND_LIMIT: i64 = 500;

/// A producer for the configured dead-letter topic.
///
/// The `dead_letters` table is the source of truth: a writer stores a letter (its offset then
/// resolves) and marks it to be published; the relay ([`spawn_relay`]) publishes it in the
/// background. A topic that is missing, denied or refuses the record therefore never blocks a
/// partition: the failure is recorded on the row and retried with backoff.
pub struct DeadLetterPublisher {
    producer: FutureProducer,
    topic: String,
    /// Wakes the relay when letters were stored.
    wake: Notify,
}

impl DeadLetterPublisher {
    pub fn new(settings: &KafkaSettings, topic: &str) -> Result<Self, super::KafkaSetupError> {
        let mut config = super::producer_config(settings)?;
        // A letter's delivery is awaited while its row is locked: bound it (librdkafka's
        // default is five minutes) unless the operator chose a value.
        if config.get("message.timeout.ms").is_none() {
            config.set("message.timeout.ms", "30000");
        }
        let producer = super::create_client("producer", settings, || config.create())?;
        Ok(DeadLetterPublisher {
            producer,
            topic: topic.to_owned(),
            wake: Notify::new(),
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Tells the relay that letters are waiting. Never blocks.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Publishes up to [`ROUND_LIMIT`] pending letters and records how each went.
    pub async fn publish_round(&self, pool: &PgPool) -> Result<PublishRound, StoreError> {
        let round = dead_letters::publish_pending(pool, &self.topic, ROUND_LIMIT, |letters| {
            join_all(letters.into_iter().map(|letter| async move {
                self.publish_one(&letter)
                    .await
                    .map_err(|err| err.to_string())
            }))
        })
        .await?;
        if round.failed > 0 {
            metrics::dead_letter_publish_failures(round.failed as u64);
        }
        Ok(round)
    }

    async fn publish_one(&self, letter: &PendingLetter) -> Result<(), KafkaError> {
        let partition = letter.partition.to_string();
        let offset = letter.offset.to_string();
        let headers = OwnedHeaders::new()
            .insert(header(HEADER_TOPIC, &letter.topic))
            .insert(header(HEADER_PARTITION, &partition))
            .insert(header(HEADER_OFFSET, &offset))
            .insert(header(HEADER_REASON_CODE, &letter.reason_code))
            .insert(header(HEADER_REASON, &letter.reason));
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic).headers(headers);
        if let Some(key) = &letter.key {
            record = record.key(&key[..]);
        }
        if let Some(payload) = &letter.payload {
            record = record.payload(&payload[..]);
        }
        self.producer
            .send(record, Duration::from_secs(30))
            .await
            .map(|_| ())
            .map_err(|(err, _)| err)
    }
}

/// The relay, to run as a task until the pipeline stops: it publishes pending letters when
/// woken (and every `retry_max` anyway, for letters left by another replica or an earlier run);
/// after a failure it waits `retry_initial`, doubling up to `retry_max`, before the next round.
pub async fn relay(
    publisher: Arc<DeadLetterPublisher>,
    pool: PgPool,
    retry_initial: Duration,
    retry_max: Duration,
) {
    let mut backoff = Backoff::new(retry_initial, retry_max);
    let mut retry_in: Option<Duration> = None;
    loop {
        match retry_in {
            // Failing: wait out the backoff, whatever arrives meanwhile.
            Some(delay) => tokio::time::sleep(delay).await,
            None => {
                let _ = tokio::time::timeout(retry_max, publisher.wake.notified()).await;
            }
        }
        retry_in = loop {
            match publisher.publish_round(&pool).await {
                Ok(round) if round.failed > 0 => {
                    let delay = backoff.next_delay();
                    warn!(
                        topic = %publisher.topic,
                        failed = round.failed,
                        published = round.published,
                        retry_in_ms = delay.as_millis() as u64,
                        "publishing dead letters failed (they are stored; the reason is in \
                         dead_letters.publish_error): retrying"
                    );
                    break Some(delay);
                }
                Ok(round) if round.pending as i64 == ROUND_LIMIT => continue,
                Ok(round) => {
                    if round.published > 0 {
                        debug!(topic = %publisher.topic, published = round.published,
                            "dead letters published");
                    }
                    backoff.reset();
                    break None;
                }
                Err(error) => {
                    let delay = backoff.next_delay();
                    warn!(%error, retry_in_ms = delay.as_millis() as u64,
                        "cannot read the dead letters to publish: retrying");
                    break Some(delay);
                }
            }
        };
    }
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}
