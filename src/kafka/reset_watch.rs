//! The broker calls behind the offset-reset check ([`crate::offsets::reset`]), on a thread of
//! their own: looking up a new assignment's committed offsets and a partition's log start are
//! blocking requests, which must not hold up the supervisor's fetch loop or a rebalance
//! callback. The supervisor only reports assignments and the offsets of the records it hands
//! out; the thread shouts (an ERROR and two counters) when records were skipped.
//!
//! The committed offsets are looked up as soon as the assignment is known, long before this
//! process can commit anything for it (records are fetched, written, then committed at the
//! next commit interval), so the answer is the position the assignment started from.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, warn};

use super::HistoryConsumer;
use crate::domain::{Epoch, Record, TopicPartition};
use crate::metrics;
use crate::offsets::reset::{Detector, Jump, JumpKind, Loss, MAX_UNJUDGED_JUMPS, Span, judge};

/// Longest wait for the broker's answer to one lookup.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// What the supervisor reported and the thread has not acted on. The supervisor applies its
/// reports to the detector here at once, so nothing queues up while a lookup waits on the
/// broker: what grows meanwhile is at most the jumps found (bounded by the detector).
#[derive(Default)]
struct Pending {
    detector: Detector,
    /// Assignments whose committed offsets are still to be looked up.
    assigned: Vec<(TopicPartition, Epoch)>,
    /// The supervisor is gone: the thread ends.
    closed: bool,
}

type Shared = Arc<(Mutex<Pending>, Condvar)>;

/// The supervisor's handle on the checking thread. The thread ends when this is dropped.
pub(crate) struct ResetWatch {
    shared: Shared,
}

impl ResetWatch {
    /// Starts the thread. It holds the consumer only while it calls the broker, so closing the
    /// consumer is not held up by it.
    pub(crate) fn start(consumer: Weak<HistoryConsumer>) -> Self {
        let shared: Shared = Arc::default();
        std::thread::Builder::new()
            .name("history-resets".into())
            .spawn({
                let shared = shared.clone();
                move || run(consumer, shared)
            })
            .expect("cannot start the offset-reset thread");
        ResetWatch { shared }
    }

    fn report(&self, apply: impl FnOnce(&mut Pending)) {
        let (pending, wake) = &*self.shared;
        apply(&mut pending.lock().unwrap());
        wake.notify_one();
    }

    pub(crate) fn assigned(&self, partitions: &[(TopicPartition, Epoch)]) {
        self.report(|pending| {
            for (tp, epoch) in partitions {
                // Declared at 0, so that the first reset is an increase to Prometheus.
                metrics::init_offset_resets(tp);
                pending.detector.assigned(tp.clone(), *epoch);
                pending.assigned.push((tp.clone(), *epoch));
            }
        });
    }

    pub(crate) fn revoked(&self, partitions: &[(TopicPartition, Epoch)]) {
        self.report(|pending| {
            for (tp, epoch) in partitions {
                pending.detector.revoked(tp, *epoch);
            }
        });
    }

    /// A run of records of one assignment, about to be processed, in offset order.
    pub(crate) fn records<T>(&self, tp: &TopicPartition, epoch: Epoch, records: &[(Record, T)]) {
        if let Some(span) = Span::of(records.iter().map(|(record, _)| record.offset)) {
            self.report(|pending| pending.detector.observed(tp, epoch, &span));
        }
    }
}

impl Drop for ResetWatch {
    fn drop(&mut self) {
        self.report(|pending| pending.closed = true);
    }
}

