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
        Self::with_properties(brokers, group_id, &[])
    }

    /// [`GroupInspector::new`], with more librdkafka properties (a cluster's security).
    pub fn with_properties(
        brokers: &str,
        group_id: &str,
        properties: &[(String, String)],
    ) -> Result<Self, KafkaError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("group.id", group_id)
            .set("enable.auto.commit", "false");
        for (key, value) in properties {
            config.set(key, value);
        }
        let consumer = config.create()?;
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

    /// The committed position of each partition with the metadata committed with it; `None`
    /// where the group committed nothing.
    pub fn committed_with_metadata(
        &self,
        topic: &str,
        partitions: i32,
        timeout: Duration,
    ) -> Result<Vec<Option<(i64, String)>>, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for partition in 0..partitions {
            tpl.add_partition(topic, partition);
        }
        let committed = self.consumer.committed_offsets(tpl, timeout)?;
        Ok((0..partitions)
            .map(|partition| {
                let element = committed.find_partition(topic, partition)?;
                match element.offset() {
                    Offset::Offset(offset) => Some((offset, element.metadata().to_owned())),
                    _ => None,
                }
            })
            .collect())
    }

    /// Commits `positions` (partition, offset, metadata) for the group from outside it, as an
    /// operator's tool would while no member runs.
    pub fn commit(&self, topic: &str, positions: &[(i32, i64, String)]) -> Result<(), KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (partition, offset, metadata) in positions {
            let mut element = tpl.add_partition(topic, *partition);
            element.set_offset(Offset::Offset(*offset))?;
            element.set_metadata(metadata);
        }
        self.consumer
            .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
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

    /// Whether the group's committed offsets are `ends` (see [`committed_at`]).
    pub fn has_committed(
        &self,
        topic: &str,
        ends: &[i64],
        timeout: Duration,
    ) -> Result<bool, KafkaError> {
        Ok(self.committed(topic, ends.len() as i32, timeout)? == committed_at(ends))
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

/// The group did not commit the expected offsets in time.
#[derive(Debug, thiserror::Error)]
#[error("group not committed to {ends:?} of {topic} within {timeout:?}; last read: {last}")]
pub struct NotCommitted {
    pub topic: String,
    pub ends: Vec<i64>,
    pub timeout: Duration,
    /// The last committed offsets read, or why they could not be read.
    pub last: String,
}

/// What a group that consumed partitions ending at `ends` has committed: `Some(end)` for every
/// partition with records, nothing for an empty one.
pub fn committed_at(ends: &[i64]) -> Vec<Option<i64>> {
    ends.iter().map(|&end| (end > 0).then_some(end)).collect()
}

/// Waits until the group's committed offsets, read by `inspector` (a separate client, as an
/// operator's tool would), are [`committed_at`] `ends`. Calls `between` after every reading
/// that was not there yet.
pub async fn wait_committed(
    inspector: std::sync::Arc<GroupInspector>,
    topic: &str,
    ends: &[i64],
    timeout: Duration,
    mut between: impl FnMut(),
) -> Result<Vec<Option<i64>>, NotCommitted> {
    let deadline = std::time::Instant::now() + timeout;
    let partitions = ends.len() as i32;
    let expected = committed_at(ends);
    loop {
        let committed = {
            let (inspector, topic) = (inspector.clone(), topic.to_owned());
            tokio::task::spawn_blocking(move || {
                inspector.committed(&topic, partitions, Duration::from_secs(2))
            })
            .await
            .expect("the inspector's thread does not panic")
        };
        if committed.as_ref().ok() == Some(&expected) {
            return Ok(expected);
        }
        if std::time::Instant::now() >= deadline {
            return Err(NotCommitted {
                topic: topic.to_owned(),
                ends: ends.to_vec(),
                timeout,
                last: format!("{committed:?}"),
            });
        }
        between();
        // Short: the demo times its drain to the moment this sees the final commit.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
