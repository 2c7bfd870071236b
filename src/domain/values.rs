//! The values every layer passes around: a topic-partition and the epoch of its assignment,
//! a fetched record, a position to commit, why, and what became of it, an undecodable record as it will be
//! stored. Plain data: no actors, no I/O.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::decode::DecodeError;
use super::event::HistoryEvent;

/// Counts the assignments of a partition to this process. Every message about a partition
/// carries the epoch it belongs to, so that work of a revoked assignment is recognised and
/// discarded when it arrives after the revoke.
pub type Epoch = u64;

/// Counts the moves back of a partition's log within one assignment (a topic created again, a
/// truncated log): the records from the offset it moved back to are new, and their outcomes and
/// positions are told apart from those of the records they replaced by this.
pub type Generation = u32;

/// A topic and partition, cheap to clone.
#[derive(Clone, Eq, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: Arc<str>,
    pub partition: i32,
}

/// A map keyed by partition, with a hasher quicker than the standard one: looked up for every
/// record on the way through the service.
pub type PartitionMap<V> =
    std::collections::HashMap<TopicPartition, V, foldhash::fast::RandomState>;

impl PartialEq for TopicPartition {
    fn eq(&self, other: &Self) -> bool {
        // The partition first, and the topic's text only when it is not the same allocation:
        // compared for every record.
        self.partition == other.partition
            && (Arc::ptr_eq(&self.topic, &other.topic) || self.topic == other.topic)
    }
}

impl std::hash::Hash for TopicPartition {
    // What the derived one hashed; written out because equality is.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.topic.hash(state);
        self.partition.hash(state);
    }
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

/// A position to commit: every record of the partition before `offset` is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPosition {
    pub tp: TopicPartition,
    pub epoch: Epoch,
    /// The log's generation within the assignment: a position of a later one may be lower (the
    /// log moved back), one of an earlier one is never sent after it.
    pub generation: Generation,
    pub offset: i64,
    /// Offsets above `offset` already resolved: the commit's metadata lists them, so the next
    /// owner skips them (`crate::offsets::done`).
    pub done: std::sync::Arc<crate::offsets::done::DoneOffsets>,
}

/// What became of positions handed to the Kafka side for committing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitOutcome {
    /// The broker confirmed these (or an equal or later position was confirmed before).
    pub confirmed: Vec<CommitPosition>,
    /// Not committed: refused by the broker, or the partition is no longer assigned.
    pub failed: Vec<CommitPosition>,
}

impl CommitOutcome {
    pub fn is_complete(&self) -> bool {
        self.failed.is_empty()
    }
}

/// Why a commit happens, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitReason {
    Periodic,
    /// Every position held, the confirmed ones sent again: see [`CommitReason::resends_confirmed`].
    Reassert,
    Revoke,
    Shutdown,
}

impl CommitReason {
    /// Whether a position the broker already confirmed is sent again. The group's position of a
    /// partition is its owner's to keep; while we own one, a lower position committed by anyone
    /// else (a broker that let a second member hold the partition for a while) would otherwise
    /// stand until new records arrive — on an idle partition, for good. Re-asserting now and
    /// then puts it back. It never sends a position behind the confirmed one.
    pub fn resends_confirmed(self) -> bool {
        self == CommitReason::Reassert
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CommitReason::Periodic => "periodic",
            CommitReason::Reassert => "reassert",
            CommitReason::Revoke => "revoke",
            CommitReason::Shutdown => "shutdown",
        }
    }
}

/// A record's own bytes, kept with the event decoded from it until the event is written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordBytes {
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub timestamp_ms: Option<i64>,
}

/// An event with the record it was decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedEvent {
    pub event: HistoryEvent,
    pub record: RecordBytes,
}

/// The event is what the writer reads; the record is only for setting it aside.
impl std::ops::Deref for DecodedEvent {
    type Target = HistoryEvent;

    fn deref(&self) -> &HistoryEvent {
        &self.event
    }
}

/// A record that cannot be recorded as an event (undecodable, or a conflicting duplicate), as
/// it will be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub reason_code: &'static str,
    pub reason: String,
    pub field: Option<&'static str>,
    pub record_timestamp: Option<DateTime<Utc>>,
}

