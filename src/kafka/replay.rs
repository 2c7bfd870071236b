//! Replaying dead letters: republishing their original bytes to a topic (by default the one
//! they came from) once the cause is fixed — a producer corrected, or a limit raised.

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::error_log::LoggedClientContext;
use crate::config::KafkaSettings;
use crate::store::dead_letters::StoredDeadLetter;

/// Names the dead letter a replayed record came from: `topic/partition/offset`.
pub(crate) const HEADER_REPLAY_OF: &str = "history.replay.of";

pub(crate) struct Replayer {
    producer: FutureProducer<LoggedClientContext>,
    timeout: Duration,
    deadline: Instant,
}

/// A letter not replayed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplayError {
    /// The broker refused it, or librdkafka gave up on it.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The broker did not confirm it within the replay's bound.
    #[error("not confirmed by the broker within the replay's timeout ({timeout_s} s)")]
    TimedOut { timeout_s: u64 },
}

impl Replayer {
    /// A producer whose every delivery must be confirmed within `timeout` from now: the whole
    /// replay's bound. librdkafka gives up on a record at the same moment (`message.timeout.ms`,
    /// unless the operator set it), so none is delivered after the replay stopped waiting.
    pub(crate) fn new(
        settings: &KafkaSettings,
        timeout: Duration,
    ) -> Result<Self, super::KafkaSetupError> {
        let mut config = super::producer_config(settings)?;
        if config.get("message.timeout.ms").is_none() {
            config.set("message.timeout.ms", timeout.as_millis().max(1).to_string());
        }
        let context = LoggedClientContext::new(settings.error_log_interval());
        let producer =
            super::create_client("producer", settings, || config.create_with_context(context))?;
        Ok(Replayer {
            producer,
            timeout,
            deadline: Instant::now() + timeout,
        })
    }

    /// Publishes one letter's key and payload (a tombstone stays a tombstone) to `topic`, or
    /// to its original topic; returns where it landed once the broker confirmed it.
    pub(crate) async fn replay(
        &self,
        letter: &StoredDeadLetter,
        topic: Option<&str>,
    ) -> Result<(i32, i64), ReplayError> {
        let origin = format!("{}/{}/{}", letter.topic, letter.partition, letter.offset);
        let headers = OwnedHeaders::new().insert(Header {
            key: HEADER_REPLAY_OF,
            value: Some(origin.as_str()),
        });
        let mut record =
            FutureRecord::<[u8], [u8]>::to(topic.unwrap_or(&letter.topic)).headers(headers);
        if let Some(key) = &letter.key {
            record = record.key(&key[..]);
        }
        if let Some(payload) = &letter.payload {
            record = record.payload(&payload[..]);
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        let send = self.producer.send(record, left);
        let timed_out = || ReplayError::TimedOut {
            timeout_s: self.timeout_s(),
        };
        let delivery = tokio::time::timeout_at(self.deadline.into(), send)
            .await
            .map_err(|_| timed_out())?
            .map_err(|(err, _)| match err {
                KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::MessageTimedOut,
                ) => timed_out(),
                err => ReplayError::Kafka(err),
            })?;
        Ok((delivery.partition, delivery.offset))
    }

    fn timeout_s(&self) -> u64 {
        self.timeout.as_secs()
    }
}
