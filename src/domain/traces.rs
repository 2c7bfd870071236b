//! What every resolved record leaves in the database, and whether a stretch of the log left it:
//! the check behind "the database is behind the group's committed offsets".
//!
//! A record below a partition's committed position was resolved, and every resolution writes
//! its trace in the same transaction that makes it final: a valid event its inbox marker (new,
//! or already there from a redelivery or a duplicate on another partition), a record that can
//! never become an event its dead letter, at its coordinates. A database restored from a backup
//! or emptied while the group's offsets stayed lacks the traces of the records resolved since;
//! the group would never read them again. The newest records below the committed position are
//! the first such a database lacks, so those are the ones checked.

use std::collections::HashSet;

use super::event::HistoryEvent;
use super::values::Record;

/// The trace a resolved record must have left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Trace {
    /// A valid event: its inbox marker.
    Marker(String),
    /// A record that can never become an event: its dead letter, at this offset.
    DeadLetter(i64),
}

impl Trace {
    /// Decoded as the service decodes it, so that the record's trace is the one it left.
    pub(crate) fn of(record: &Record, max_payload_bytes: usize) -> Trace {
        match HistoryEvent::decode(record.payload.as_deref(), max_payload_bytes) {
            Ok(event) => Trace::Marker(event.event_id),
            Err(_) => Trace::DeadLetter(record.offset),
        }
    }
}

/// The traces of records below a committed position that the database was asked about.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Inbox markers present, of those asked about.
    pub markers: HashSet<String>,
    /// Offsets whose dead letter is present, of those asked about.
    pub dead_letters: HashSet<i64>,
}

/// Records resolved (below the committed position) whose trace the database lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Untraced {
    /// The lowest offset checked that lacks its trace.
    pub first: i64,
    /// The highest.
    pub last: i64,
    /// How many of those checked lack it.
    pub count: usize,
    /// How many were checked.
    pub checked: usize,
}

/// Which of `records` (offset order, each paired with its trace) left no trace in `found`;
/// `None` when every one did.
pub(crate) fn untraced(records: &[(i64, Trace)], found: &Found) -> Option<Untraced> {
    let missing: Vec<i64> = records
        .iter()
        .filter(|(_, trace)| match trace {
            Trace::Marker(id) => !found.markers.contains(id),
            Trace::DeadLetter(offset) => !found.dead_letters.contains(offset),
        })
        .map(|(offset, _)| *offset)
        .collect();
    Some(Untraced {
        first: *missing.first()?,
        last: *missing.last()?,
        count: missing.len(),
        checked: records.len(),
    })
}

/// Where the newest `count` records below `committed` start, in a log that begins at
/// `log_start`; `None` when the log holds none below it (never committed past its start, or
/// retention deleted them).
pub(crate) fn tail_start(log_start: i64, committed: i64, count: usize) -> Option<i64> {
    let from = committed.saturating_sub(count as i64).max(log_start);
    (from < committed).then_some(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, payload: &str) -> Record {
        Record {
            offset,
            key: None,
            payload: Some(payload.as_bytes().to_vec()),
            timestamp_ms: None,
        }
    }

    fn event(id: &str) -> String {
        format!(
            r#"{{"event_id":"{id}","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"2026-01-01T00:00:00Z"}}"#
        )
    }

    #[test]
    fn a_valid_event_leaves_its_marker_and_anything_else_its_dead_letter() {
        assert_eq!(
            Trace::of(&record(4, &event("e-1")), 1024),
            Trace::Marker("e-1".into())
        );
        assert_eq!(
            Trace::of(&record(5, "not json"), 1024),
            Trace::DeadLetter(5)
        );
        // Too large for this service: dead-lettered, whatever it holds.
        assert_eq!(
            Trace::of(&record(6, &event("e-2")), 16),
            Trace::DeadLetter(6)
        );
    }

    #[test]
    fn every_trace_present_is_nothing_untraced() {
        let records = [
            (10, Trace::Marker("a".into())),
            (11, Trace::DeadLetter(11)),
            (12, Trace::Marker("a".into())),
        ];
        let found = Found {
            markers: ["a".to_owned()].into(),
            dead_letters: [11].into(),
        };
        assert_eq!(untraced(&records, &found), None);
        assert_eq!(untraced(&[], &Found::default()), None);
    }

    #[test]
    fn the_records_whose_trace_is_missing_are_counted_from_the_first_to_the_last() {
        let records = [
            (10, Trace::Marker("a".into())),
            (11, Trace::DeadLetter(11)),
            (13, Trace::Marker("b".into())),
            (14, Trace::Marker("c".into())),
        ];
        let found = Found {
            markers: ["a".to_owned()].into(),
            dead_letters: HashSet::new(),
        };
        assert_eq!(
            untraced(&records, &found),
            Some(Untraced {
                first: 11,
                last: 14,
                count: 3,
                checked: 4
            })
        );
    }

    #[test]
    fn the_tail_is_the_newest_records_below_the_committed_position_within_the_log() {
        assert_eq!(tail_start(0, 1000, 64), Some(936));
        assert_eq!(tail_start(980, 1000, 64), Some(980));
        assert_eq!(tail_start(0, 10, 64), Some(0));
        // Nothing below it: the group starts at the log start, or retention passed it.
        assert_eq!(tail_start(0, 0, 64), None);
        assert_eq!(tail_start(1200, 1000, 64), None);
    }
}
