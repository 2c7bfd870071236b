//! Publishing dead letters to a Kafka topic as well, with headers naming where each came from
//! and why — the convention of Kafka Connect's and Spring's dead-letter topics.

use std::time::Duration;

use futures::future::try_join_all;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::config::KafkaSettings;
use crate::store::dead_letters::DeadLetterRow;

pub const HEADER_TOPIC: &str = "history.dlq.original.topic";
pub const HEADER_PARTITION: &str = "history.dlq.original.partition";
pub const HEADER_OFFSET: &str = "history.dlq.original.offset";
pub const HEADER_REASON_CODE: &str = "history.dlq.reason.code";
pub const HEADER_REASON: &str = "history.dlq.reason";

/// A producer for the configured dead-letter topic.
pub struct DeadLetterPublisher {
    producer: FutureProducer,
    topic: String,
}

impl DeadLetterPublisher {
    pub fn new(settings: &KafkaSettings, topic: &str) -> Result<Self, super::KafkaSetupError> {
        let producer = super::create_producer(settings)?;
        Ok(DeadLetterPublisher {
            producer,
            topic: topic.to_owned(),
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Publishes every row and waits for every acknowledgement.
    pub async fn publish(&self, rows: &[DeadLetterRow<'_>]) -> Result<(), KafkaError> {
        try_join_all(rows.iter().map(|row| self.publish_one(row))).await?;
        Ok(())
    }

    async fn publish_one(&self, row: &DeadLetterRow<'_>) -> Result<(), KafkaError> {
        let partition = row.partition.to_string();
        let offset = row.offset.to_string();
        let headers = OwnedHeaders::new()
            .insert(header(HEADER_TOPIC, row.topic))
            .insert(header(HEADER_PARTITION, &partition))
            .insert(header(HEADER_OFFSET, &offset))
            .insert(header(HEADER_REASON_CODE, row.letter.reason_code))
            .insert(header(HEADER_REASON, &row.letter.reason));
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic).headers(headers);
        if let Some(key) = &row.letter.key {
            record = record.key(&key[..]);
        }
        if let Some(payload) = &row.letter.payload {
            record = record.payload(&payload[..]);
        }
        self.producer
            .send(record, Duration::from_secs(30))
            .await
            .map(|_| ())
            .map_err(|(err, _)| err)
    }
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}
