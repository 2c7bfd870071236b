//! Publishing dead letters to a Kafka topic as well, with headers naming where each came from
//! and why — the convention of Kafka Connect's and Spring's dead-letter topics.

use std::time::Duration;

use std::sync::Arc;

use futures::future::join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::error_log::LoggedClientContext;
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::config::KafkaSettings;
use crate::domain::backoff::Backoff;
use crate::metrics;
use crate::store::dead_letters::{self, PendingLetter, PublishPolicy, PublishRound};
use crate::store::{PgPool, StoreError};

pub const HEADER_TOPIC: &str = "history.dlq.original.topic";
pub const HEADER_PARTITION: &str = "history.dlq.original.partition";
pub const HEADER_OFFSET: &str = "history.dlq.original.offset";
pub const HEADER_REASON_CODE: &str = "history.dlq.reason.code";
pub const HEADER_REASON: &str = "history.dlq.reason";

/// How many letters one round of the relay publishes at most.
const ROUND_LIMIT: i64 = 500;

/// Longest a round waits for the broker to confirm its letters (librdkafka's
/// `message.timeout.ms` too, unless the operator set it): a letter not confirmed by then is
/// set aside, like one the broker refused.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a round's claim keeps other rounds off its letters: its wait on the broker and a
/// margin for recording the outcomes.
const CLAIM_LEASE: Duration = Duration::from_secs(60);

/// A producer for the configured dead-letter topic.
///
/// The `dead_letters` table is the source of truth: a writer stores a letter (its offset then
/// resolves) and marks it to be published; the relay ([`relay`]) publishes it in the
/// background. A topic that is missing, denied or refuses the record therefore never blocks a
/// partition: the failure is recorded on the row, and the letter set aside for its own backoff
/// while the others go on. No database transaction is open while the broker is waited for.
pub struct DeadLetterPublisher {
    producer: FutureProducer<LoggedClientContext>,
    topic: String,
    /// The longest wait for a delivery: `message.timeout.ms`.
    delivery_timeout: Duration,
    /// Wakes the relay when letters were stored.
    wake: Notify,
}

impl DeadLetterPublisher {
    pub fn new(settings: &KafkaSettings, topic: &str) -> Result<Self, super::KafkaSetupError> {
        let mut config = super::producer_config(settings)?;
        // Bound each delivery (librdkafka's default is five minutes) unless the operator chose
        // a value; the claim outlasts it.
        let delivery_timeout = match config.get("message.timeout.ms") {
            None => {
                config.set(
                    "message.timeout.ms",
                    DELIVERY_TIMEOUT.as_millis().to_string(),
                );
                DELIVERY_TIMEOUT
            }
            Some(value) => value
                .parse()
                .map(Duration::from_millis)
                .unwrap_or(DELIVERY_TIMEOUT)
                .min(CLAIM_LEASE / 2),
        };
        let context = LoggedClientContext::new(settings.error_log_interval());
        let producer =
            super::create_client("producer", settings, || config.create_with_context(context))?;
        Ok(DeadLetterPublisher {
            producer,
            topic: topic.to_owned(),
            delivery_timeout,
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

    /// Publishes up to `ROUND_LIMIT` pending letters and records how each went; a letter
    /// that failed is retried after `retry_initial`, doubling up to `retry_max` (unless
    /// `ignore_backoff`: an operator asking now).
    pub async fn publish_round(
        &self,
        pool: &PgPool,
        retry_initial: Duration,
        retry_max: Duration,
        ignore_backoff: bool,
    ) -> Result<PublishRound, StoreError> {
        let policy = PublishPolicy {
            lease: CLAIM_LEASE,
            retry_initial,
            retry_max,
            ignore_backoff,
        };
        let round =
            dead_letters::publish_pending(pool, &self.topic, ROUND_LIMIT, policy, |letters| {
                join_all(
                    letters
                        .into_iter()
                        .map(|letter| async move { self.publish_one(&letter).await }),
                )
            })
            .await?;
        if round.failed > 0 {
            metrics::dead_letter_publish_failures(round.failed as u64);
        }
        Ok(round)
    }

    async fn publish_one(&self, letter: &PendingLetter) -> Result<(), String> {
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
        let send = self.producer.send(record, self.delivery_timeout);
        // librdkafka gives up at `message.timeout.ms`; this bounds the wait whatever it does.
        match tokio::time::timeout(self.delivery_timeout + Duration::from_secs(1), send).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((err, _))) => Err(err.to_string()),
            Err(_) => Err(format!(
                "not confirmed by the broker within {} ms",
                self.delivery_timeout.as_millis()
            )),
        }
    }
}

/// The relay, to run as a task until the pipeline stops: it publishes pending letters when
/// woken, and when the next letter set aside is due (at most every `retry_max`, for letters
/// left by another replica or an earlier run). A letter that failed waits out its own backoff
/// (`retry_initial`, doubling up to `retry_max`) and holds back no other. Only a database that
/// does not answer makes the relay itself back off.
pub async fn relay(
    publisher: Arc<DeadLetterPublisher>,
    pool: PgPool,
    retry_initial: Duration,
    retry_max: Duration,
) {
    let mut backoff = Backoff::new(retry_initial, retry_max);
    let mut wait = Duration::ZERO;
    let mut last_warning: Option<tokio::time::Instant> = None;
    loop {
        let _ = tokio::time::timeout(wait, publisher.wake.notified()).await;
        let round = loop {
            match publisher
                .publish_round(&pool, retry_initial, retry_max, false)
                .await
            {
                Ok(round) if round.pending as i64 == ROUND_LIMIT => continue,
                other => break other,
            }
        };
        wait = match round {
            Ok(round) => {
                backoff.reset();
                if round.failed > 0 {
                    // Once per `retry_max` at most: the rows say the rest.
                    let due = last_warning.is_none_or(|at| at.elapsed() >= retry_max);
                    if due {
                        last_warning = Some(tokio::time::Instant::now());
                        warn!(
                            topic = %publisher.topic,
                            failed = round.failed,
                            published = round.published,
                            "publishing dead letters failed (they are stored; the reason is in \
                             dead_letters.publish_error): each is retried after its own backoff"
                        );
                    }
                } else if round.published > 0 {
                    debug!(topic = %publisher.topic, published = round.published,
                        "dead letters published");
                }
                match dead_letters::next_due(&pool, &publisher.topic).await {
                    Ok(Some(due)) => due.clamp(Duration::from_millis(10), retry_max),
                    _ => retry_max,
                }
            }
            Err(error) => {
                let delay = backoff.next_delay();
                warn!(%error, retry_in_ms = delay.as_millis() as u64,
                    "cannot read the dead letters to publish: retrying");
                delay
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
