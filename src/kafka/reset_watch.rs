//! The broker calls behind the offset-reset check ([`super::offset_reset`]), on a thread of
//! their own: looking up a new assignment's committed offsets and a partition's log start are
//! blocking requests, which must not hold up the supervisor's fetch loop or a rebalance
//! callback. The supervisor only reports assignments and the offsets of the records it hands
//! out; the thread shouts (an ERROR and two counters) when records were skipped.
//!
//! The committed offsets are looked up as soon as the assignment is known, long before this
//! process can commit anything for it (records are fetched, written, then committed at the
//! next commit interval), so the answer is the position the assignment started from.

use std::sync::Weak;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, warn};

use super::HistoryConsumer;
use super::offset_reset::{Detector, Jump, JumpKind, Loss, Span, judge};
use crate::domain::{Epoch, Record, TopicPartition};
use crate::metrics;

/// Longest wait for the broker's answer to one lookup.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

enum Note {
    Assigned(Vec<(TopicPartition, Epoch)>),
    Revoked(Vec<(TopicPartition, Epoch)>),
    Records(TopicPartition, Epoch, Span),
}

/// The supervisor's handle on the checking thread. The thread ends when this is dropped.
pub struct ResetWatch {
    notes: Sender<Note>,
}

impl ResetWatch {
    /// Starts the thread. It holds the consumer only while it calls the broker, so closing the
    /// consumer is not held up by it.
    pub fn start(consumer: Weak<HistoryConsumer>) -> Self {
        let (notes, receiver) = mpsc::channel();
        std::thread::Builder::new()
            .name("history-resets".into())
            .spawn(move || run(consumer, receiver))
            .expect("cannot start the offset-reset thread");
        ResetWatch { notes }
    }

    pub fn assigned(&self, partitions: &[(TopicPartition, Epoch)]) {
        let _ = self.notes.send(Note::Assigned(partitions.to_vec()));
    }

    pub fn revoked(&self, partitions: &[(TopicPartition, Epoch)]) {
        let _ = self.notes.send(Note::Revoked(partitions.to_vec()));
    }

    /// A run of records of one assignment, about to be processed, in offset order.
    pub fn records<T>(&self, tp: &TopicPartition, epoch: Epoch, records: &[(Record, T)]) {
        if let Some(span) = Span::of(records.iter().map(|(record, _)| record.offset)) {
            let _ = self.notes.send(Note::Records(tp.clone(), epoch, span));
        }
    }
}

fn run(consumer: Weak<HistoryConsumer>, notes: Receiver<Note>) {
    let mut detector = Detector::new();
    while let Ok(note) = notes.recv() {
        let mut assigned = Vec::new();
        apply(&mut detector, note, &mut assigned);
        while let Ok(note) = notes.try_recv() {
            apply(&mut detector, note, &mut assigned);
        }
        assigned.retain(|(tp, epoch)| detector.start_unknown(tp, *epoch));
        if !assigned.is_empty() {
            let Some(consumer) = consumer.upgrade() else {
                return;
            };
            for (tp, epoch, committed) in committed_offsets(&consumer, &assigned) {
                detector.started(&tp, epoch, committed);
            }
        }
        for (tp, _, jumps) in detector.take_jumps() {
            let Some(consumer) = consumer.upgrade() else {
                return;
            };
            check(&consumer, &tp, &jumps);
        }
    }
}

fn apply(detector: &mut Detector, note: Note, assigned: &mut Vec<(TopicPartition, Epoch)>) {
    match note {
        Note::Assigned(partitions) => {
            for (tp, epoch) in partitions {
                // Declared at 0, so that the first reset is an increase to Prometheus.
                metrics::init_offset_resets(&tp);
                detector.assigned(tp.clone(), epoch);
                assigned.push((tp, epoch));
            }
        }
        Note::Revoked(partitions) => {
            for (tp, epoch) in partitions {
                detector.revoked(&tp, epoch);
            }
        }
        Note::Records(tp, epoch, span) => detector.observed(&tp, epoch, &span),
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