fn run(consumer: Weak<HistoryConsumer>, shared: Shared) {
    let (pending, wake) = &*shared;
    loop {
        let (mut assigned, jumps) = {
            let mut pending = pending.lock().unwrap();
            loop {
                if pending.closed {
                    return;
                }
                if !pending.assigned.is_empty() || pending.detector.has_jumps() {
                    break;
                }
                pending = wake.wait(pending).unwrap();
            }
            let assigned = std::mem::take(&mut pending.assigned);
            (assigned, pending.detector.take_jumps())
        };
        assigned.retain(|(tp, epoch)| pending.lock().unwrap().detector.start_unknown(tp, *epoch));
        if !assigned.is_empty() {
            let Some(consumer) = consumer.upgrade() else {
                return;
            };
            let started = committed_offsets(&consumer, &assigned);
            let mut pending = pending.lock().unwrap();
            for (tp, epoch, committed) in started {
                pending.detector.started(&tp, epoch, committed);
            }
        }
        for (tp, _, jumps, dropped) in jumps {
            if dropped > 0 {
                warn!(
                    partition = %tp,
                    dropped,
                    "offset jumps not judged: more than {MAX_UNJUDGED_JUMPS} waited for one \
                     lookup of the log start; an offset reset among them would go unreported"
                );
            }
            let Some(consumer) = consumer.upgrade() else {
                return;
            };
            check(&consumer, &tp, &jumps);
        }
    }
}

/// The group's committed offset of each partition; `None` where it has none. A failed lookup
/// leaves the assignment's start unchecked, and says so.
fn committed_offsets(
    consumer: &HistoryConsumer,
    partitions: &[(TopicPartition, Epoch)],
) -> Vec<(TopicPartition, Epoch, Option<i64>)> {
    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for (tp, _) in partitions {
        tpl.add_partition(&tp.topic, tp.partition);
    }
    let committed = match consumer.committed_offsets(tpl, LOOKUP_TIMEOUT) {
        Ok(committed) => Some(committed),
        Err(err) => {
            warn!(
                error = %err,
                partitions = ?partitions.iter().map(|(tp, _)| tp).collect::<Vec<_>>(),
                "cannot look up the committed offsets of new partitions: an offset reset at \
                 this assignment would go unreported"
            );
            None
        }
    };
    partitions
        .iter()
        .map(|(tp, epoch)| {
            let offset = committed
                .as_ref()
                .and_then(|list| list.find_partition(&tp.topic, tp.partition))
                .and_then(|element| match element.offset() {
                    Offset::Offset(offset) => Some(offset),
                    _ => None,
                });
            (tp.clone(), *epoch, offset)
        })
        .collect()
}

/// Judges a partition's jumps against its log start, fetched now (after they were seen).
fn check(consumer: &HistoryConsumer, tp: &TopicPartition, jumps: &[Jump]) {
    match consumer.fetch_watermarks(&tp.topic, tp.partition, LOOKUP_TIMEOUT) {
        Ok((log_start, _)) => {
            for loss in jumps.iter().filter_map(|&jump| judge(jump, log_start)) {
                report(tp, &loss);
            }
        }
        Err(err) => {
            for jump in jumps {
                warn!(
                    topic = %tp.topic,
                    partition = tp.partition,
                    expected = jump.expected,
                    resumed = jump.resumed,
                    error = %err,
                    "offsets were skipped and the log start cannot be fetched: cannot tell \
                     whether retention deleted records or the log has gaps"
                );
            }
        }
    }
}

fn report(tp: &TopicPartition, loss: &Loss) {
    metrics::offset_reset(tp, loss.skipped);
    let Loss {
        jump,
        log_start,
        skipped,
    } = *loss;
    let resumed = jump.resumed;
    match jump.kind {
        JumpKind::AtAssignment => {
            let committed = jump.expected;
            error!(
                topic = %tp.topic,
                partition = tp.partition,
                committed,
                resumed,
                log_start,
                skipped,
                "offset reset: {skipped} records of {tp} were deleted by retention before they \
                 were processed; the group's committed offset {committed} is behind the log \
                 start {log_start}, consumption resumed at {resumed}"
            );
        }
        JumpKind::InStream => {
            let position = jump.expected;
            error!(
                topic = %tp.topic,
                partition = tp.partition,
                position,
                resumed,
                log_start,
                skipped,
                "offset reset: {skipped} records of {tp} were deleted by retention before they \
                 were processed; the consumer's position {position} fell behind the log start \
                 {log_start}, consumption resumed at {resumed}"
            );
        }
    }
}
