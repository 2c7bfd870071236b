//! What the Kafka side tells the actors. Defined here, below the actors, so that the rdkafka
//! callbacks and the commit worker reach the OffsetCommitter through a [`Recipient`] of these
//! messages without importing the actors; `actors::messages` re-exports them with the rest.
//!
//! [`Recipient`]: actix::Recipient

use std::time::Duration;

use actix::Message;

use crate::domain::{CommitOutcome, CommitPosition, Epoch, TopicPartition};

/// Kafka side → OffsetCommitter: the broker's verdict on a commit the committer asked for.
/// Only confirmed positions count as committed; the others are asked for again at the next
/// tick.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct CommitResult(pub CommitOutcome);

/// Kafka side → OffsetCommitter: these assignments end. No new records are admitted for them;
/// the committer answers once their in-flight records resolved (or `deadline` passed) with
/// the positions to commit synchronously before the partitions are given up — each partition's
/// contiguous resolved position, where it is ahead of the confirmed one. The real supervisor
/// calls this from inside librdkafka's rebalance callback, where it cannot await: it passes
/// `reply` and blocks on it.
#[derive(Message)]
#[rtype(result = "Vec<CommitPosition>")]
pub struct Revoke {
    pub partitions: Vec<(TopicPartition, Epoch)>,
    pub deadline: Duration,
    /// Answered at once with the positions resolved so far, before the wait: committing them
    /// straight away covers most of the work while the group is surely still settled (a broker
    /// may refuse commits once the next round of the rebalance has begun).
    pub early: Option<std::sync::mpsc::SyncSender<Vec<CommitPosition>>>,
    pub reply: Option<std::sync::mpsc::SyncSender<Vec<CommitPosition>>>,
}

/// Kafka side → OffsetCommitter: these assignments were lost (the group moved on without us):
/// discard them and commit nothing.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Lost {
    pub partitions: Vec<(TopicPartition, Epoch)>,
}

/// Kafka side → OffsetCommitter, when partitions are assigned, before any of their records:
/// what each one's previous owner listed as done above the position it committed
/// (`crate::offsets::done`). Records listed are resolved without being written.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Inherit(pub Vec<InheritedDone>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InheritedDone {
    pub tp: TopicPartition,
    pub epoch: Epoch,
    /// The committed position the list belongs to.
    pub position: i64,
    pub done: crate::offsets::DoneOffsets,
}