/// The reason code of a duplicate whose content differs from the stored row's.
pub const CONFLICTING_DUPLICATE: &str = "conflicting_duplicate";

/// The reason code of an event the database rejects that an operator set aside.
pub const SET_ASIDE: &str = "set_aside";

/// Every reason a dead letter can have: the decoder's codes, a conflicting duplicate, an event
/// set aside.
pub fn dead_letter_reasons() -> impl Iterator<Item = &'static str> {
    DecodeError::CODES
        .into_iter()
        .chain([CONFLICTING_DUPLICATE, SET_ASIDE])
}

impl DeadLetter {
    /// A redelivered `event_id` whose content differs from the stored row: kept beside it, as
    /// it came (`record`), with both versions named in the reason.
    pub fn conflicting_duplicate(
        stored: &HistoryEvent,
        redelivered: &HistoryEvent,
        record: RecordBytes,
    ) -> Self {
        let differ: Vec<&str> = [
            ("ticket_id", stored.ticket_id != redelivered.ticket_id),
            ("from_status", stored.from_status != redelivered.from_status),
            ("to_status", stored.to_status != redelivered.to_status),
            ("changed_at", stored.changed_at != redelivered.changed_at),
        ]
        .into_iter()
        .filter(|(_, differs)| *differs)
        .map(|(field, _)| field)
        .collect();
        DeadLetter {
            key: record.key,
            payload: record.payload,
            reason_code: CONFLICTING_DUPLICATE,
            reason: format!(
                "event_id {} is stored with other content ({} differ); the stored row is kept: \
                 ticket_id={}, from_status={}, to_status={}, changed_at={}",
                stored.event_id,
                differ.join(", "),
                stored.ticket_id,
                stored.from_status,
                stored.to_status,
                stored.changed_at.to_rfc3339(),
            ),
            field: None,
            record_timestamp: record
                .timestamp_ms
                .and_then(DateTime::<Utc>::from_timestamp_millis),
        }
    }

    /// An event the database rejects, set aside by an operator's request: its own bytes, who
    /// asked and when, and what the database said.
    pub fn set_aside(
        event_id: &str,
        record: RecordBytes,
        by: &str,
        at: DateTime<Utc>,
        reason: Option<&str>,
        rejected: &str,
    ) -> Self {
        let why = reason
            .map(|reason| format!(": {reason}"))
            .unwrap_or_default();
        DeadLetter {
            key: record.key,
            payload: record.payload,
            reason_code: SET_ASIDE,
            reason: format!(
                "event_id {event_id} set aside by {by} at {}{why}; the database rejected it: \
                 {rejected}",
                at.to_rfc3339()
            ),
            field: None,
            record_timestamp: record
                .timestamp_ms
                .and_then(DateTime::<Utc>::from_timestamp_millis),
        }
    }

    pub fn new(
        error: &DecodeError,
        key: Option<Vec<u8>>,
        payload: Option<Vec<u8>>,
        timestamp_ms: Option<i64>,
    ) -> Self {
        DeadLetter {
            key,
            payload,
            reason_code: error.code(),
            reason: error.to_string(),
            field: error.field().map(|field| field.name()),
            record_timestamp: timestamp_ms.and_then(DateTime::<Utc>::from_timestamp_millis),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn partitions_are_equal_by_topic_text_and_number_whatever_the_allocation() {
        let a = TopicPartition::new("tickets", 3);
        let same_text = TopicPartition::new("tickets", 3);
        assert!(!Arc::ptr_eq(&a.topic, &same_text.topic));
        assert_eq!(a, same_text);
        assert_eq!(a, a.clone());
        assert_ne!(a, TopicPartition::new("tickets", 4));
        assert_ne!(a, TopicPartition::new("tickets2", 3));
        let hasher = foldhash::fast::RandomState::default();
        assert_eq!(hasher.hash_one(&a), hasher.hash_one(&same_text));
        let mut map = PartitionMap::default();
        map.insert(a, 1);
        assert_eq!(map.get(&same_text), Some(&1));
    }
}
