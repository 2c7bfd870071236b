//! The messages the actors exchange. A record's path:
//!
//! ```text
//! Kafka side --Records--> PartitionActor --Admit--> OffsetCommitter --WriteJobs--> DbWriter
//!                              ^  (reply: accepted, window length)            |
//!                              +--WindowUpdate-- OffsetCommitter <--Resolved--+
//! Kafka side pauses a full partition itself (WindowFill); PartitionActor --Drained--> Kafka side
//! OffsetCommitter --CommitOffsets--> Kafka side --CommitResult--> OffsetCommitter
//! ```
//!
//! The Kafka side (the real supervisor or a test's mock) talks to the rest only through these
//! messages and the [`Pipeline`](super::Pipeline) handle. What the rdkafka callbacks and the
//! commit worker send (`CommitResult`, `Revoke`, `Lost`) is defined below the actors, in
//! [`crate::kafka::messages`], and re-exported here.

use std::time::Duration;

use actix::{Message, Recipient};

pub use crate::domain::budget::Held;
pub use crate::domain::values::{
    CommitOutcome, CommitPosition, CommitReason, DeadLetter, DecodedEvent, Epoch, Generation,
    Record, RecordBytes, TopicPartition,
};
pub use crate::kafka::messages::{CommitResult, Inherit, InheritedDone, Lost, Revoke};

/// A partition's fetched records, in offset order, each with its share of the budget. Kafka
/// side → PartitionActor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Records(pub Vec<(Record, Held)>);

/// The Kafka client moved past offsets it hands no record of (transaction markers, records of
/// aborted transactions): in this assignment the partition has no record below this offset
/// beyond those handed over before. Kafka side → PartitionActor, in order with the records.
#[derive(Message, Debug, Clone, Copy, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct PassedOver(pub i64);

/// Stop a partition actor (revoke, shutdown). Its undispatched records are dropped: their
/// offsets were never tracked, so the committed position stays before them.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopPartition;

/// PartitionActor → Kafka side: the partition the Kafka side paused has drained (nothing
/// queued, the window at half): resume fetching it, if that still holds
/// ([`WindowFill::resume`](super::window_fill::WindowFill::resume)).
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct Drained {
    pub tp: TopicPartition,
    pub epoch: Epoch,
}

/// OffsetCommitter → Kafka side: commit these positions (periodic commits). The Kafka side
/// answers with a [`CommitResult`] once the broker confirmed or refused them.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct CommitOffsets {
    pub positions: Vec<CommitPosition>,
    pub reason: CommitReason,
}

/// PartitionActor → OffsetCommitter: admit these decoded records into the partition's window.
/// The committer tracks their offsets and hands them to the writers in the same step, so a
/// record is either tracked *and* on its way to a writer, or neither: nothing tracked can be
/// stranded by a partition actor that stops (revoke, shutdown) before it dispatched.
#[derive(Message)]
#[rtype(result = "AdmitReply")]
pub struct Admit {
    pub tp: TopicPartition,
    pub epoch: Epoch,
    pub jobs: Vec<WriteJob>,
    /// After these jobs, no record below this offset is still to come ([`PassedOver`]).
    pub passed_over: Option<i64>,
    /// Where the committer sends this partition's window updates.
    pub partition: Recipient<WindowUpdate>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitReply {
    /// Tracked and dispatched (an offset already tracked is a log that moved back: tracked
    /// again, as new). `window`
    /// is the window's state after admitting.
    Accepted { window: WindowState },
    /// The epoch is over (revoked, lost, or shutting down): the records were dropped.
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
    /// Record the event (the per-event transaction, batched); its record's bytes come along,
    /// for a dead letter if it turns out to conflict with the stored row. Boxed: a job moves
    /// about eight times between the fetch and its transaction (queues, messages, batches),
    /// and the event with its bytes is most of its size.
    Event(Box<DecodedEvent>),
    /// Store the undecodable record in the dead-letter table. Boxed too: inline, the rare
    /// letter would make every job its size (184 bytes against 80).
    DeadLetter(Box<DeadLetter>),
}

// Every job is copied at each of those moves: a variant that grows it fails the build.
const _: () = assert!(std::mem::size_of::<WriteJob>() <= 80);

/// One record's work, with where its outcome must be reported.
#[derive(Debug, Clone)]
pub struct WriteJob {
    pub tp: TopicPartition,
    pub epoch: Epoch,
    /// The generation its offset is tracked under (set by the committer when it admits it).
    pub generation: Generation,
    pub offset: i64,
    pub work: Work,
    /// The record's share of the budget, given back when the job is done with.
    pub held: Held,
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
    pub generation: Generation,
    pub offset: i64,
}

/// DbWriter → OffsetCommitter.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resolved(pub Vec<ResolvedOffset>);

/// OffsetCommitter → every DbWriter: these assignments are being revoked. Each writer takes
/// their jobs out of its buffer (those no transaction has started) and hands them back in
/// [`Withdrawn`]; the committer writes again those it must to leave nothing written behind the
/// position it commits, and leaves the rest to the next owner — so a revoke waits for the
/// transactions under way, not for every queue to drain, and no record is written twice.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Withdraw {
    /// Names the revoke, whose answers the committer gathers.
    pub id: u64,
    pub partitions: Vec<(TopicPartition, Epoch)>,
}

/// DbWriter → OffsetCommitter: the jobs it took out of its buffer for a [`Withdraw`].
#[derive(Message)]
#[rtype(result = "()")]
pub struct Withdrawn {
    pub id: u64,
    pub jobs: Vec<WriteJob>,
}

/// DbWriter → OffsetCommitter: the database rejects this event by itself; its writer retries
/// it alone, and its partition's position waits at its offset. A revoke or a drain does not
/// wait for it between its retries: it would not resolve in their time, and waiting would only
/// hold up the rest (a revoke, every partition of the instance). Its next reader tries it again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Parked(pub ResolvedOffset);

/// DbWriter → OffsetCommitter: a parked event's retry begins. Answered whether its assignment
/// is still open; if it is, the event is awaited again until the retry settles (`Parked` again,
/// or `Resolved`), so a revoke that comes meanwhile waits for the retry's write like any write
/// under way (within its deadline) instead of handing the partition over while the old owner
/// still writes the event.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct RetryBegins(pub ResolvedOffset);

/// Shutdown: wait until nothing is in flight (or the deadline passes), then report the
/// positions to commit. Admitting stops: later Admit requests are rejected.
#[derive(Message)]
#[rtype(result = "DrainReport")]
pub struct Drain {
    pub deadline: Duration,
}

/// Where the pipeline stands once a drain ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Each partition's contiguous resolved position, where ahead of the confirmed one.
    pub positions: Vec<CommitPosition>,
    /// Records still unresolved at the deadline: the next owner reads them again.
    pub unresolved: usize,
    /// Records resolved (written) but behind an unresolved one: no commit can cover them, so
    /// the next owner reads them again and finds them `AlreadyApplied`.
    pub resolved_behind: usize,
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
    /// The position the broker last confirmed.
    pub confirmed: Option<i64>,
}

/// Asks the committer for a snapshot of every window.
#[derive(Message)]
#[rtype(result = "Vec<WindowSnapshot>")]
pub struct InspectWindows;

/// Asks the committer how many outcomes it discarded because their assignment (epoch) was
/// over: revoked or lost before the database answered.
#[derive(Message)]
#[rtype(result = "u64")]
pub struct StaleOutcomes;
