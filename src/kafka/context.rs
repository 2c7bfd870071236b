//! The consumer's librdkafka callbacks: rebalances, commits, statistics, errors.
//!
//! Rebalance callbacks run inside the consumer's poll, on the supervisor's thread. A revoke must
//! commit before it returns (after it, the partitions are gone and commits fail), so it asks the
//! OffsetCommitter — on another thread — for the positions and waits for the answer with a
//! deadline. Everything else is queued as an event for the supervisor, in order with the
//! records the same poll returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Addr;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use super::error_log::ClientErrorLog;
use crate::actors::committer::OffsetCommitter;
use crate::actors::messages::{CommitPosition, Epoch, Lost, Revoke, TopicPartition};
use crate::metrics::{self, Stats};

/// A change of assignment, handed to the supervisor in order with the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Assigned(Vec<(TopicPartition, Epoch)>),
    /// The partitions are gone; `lost` if the group moved on without a clean revoke.
    Revoked {
        partitions: Vec<(TopicPartition, Epoch)>,
        lost: bool,
    },
}

/// State shared between the callbacks, the supervisor and the health endpoints.
pub struct SupervisorContext {
    committer: Addr<OffsetCommitter>,
    revoke_timeout: Duration,
    stats: Arc<Stats>,
    events: Mutex<Vec<RebalanceEvent>>,
    /// Wakes the record stream when a callback queued an event, so the event is handled even if
    /// no record follows it.
    pub(super) notify: tokio::sync::Notify,
    /// The epoch of each currently assigned partition.
    epochs: Mutex<HashMap<TopicPartition, Epoch>>,
    next_epoch: AtomicU64,
    /// True once the consumer has joined its group and received an assignment (maybe empty).
    joined: Arc<AtomicBool>,
    /// Client errors, aggregated (the supervisor logs the consumer's errors through it too).
    errors: ClientErrorLog,
}

impl SupervisorContext {
    pub fn new(
        committer: Addr<OffsetCommitter>,
        revoke_timeout: Duration,
        stats: Arc<Stats>,
        joined: Arc<AtomicBool>,
    ) -> Self {
        SupervisorContext {
            committer,
            revoke_timeout,
            stats,
            events: Mutex::new(Vec::new()),
            notify: tokio::sync::Notify::new(),
            epochs: Mutex::new(HashMap::new()),
            next_epoch: AtomicU64::new(1),
            joined,
            errors: ClientErrorLog::default(),
        }
    }

    /// Summarises repeated client errors once per `interval` (30 s by default).
    pub fn with_error_log_interval(mut self, interval: Duration) -> Self {
        self.errors = ClientErrorLog::new(interval);
        self
    }

    /// The aggregated log of client errors.
    pub fn errors(&self) -> &ClientErrorLog {
        &self.errors
    }

