//! Replaying dead letters: republishing their original bytes to a topic (by default the one
//! they came from) once the cause is fixed — a producer corrected, or a limit raised.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::config::KafkaSettings;
use crate::store::dead_letters::StoredDeadLetter;

/// Names the dead letter a replayed record came from: `topic/partition/offset`.
pub const HEADER_REPLAY_OF: &str = "history.replay.of";

pub struct Replayer {
    producer: FutureProducer,
}

impl Replayer {
    pub fn new(settings: &KafkaSettings) -> Result<Self, super::KafkaSetupError> {
        Ok(Replayer {
            producer: super::create_producer(settings)?,
        })
    }

    /// Publishes one letter's key and payload (a tombstone stays a tombstone) to `topic`, or
    /// to its original topic; returns where it landed.
    pub async fn replay(
        &self,
        letter: &StoredDeadLetter,
        topic: Option<&str>,
    ) -> Result<(i32, i64), KafkaError> {
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
        let delivery = self
            .producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(err, _)| err)?;
        Ok((delivery.partition, delivery.offset))
    }
}
