//! Reads a consumer group's committed offsets from outside, as an operator's tool would: a
//! separate client that never joins the group.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// A client for inspecting one group's positions.
pub struct GroupInspector {
    consumer: BaseConsumer,
}

impl GroupInspector {
    pub fn new(brokers: &str, group_id: &str) -> Result<Self, KafkaError> {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group_id)
            .set("enable.auto.commit", "false")
            .create()?;
        Ok(GroupInspector { consumer })
    }

    /// The committed position of each partition; `None` where the group committed nothing.
    pub fn committed(
        &self,
        topic: &str,
        partitions: i32,
        timeout: Duration,
    ) -> Result<Vec<Option<i64>>, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for partition in 0..partitions {
            tpl.add_partition(topic, partition);
        }
        let committed = self.consumer.committed_offsets(tpl, timeout)?;
        Ok((0..partitions)
            .map(
                |partition| match committed.find_partition(topic, partition) {
                    Some(element) => match element.offset() {
                        Offset::Offset(offset) => Some(offset),
                        _ => None,
                    },
                    None => None,
                },
            )
            .collect())
    }

    /// The first and the end offset of a partition.
    pub fn watermarks(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
    ) -> Result<(i64, i64), KafkaError> {
        self.consumer.fetch_watermarks(topic, partition, timeout)
    }

    /// The end (high watermark) of each partition.
    pub fn ends(
        &self,
        topic: &str,
        partitions: i32,
        timeout: Duration,
    ) -> Result<Vec<i64>, KafkaError> {
        (0..partitions)
            .map(|partition| {
                self.consumer
                    .fetch_watermarks(topic, partition, timeout)
                    .map(|(_, high)| high)
            })
            .collect()
    }
}