    /// Events queued by callbacks since the last call.
    pub fn take_events(&self) -> Vec<RebalanceEvent> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }

    /// The epoch of a partition's current assignment, if it is assigned.
    pub fn epoch_of(&self, tp: &TopicPartition) -> Option<Epoch> {
        self.epochs.lock().unwrap().get(tp).copied()
    }

    fn push(&self, event: RebalanceEvent) {
        self.events.lock().unwrap().push(event);
        self.notify.notify_one();
    }

    fn take_epochs(&self, tpl: &TopicPartitionList) -> Vec<(TopicPartition, Epoch)> {
        let mut epochs = self.epochs.lock().unwrap();
        tpl.elements()
            .iter()
            .filter_map(|element| {
                let tp = TopicPartition::new(element.topic(), element.partition());
                epochs.remove(&tp).map(|epoch| (tp, epoch))
            })
            .collect()
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let partitions = self.take_epochs(tpl);
        if consumer.assignment_lost() {
            warn!(partitions = ?names(&partitions), "assignment lost: nothing is committed");
            self.stats.rebalance("lost");
            self.committer.do_send(Lost {
                partitions: partitions.clone(),
            });
            self.joined.store(false, Ordering::Relaxed);
            self.push(RebalanceEvent::Revoked {
                partitions,
                lost: true,
            });
            return;
        }
        self.stats.rebalance("revoke");
        info!(partitions = ?names(&partitions), "partitions revoked");
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        self.committer.do_send(Revoke {
            partitions: partitions.clone(),
            reply: Some(reply),
        });
        match answer.recv_timeout(self.revoke_timeout) {
            Ok(positions) if positions.is_empty() => {}
            Ok(positions) => {
                commit_sync(consumer, &positions, &self.stats, "revoke");
            }
            Err(_) => warn!(
                timeout_ms = self.revoke_timeout.as_millis() as u64,
                "the committer did not answer the revoke in time: nothing committed"
            ),
        }
        self.push(RebalanceEvent::Revoked {
            partitions,
            lost: false,
        });
    }

    fn assign(&self, tpl: &TopicPartitionList) {
        let partitions: Vec<(TopicPartition, Epoch)> = {
            let mut epochs = self.epochs.lock().unwrap();
            tpl.elements()
                .iter()
                .map(|element| {
                    let tp = TopicPartition::new(element.topic(), element.partition());
                    let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
                    epochs.insert(tp.clone(), epoch);
                    (tp, epoch)
                })
                .collect()
        };
        self.stats.rebalance("assign");
        info!(partitions = ?names(&partitions), "partitions assigned");
        metrics::set_assigned_partitions(self.epochs.lock().unwrap().len());
        self.joined.store(true, Ordering::Relaxed);
        self.push(RebalanceEvent::Assigned(partitions));
    }
}

fn names(partitions: &[(TopicPartition, Epoch)]) -> Vec<String> {
    partitions.iter().map(|(tp, _)| tp.to_string()).collect()
}

/// Builds the list to commit: each partition at its position.
pub fn commit_list(positions: &[CommitPosition]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(positions.len());
    for position in positions {
        // Only fails for an invalid offset value, which a position never is.
        let _ = tpl.add_partition_offset(
            &position.tp.topic,
            position.tp.partition,
            Offset::Offset(position.offset),
        );
    }
    tpl
}

/// Commits and waits for the broker's answer, then records the outcome. (librdkafka reports
/// nothing back for manual asynchronous commits, so every commit here is synchronous: the
/// periodic ones on the commit worker's thread, revoke ones inside the rebalance callback.)
pub fn commit_sync<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    positions: &[CommitPosition],
    stats: &Stats,
    reason: &'static str,
) -> bool {
    let tpl = commit_list(positions);
    match consumer.commit(&tpl, CommitMode::Sync) {
        Ok(()) => {
            log_committed(&tpl, reason);
            stats.commit(reason, "ok");
            true
        }
        Err(err) => {
            // Expected for partitions revoked meanwhile: their next owner commits them.
            warn!(error = %err, reason, positions = ?positions, "offset commit failed");
            stats.commit(reason, "error");
            false
        }
    }
}

/// The service's own record of each commit: one line per partition, at debug level under the
/// `history_service::commits` target (the chaos test reads them back).
fn log_committed(tpl: &TopicPartitionList, reason: &'static str) {
    for element in tpl.elements() {
        if let Offset::Offset(offset) = element.offset() {
            let tp = TopicPartition::new(element.topic(), element.partition());
            metrics::set_committed_offset(&tp, offset);
            debug!(
                target: "history_service::commits",
                topic = element.topic(),
                partition = element.partition(),
                offset,
                reason,
                "offset committed"
            );
        }
    }
}

impl ClientContext for SupervisorContext {
    fn stats(&self, statistics: Statistics) {
        let epochs = self.epochs.lock().unwrap();
        for (topic, stats) in &statistics.topics {
            for (partition, stats) in &stats.partitions {
                let tp = TopicPartition::new(topic, *partition);
                if stats.consumer_lag >= 0 && epochs.contains_key(&tp) {
                    metrics::set_consumer_lag(&tp, stats.consumer_lag);
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.client_error(&error, reason);
    }
}

impl ConsumerContext for SupervisorContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.revoke(consumer, tpl);
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.assign(tpl),
            Rebalance::Revoke(_) => {}
            Rebalance::Error(err) => warn!(error = %err, "rebalance error"),
        }
    }
}
