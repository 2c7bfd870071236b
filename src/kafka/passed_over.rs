//! Offsets the client moved past without handing a record over.
//!
//! A transactional producer ends each transaction with a marker, a control record no consumer
//! is handed; under `read_committed` the records of an aborted transaction are not handed over
//! either. The client's position (`rd_kafka_position`: the offset after the last record or
//! marker the application polled past) then stands beyond the last record handed over, and the
//! committed position must follow it, or the group's lag never reaches 0 after a transactional
//! producer's last commit. The position is read on the thread that polls, between polls, so
//! every record the client handed over before is counted: past the last of them, the offsets
//! in between held no record this service is to see.

use crate::domain::{PartitionMap, TopicPartition};

/// What was handed over in each partition's current assignment.
#[derive(Debug, Default)]
pub(crate) struct HandedOver {
    partitions: PartitionMap<Seen>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// The offset after the last record handed over.
    next: Option<i64>,
    /// The furthest position already reported as passed over.
    passed: Option<i64>,
}

impl HandedOver {
    /// A record was handed over.
    pub(crate) fn record(&mut self, tp: &TopicPartition, offset: i64) {
        let seen = self.partitions.entry(tp.clone()).or_default();
        // A record below the last one is a log that moved back: it counts from there.
        seen.next = Some(offset + 1);
        seen.passed = None;
    }

    /// The offset after the last record of the partition handed over, if one was since its
    /// assignment.
    pub(crate) fn next(&self, tp: &TopicPartition) -> Option<i64> {
        self.partitions.get(tp).and_then(|seen| seen.next)
    }

    /// The partition's assignment began or ended: nothing of it is known.
    pub(crate) fn forget(&mut self, tp: &TopicPartition) {
        self.partitions.remove(tp);
    }

    /// The client's position in a partition: the offset it passed over to, if it is past the
    /// last record handed over (and not reported yet).
    pub(crate) fn passed_over(&mut self, tp: &TopicPartition, position: i64) -> Option<i64> {
        let seen = self.partitions.entry(tp.clone()).or_default();
        let floor = seen.passed.or(seen.next);
        if floor.is_some_and(|floor| position <= floor) {
            return None;
        }
        seen.passed = Some(position);
        Some(position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> TopicPartition {
        TopicPartition::new("t", 0)
    }

    #[test]
    fn a_position_past_the_last_record_is_passed_over_once() {
        let mut handed = HandedOver::default();
        handed.record(&tp(), 2);
        assert_eq!(handed.passed_over(&tp(), 3), None, "just the next offset");
        assert_eq!(handed.passed_over(&tp(), 4), Some(4), "a marker at 3");
        assert_eq!(handed.passed_over(&tp(), 4), None, "told once");
        assert_eq!(handed.passed_over(&tp(), 6), Some(6));
        handed.record(&tp(), 6);
        assert_eq!(handed.passed_over(&tp(), 7), None);
    }

    #[test]
    fn a_position_behind_a_record_handed_over_since_is_not() {
        // The position was read before a record the next poll returned; it never runs ahead.
        let mut handed = HandedOver::default();
        handed.record(&tp(), 10);
        assert_eq!(handed.passed_over(&tp(), 5), None);
        // After a move back, the new records count.
        handed.record(&tp(), 3);
        assert_eq!(handed.passed_over(&tp(), 4), None);
        assert_eq!(handed.passed_over(&tp(), 5), Some(5));
    }

    #[test]
    fn a_new_assignment_starts_from_nothing() {
        let mut handed = HandedOver::default();
        handed.record(&tp(), 10);
        handed.forget(&tp());
        // Only a marker since the assignment began: the client passed over to 12.
        assert_eq!(handed.passed_over(&tp(), 12), Some(12));
    }
}
