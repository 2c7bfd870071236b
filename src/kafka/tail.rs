//! Reading the newest records below a group's committed position, and the group's committed
//! positions, with a client of its own that never joins the group: what the check of the
//! database against Kafka ([`crate::domain::traces`]) reads. Blocking calls, each bounded by a
//! deadline; run them off the async threads.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::error_log::LoggedClientContext;
use super::{KafkaSetupError, cluster_config, create_client, record_of};
use crate::config::KafkaSettings;
use crate::domain::traces::tail_start;
use crate::domain::{Record, TopicPartition};

/// A client of the cluster that reads as the service does (committed transactions only) and
/// looks up the group's committed offsets, without joining the group or committing anything.
pub struct TailReader {
    consumer: BaseConsumer<LoggedClientContext>,
}

/// Why a tail was not read whole.
#[derive(Debug, thiserror::Error)]
pub enum TailError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
    #[error("the service is stopping")]
    Stopped,
}

/// The newest records below a committed position.
#[derive(Debug)]
pub struct Tail {
    pub records: Vec<Record>,
}

impl TailReader {
    pub fn new(settings: &KafkaSettings) -> Result<Self, KafkaSetupError> {
        let mut config = cluster_config(settings, "checker")?;
        config
            .set("group.id", &settings.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest");
        // Its errors are summarised, as every client's are, rather than a line each.
        let context = LoggedClientContext::new(settings.error_log_interval());
        let consumer = create_client("checking client", settings, || {
            config.create_with_context(context)
        })?;
        Ok(TailReader { consumer })
    }

    /// The group's committed position of each partition; `None` where it has none.
    pub fn committed(
        &self,
        partitions: &[TopicPartition],
        timeout: Duration,
    ) -> Result<Vec<(TopicPartition, Option<i64>)>, KafkaError> {
        let mut tpl = TopicPartitionList::with_capacity(partitions.len());
        for tp in partitions {
            tpl.add_partition(&tp.topic, tp.partition);
        }
        let committed = self.consumer.committed_offsets(tpl, timeout)?;
        Ok(partitions
            .iter()
            .map(|tp| {
                let offset =
                    committed
                        .find_partition(&tp.topic, tp.partition)
                        .and_then(|element| match element.offset() {
                            Offset::Offset(offset) => Some(offset),
                            _ => None,
                        });
                (tp.clone(), offset)
            })
            .collect())
    }

    /// Every partition of these topics, from the cluster's metadata.
    pub fn partitions(
        &self,
        topics: &[String],
        timeout: Duration,
    ) -> Result<Vec<TopicPartition>, KafkaError> {
        let mut found = Vec::new();
        for topic in topics {
            let metadata = self.consumer.fetch_metadata(Some(topic), timeout)?;
            for t in metadata.topics() {
                found.extend(
                    t.partitions()
                        .iter()
                        .map(|p| TopicPartition::new(t.name(), p.id())),
                );
            }
        }
        Ok(found)
    }

    /// The newest `count` records below `committed` that the log still holds (records of
    /// aborted transactions and transaction markers are not records: skipped, as the service
    /// skips them). Reads until the first record at or past `committed`, or the log's end, or
    /// `timeout`, which is an error: a tail read in part proves nothing. Gives up, with an
    /// error, once `stopped` says so.
    pub fn tail(
        &self,
        tp: &TopicPartition,
        committed: i64,
        count: usize,
        timeout: Duration,
        stopped: &dyn Fn() -> bool,
    ) -> Result<Tail, TailError> {
        let deadline = Instant::now() + timeout;
        if stopped() {
            return Err(TailError::Stopped);
        }
        let (log_start, _) = self
            .consumer
            .fetch_watermarks(&tp.topic, tp.partition, timeout)?;
        let Some(from) = tail_start(log_start, committed, count) else {
            return Ok(Tail {
                records: Vec::new(),
            });
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(from))?;
        self.consumer.assign(&tpl)?;
        let mut records = Vec::new();
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(TailError::TimedOut(timeout));
            }
            if stopped() {
                break Err(TailError::Stopped);
            }
            match self.consumer.poll(left.min(Duration::from_millis(200))) {
                None => continue,
                Some(Err(KafkaError::PartitionEOF(_))) => break Ok(()),
                Some(Err(err)) => break Err(err.into()),
                Some(Ok(message)) => {
                    if message.offset() >= committed {
                        break Ok(());
                    }
                    records.push(record_of(&message));
                }
            }
        };
        let _ = self.consumer.unassign();
        result.map(|()| Tail { records })
    }
}
