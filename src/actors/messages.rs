//! The messages the actors exchange. A record's path:
//!
//! ```text
//! Kafka side --Records--> PartitionActor --Track--> OffsetCommitter
//!                              |  (reply: accepted, window length)
//!                              +--WriteJobs--> DbWriter --Resolved--> OffsetCommitter
//! OffsetCommitter --WindowUpdate--> PartitionActor --FlowControl--> Kafka side
//! OffsetCommitter --CommitOffsets--> Kafka side
//! ```
//!
//! The Kafka side (the real supervisor or a test's mock) talks to the rest only through these
//! messages and the [`Pipeline`](super::Pipeline) handle.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use actix::{Message, Recipient};

use crate::domain::HistoryEvent;
use crate::store::dead_letters::DeadLetter;

/// Counts the assignments of a partition to this process. Every message about a partition
/// carries the epoch it belongs to, so that work of a revoked assignment is recognised and
/// discarded when it arrives after the revoke.
pub type Epoch = u64;

/// A topic and partition, cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: Arc<str>,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: &str, partition: i32) -> Self {
        TopicPartition {
            topic: Arc::from(topic),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.topic, self.partition)
    }
}

impl fmt::Debug for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One fetched Kafka record, copied out of the consumer's buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    /// `None` for a tombstone.
    pub payload: Option<Vec<u8>>,
    /// Milliseconds since the epoch, if the record has a timestamp.
    pub timestamp_ms: Option<i64>,
}

/// A partition's fetched records, in offset order. Kafka side → PartitionActor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Records(pub Vec<Record>);

/// Stop a partition actor (revoke, shutdown). Its undispatched records are dropped: their
/// offsets were never tracked, so the committed position stays before them.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopPartition;

/// PartitionActor → Kafka side: the partition's window is full (pause fetching it) or has
/// drained (resume).
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub enum FlowControl {
    Pause { tp: TopicPartition, epoch: Epoch },
    Resume { tp: TopicPartition, epoch: Epoch },
}

/// A position to commit: every record of the partition before `offset` is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPosition {
    pub tp: TopicPartition,
    pub epoch: Epoch,
    pub offset: i64,
}

/// Why a commit happens, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitReason {
    Periodic,
    Revoke,
    Shutdown,
}

impl CommitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CommitReason::Periodic => "periodic",
            CommitReason::Revoke => "revoke",
            CommitReason::Shutdown => "shutdown",
        }
    }
}

/// OffsetCommitter → Kafka side: commit these positions (asynchronously; periodic commits).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct CommitOffsets {
    pub positions: Vec<CommitPosition>,
    pub reason: CommitReason,
}

/// PartitionActor → OffsetCommitter: these offsets are about to be dispatched; track them.
/// Awaited before dispatch, so a resolution can never reach the committer before its offset.
#[derive(Message)]
#[rtype(result = "TrackReply")]
pub struct Track {
    pub tp: TopicPartition,
    pub epoch: Epoch,
    pub offsets: Vec<i64>,
    /// Where the committer sends this partition's window updates.
    pub partition: Recipient<WindowUpdate>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackReply {
    /// Tracked; `dispatch[i]` says whether `offsets[i]` should be written (false for an offset
    /// already in flight). `window` is the window's state after tracking.
    Accepted {
        dispatch: Vec<bool>,
        window: WindowState,
    },
    /// The epoch is over (revoked or lost): drop the records.
    Rejected,
}

/// The size of a partition's window, versioned so a stale update never overwrites a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowState {
    pub len: usize,
    pub version: u64,
}

/// OffsetCommitter → PartitionActor: the window shrank (the position moved).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct WindowUpdate {
    pub epoch: Epoch,
    pub window: WindowState,
}

/// What a writer must do for one record.
#[derive(Debug, Clone)]
pub enum Work {
    /// Record the event (the per-event transaction, batched).
    Event(HistoryEvent),
    /// Store the undecodable record in the dead-letter table.
    DeadLetter(DeadLetter),
}

/// One record's work, with where its outcome must be reported.
#[derive(Debug, Clone)]
pub struct WriteJob {
    pub tp: TopicPartition,
    pub epoch: Epoch,
    pub offset: i64,
    pub work: Work,
}

/// PartitionActor → DbWriter.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WriteJobs(pub Vec<WriteJob>);

/// One resolved offset: its outcome is Applied, AlreadyApplied or dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedOffset {
    pub tp: TopicPartition,
    pub epoch: Epoch,
    pub offset: i64,
}

/// DbWriter → OffsetCommitter.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resolved(pub Vec<ResolvedOffset>);

/// Kafka side → OffsetCommitter: these assignments end. Returns the positions to commit
/// synchronously before the partitions are given up. The real supervisor calls this from
/// inside librdkafka's rebalance callback, where it cannot await: it passes `reply` and blocks
/// on it with a deadline.
#[derive(Message)]
#[rtype(result = "Vec<CommitPosition>")]
pub struct Revoke {
    pub partitions: Vec<(TopicPartition, Epoch)>,
    pub reply: Option<std::sync::mpsc::SyncSender<Vec<CommitPosition>>>,
}

/// Kafka side → OffsetCommitter: these assignments were lost (the group moved on without us):
/// discard them and commit nothing.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Lost {
    pub partitions: Vec<(TopicPartition, Epoch)>,
}

/// Shutdown: wait until nothing is in flight (or the deadline passes), then return the
/// positions to commit. Tracking stops: later Track requests are rejected.
#[derive(Message)]
#[rtype(result = "Vec<CommitPosition>")]
pub struct Drain {
    pub deadline: Duration,
}

/// Connects the committer to the Kafka side that performs its commits.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AttachKafka(pub Recipient<CommitOffsets>);

/// A snapshot of one partition's window, for tests and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowSnapshot {
    pub tp: TopicPartition,
    pub epoch: Epoch,
    /// Entries held: unresolved offsets and resolved ones waiting behind them.
    pub len: usize,
    pub unresolved: usize,
    /// The position: every tracked offset before it is resolved.
    pub position: Option<i64>,
    /// The position last handed over for committing.
    pub committed: Option<i64>,
}

/// Asks the committer for a snapshot of every window.
#[derive(Message)]
#[rtype(result = "Vec<WindowSnapshot>")]
pub struct InspectWindows;
