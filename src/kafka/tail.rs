//! Reading the newest records below a group's committed position, and the group's committed
//! positions, with a client of its own that never joins the group: what the check of the
//! database against Kafka ([`crate::domain::traces`]) reads. Blocking calls, each bounded by a
//! deadline; run them off the async threads.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::error_log::{ClientErrorLog, LoggedClientContext};
use super::{KafkaSetupError, cluster_config, create_client, record_of};
use crate::config::KafkaSettings;
use crate::domain::traces::tail_start;
use crate::domain::{Record, TopicPartition};

/// A client of the cluster that reads as the service does (committed transactions only) and
/// looks up the group's committed offsets, without joining the group or committing anything.
pub(crate) struct TailReader {
    /// A client of the group: asks for its committed offsets, nothing else.
    group: BaseConsumer<TailContext>,
    /// A client of no group of the service's: reads the tails.
    consumer: BaseConsumer<TailContext>,
}

/// The checking client's errors, summarised as every client's are — but for the end of a
/// partition: librdkafka reports it to the error callback as well as to the poll, and here it
/// is the signal the read waits for, not a fault (it was an ERROR line at every assignment).
struct TailContext(LoggedClientContext);

impl rdkafka::client::ClientContext for TailContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        self.0.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if is_partition_eof(&error) {
            return;
        }
        self.0.error(error, reason);
    }
}

impl rdkafka::consumer::ConsumerContext for TailContext {}

fn is_partition_eof(error: &KafkaError) -> bool {
    matches!(error, KafkaError::PartitionEOF(_))
        || error.rdkafka_error_code() == Some(rdkafka::error::RDKafkaErrorCode::PartitionEOF)
}

/// Why a tail was not read whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TailError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
    #[error("the service is stopping")]
    Stopped,
}

/// The newest records below a committed position.
#[derive(Debug)]
pub(crate) struct Tail {
    pub records: Vec<Record>,
}

impl TailReader {
    /// A reader whose clients summarise their errors on their own.
    pub(crate) fn new(settings: &KafkaSettings) -> Result<Self, KafkaSetupError> {
        Self::sharing(settings, ClientErrorLog::new(settings.error_log_interval()))
    }

    /// A reader whose clients' errors go through `errors`, shared with the service's other
    /// clients.
    pub(crate) fn sharing(
        settings: &KafkaSettings,
        errors: ClientErrorLog,
    ) -> Result<Self, KafkaSetupError> {
        // Two clients: one of the group, which only asks for its committed offsets; one of no
        // group, which reads. A client of the group that assigns itself partitions and
        // fetches them disturbed the group's own members under rebalances (revokes ran out of
        // time and records were done twice); one that reads outside it is a plain reader.
        let mut offsets = cluster_config(settings, "checker")?;
        offsets
            .set("group.id", &settings.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let mut reading = cluster_config(settings, "checker")?;
        reading
            .set("group.id", format!("{}.trace-check", settings.group_id))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            // It wants a few dozen records below the committed position, not the backlog past
            // it: librdkafka's defaults would prefetch up to 100,000 records a partition.
            .set("queued.min.messages", "1")
            .set("queued.max.messages.kbytes", "1024")
            .set("fetch.max.bytes", "1048576")
            .set("max.partition.fetch.bytes", "262144")
            .set("fetch.wait.max.ms", "50");
        // Their errors are summarised, as every client's are, rather than a line each.
        let context = || TailContext(LoggedClientContext::sharing(errors.clone()));
        let group = create_client("checking client", settings, || {
            offsets.create_with_context(context())
        })?;
        let consumer = create_client("checking client", settings, || {
            reading.create_with_context(context())
        })?;
        Ok(TailReader { group, consumer })
    }

    /// The group's committed position of each partition; `None` where it has none.
    pub(crate) fn committed(
        &self,
        partitions: &[TopicPartition],
        timeout: Duration,
    ) -> Result<Vec<(TopicPartition, Option<i64>)>, KafkaError> {
        let mut tpl = TopicPartitionList::with_capacity(partitions.len());
        for tp in partitions {
            tpl.add_partition(&tp.topic, tp.partition);
        }
        let committed = self.group.committed_offsets(tpl, timeout)?;
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
    pub(crate) fn partitions(
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
    pub(crate) fn tail(
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

#[cfg(test)]
mod tests {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};

    use super::is_partition_eof;

    #[test]
    fn the_end_of_a_partition_is_not_an_error_of_the_checking_client() {
        assert!(is_partition_eof(&KafkaError::Global(
            RDKafkaErrorCode::PartitionEOF
        )));
        assert!(is_partition_eof(&KafkaError::PartitionEOF(3)));
        assert!(!is_partition_eof(&KafkaError::Global(
            RDKafkaErrorCode::AllBrokersDown
        )));
    }
}
