//! Records skipped by an offset reset, told apart from harmless gaps. When the group's committed
//! position (or the consumer's position) is behind the partition's log start — retention deleted
//! records before they were processed — librdkafka resets to the earliest record it still has,
//! and the records in between are gone. The service cannot bring them back, but it must say so.
//!
//! The detector follows each assigned partition's offsets: where the assignment starts (the
//! committed offset) and where the next record is expected. A record beyond the expected offset
//! is a *jump*. Most jumps are harmless — compaction removed records, transaction markers and
//! aborted transactions take offsets — so a jump is only a loss if the partition's log start
//! (its low watermark, fetched after the jump was seen) moved past the expected offset. This
//! module is the pure part; `kafka/reset_watch.rs` does the broker calls.

use std::collections::HashMap;

use crate::domain::{Epoch, TopicPartition};

/// Where a jump was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JumpKind {
    /// The first record of an assignment, beyond the group's committed offset.
    AtAssignment,
    /// A record beyond the one before it, while consuming.
    InStream,
}

/// Offsets skipped between two records, or between the committed offset and the first record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Jump {
    pub kind: JumpKind,
    /// The offset that should have come next (the committed offset, at assignment).
    pub expected: i64,
    /// The offset that came: where consumption resumed.
    pub resumed: i64,
}

/// Records lost to an offset reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loss {
    pub jump: Jump,
    /// The partition's first retained offset when it was checked.
    pub log_start: i64,
    /// Records between the expected offset and the first one still retained.
    pub skipped: u64,
}

/// Judges a jump against the log start fetched after it was seen. The records from `expected`
/// up to the log start (or up to where consumption resumed, if retention has moved on since)
/// were deleted before they were read; offsets missing above the log start are gaps of the log
/// itself, not losses.
pub(crate) fn judge(jump: Jump, log_start: i64) -> Option<Loss> {
    let skipped = log_start.min(jump.resumed) - jump.expected;
    (skipped > 0).then_some(Loss {
        jump,
        log_start,
        skipped: skipped as u64,
    })
}

/// The offsets of one run of records of a partition, in order: its ends and the jumps inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Span {
    pub first: i64,
    pub last: i64,
    /// `(expected, resumed)` for each record beyond its predecessor + 1. Usually empty.
    pub gaps: Vec<(i64, i64)>,
}

impl Span {
    /// The span of a run of offsets; `None` for an empty run.
    pub(crate) fn of(offsets: impl IntoIterator<Item = i64>) -> Option<Span> {
        let mut offsets = offsets.into_iter();
        let first = offsets.next()?;
        let mut span = Span {
            first,
            last: first,
            gaps: Vec::new(),
        };
        for offset in offsets {
            if offset > span.last + 1 {
                span.gaps.push((span.last + 1, offset));
            }
            span.last = offset;
        }
        Some(span)
    }
}

#[derive(Debug)]
struct Track {
    epoch: Epoch,
    /// The committed offset was looked up (whether the group had one or not).
    start_known: bool,
    /// The first offset of this assignment, once a record arrived.
    first: Option<i64>,
    /// The offset the next record should have, once known.
    next: Option<i64>,
    /// Jumps not yet judged.
    jumps: Vec<Jump>,
    /// Jumps not kept because [`MAX_UNJUDGED_JUMPS`] were waiting.
    dropped: u64,
}

/// Most jumps of one partition kept for judging while a lookup waits on the broker: gaps
/// (compaction, transaction markers) can come with every fetch, and the wait can be long.
pub(crate) const MAX_UNJUDGED_JUMPS: usize = 4096;

impl Track {
    fn push(&mut self, jump: Jump) {
        if self.jumps.len() < MAX_UNJUDGED_JUMPS {
            self.jumps.push(jump);
        } else {
            self.dropped += 1;
        }
    }
}

/// Follows the offsets of the assigned partitions and collects the jumps to judge.
#[derive(Debug, Default)]
pub(crate) struct Detector {
    partitions: HashMap<TopicPartition, Track>,
}

impl Detector {
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Detector::default()
    }

    /// A new assignment of `tp`; replaces whatever an earlier one left.
    pub(crate) fn assigned(&mut self, tp: TopicPartition, epoch: Epoch) {
        self.partitions.insert(
            tp,
            Track {
                epoch,
                start_known: false,
                first: None,
                next: None,
                jumps: Vec::new(),
                dropped: 0,
            },
        );
    }

    pub(crate) fn revoked(&mut self, tp: &TopicPartition, epoch: Epoch) {
        if self.partitions.get(tp).is_some_and(|t| t.epoch == epoch) {
            self.partitions.remove(tp);
        }
    }

    /// The group's committed offset for the assignment, looked up after it began; `None` if the
    /// group has none (it starts from the earliest record: nothing is skipped) or the lookup
    /// failed.
    pub(crate) fn started(&mut self, tp: &TopicPartition, epoch: Epoch, committed: Option<i64>) {
        let Some(track) = self.track(tp, epoch) else {
            return;
        };
        track.start_known = true;
        let Some(committed) = committed else {
            return;
        };
        match track.first {
            Some(first) if first > committed => track.push(Jump {
                kind: JumpKind::AtAssignment,
                expected: committed,
                resumed: first,
            }),
            Some(_) => {}
            None => track.next = Some(committed),
        }
    }

    /// A run of records of `tp`, in order.
    pub(crate) fn observed(&mut self, tp: &TopicPartition, epoch: Epoch, span: &Span) {
        let Some(track) = self.track(tp, epoch) else {
            return;
        };
        if let Some(next) = track.next {
            if span.first > next {
                let kind = if track.first.is_none() {
                    JumpKind::AtAssignment
                } else {
                    JumpKind::InStream
                };
                track.push(Jump {
                    kind,
                    expected: next,
                    resumed: span.first,
                });
            }
        }
        track.first.get_or_insert(span.first);
        for &(expected, resumed) in &span.gaps {
            track.push(Jump {
                kind: JumpKind::InStream,
                expected,
                resumed,
            });
        }
        track.next = Some(span.last + 1);
    }

    /// Whether the assignment's committed offset is still to be looked up.
    pub(crate) fn start_unknown(&self, tp: &TopicPartition, epoch: Epoch) -> bool {
        self.partitions
            .get(tp)
            .is_some_and(|t| t.epoch == epoch && !t.start_known)
    }

    /// Takes the jumps waiting to be judged, per partition, with how many more were not kept
    /// ([`MAX_UNJUDGED_JUMPS`]). Their log start must be fetched after this call, so that it
    /// is at least the one librdkafka reset to.
    pub(crate) fn take_jumps(&mut self) -> Vec<(TopicPartition, Epoch, Vec<Jump>, u64)> {
        self.partitions
            .iter_mut()
            .filter(|(_, track)| !track.jumps.is_empty())
            .map(|(tp, track)| {
                let dropped = std::mem::take(&mut track.dropped);
                (
                    tp.clone(),
                    track.epoch,
                    std::mem::take(&mut track.jumps),
                    dropped,
                )
            })
            .collect()
    }

    /// Whether any jump waits to be judged.
    pub(crate) fn has_jumps(&self) -> bool {
        self.partitions
            .values()
            .any(|track| !track.jumps.is_empty())
    }

    fn track(&mut self, tp: &TopicPartition, epoch: Epoch) -> Option<&mut Track> {
        self.partitions.get_mut(tp).filter(|t| t.epoch == epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> TopicPartition {
        TopicPartition::new("tickets.status.v1", 0)
    }

    fn span(offsets: impl IntoIterator<Item = i64>) -> Span {
        Span::of(offsets).unwrap()
    }

    fn at_assignment(expected: i64, resumed: i64) -> Jump {
        Jump {
            kind: JumpKind::AtAssignment,
            expected,
            resumed,
        }
    }

    /// The jumps of a partition after a committed offset and the runs of records.
    fn jumps(committed_first: bool, committed: Option<i64>, runs: &[Vec<i64>]) -> Vec<Jump> {
        let mut detector = Detector::new();
        detector.assigned(tp(), 1);
        if committed_first {
            detector.started(&tp(), 1, committed);
        }
        for run in runs {
            detector.observed(&tp(), 1, &span(run.iter().copied()));
        }
        if !committed_first {
            detector.started(&tp(), 1, committed);
        }
        detector
            .take_jumps()
            .into_iter()
            .flat_map(|(_, _, jumps, _)| jumps)
            .collect()
    }

    #[test]
    fn a_first_record_beyond_the_committed_offset_is_a_jump_whichever_is_known_first() {
        for committed_first in [true, false] {
            assert_eq!(
                jumps(committed_first, Some(5), &[vec![117, 118], vec![119]]),
                vec![at_assignment(5, 117)],
                "committed known first: {committed_first}"
            );
        }
    }

    #[test]
    fn resuming_at_the_committed_offset_is_no_jump() {
        for committed_first in [true, false] {
            assert!(jumps(committed_first, Some(5), &[vec![5, 6], vec![7]]).is_empty());
        }
    }

    #[test]
    fn a_group_without_a_committed_offset_starts_anywhere_silently() {
        for committed_first in [true, false] {
            assert!(jumps(committed_first, None, &[vec![117, 118]]).is_empty());
        }
    }

    #[test]
    fn a_first_record_before_the_committed_offset_is_no_jump() {
        // The log was truncated below the committed offset (a recreated topic): records are
        // read again, nothing is skipped.
        assert!(jumps(true, Some(50), &[vec![0, 1, 2]]).is_empty());
        assert!(jumps(false, Some(50), &[vec![0, 1, 2]]).is_empty());
    }

    #[test]
    fn jumps_while_consuming_are_found_between_runs_and_inside_a_run() {
        let found = jumps(true, Some(0), &[vec![0, 1, 2], vec![10, 11, 20], vec![21]]);
        let expected = vec![
            Jump {
                kind: JumpKind::InStream,
                expected: 3,
                resumed: 10,
            },
            Jump {
                kind: JumpKind::InStream,
                expected: 12,
                resumed: 20,
            },
        ];
        assert_eq!(found, expected);
    }

    #[test]
    fn jumps_are_taken_once() {
        let mut detector = Detector::new();
        detector.assigned(tp(), 1);
        detector.started(&tp(), 1, Some(5));
        detector.observed(&tp(), 1, &span([117]));
        assert_eq!(detector.take_jumps().len(), 1);
        assert!(detector.take_jumps().is_empty());
    }

    #[test]
    fn records_and_answers_of_another_assignment_are_ignored() {
        let mut detector = Detector::new();
        detector.assigned(tp(), 2);
        detector.started(&tp(), 1, Some(5));
        assert!(detector.start_unknown(&tp(), 2));
        detector.observed(&tp(), 1, &span([117]));
        detector.started(&tp(), 2, None);
        detector.observed(&tp(), 2, &span([117]));
        assert!(detector.take_jumps().is_empty());
        detector.revoked(&tp(), 1);
        assert!(
            !detector.start_unknown(&tp(), 2),
            "epoch 2 is still tracked"
        );
        detector.revoked(&tp(), 2);
        detector.observed(&tp(), 2, &span([500]));
        assert!(detector.take_jumps().is_empty());
    }

    #[test]
    fn a_jump_is_a_loss_only_if_the_log_start_passed_the_expected_offset() {
        let jump = at_assignment(5, 117);
        assert_eq!(
            judge(jump, 0),
            None,
            "compaction or markers: the log still starts at 0"
        );
        assert_eq!(judge(jump, 5), None, "the expected record is still there");
        assert_eq!(
            judge(jump, 117),
            Some(Loss {
                jump,
                log_start: 117,
                skipped: 112
            })
        );
        // Compaction gaps above the log start are no loss.
        assert_eq!(judge(jump, 100).unwrap().skipped, 95);
        // Retention moved on after consumption resumed: what was read was not skipped.
        assert_eq!(judge(jump, 300).unwrap().skipped, 112);
    }

    #[test]
    fn a_span_lists_the_gaps_inside_a_run() {
        assert_eq!(Span::of(std::iter::empty()), None);
        assert_eq!(
            span([4, 5, 7, 8, 12]),
            Span {
                first: 4,
                last: 12,
                gaps: vec![(6, 7), (9, 12)],
            }
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Against a model: with records read at the offsets given, after a committed
            /// offset, the jumps are exactly the holes between consecutive read offsets (and
            /// between the committed offset and the first), however the records are split
            /// into runs and whenever the committed offset becomes known.
            #[test]
            fn jumps_are_the_holes_between_consecutive_offsets(
                steps in proptest::collection::vec(1i64..4, 1..40),
                committed in proptest::option::of(0i64..20),
                cuts in proptest::collection::vec(any::<bool>(), 40),
                committed_first in any::<bool>(),
            ) {
                let mut offsets = Vec::new();
                let mut offset = 10;
                for step in &steps {
                    offsets.push(offset);
                    offset += step;
                }
                let mut runs: Vec<Vec<i64>> = vec![Vec::new()];
                for (i, offset) in offsets.iter().enumerate() {
                    runs.last_mut().unwrap().push(*offset);
                    if cuts[i] {
                        runs.push(Vec::new());
                    }
                }
                runs.retain(|run| !run.is_empty());
                let mut model = Vec::new();
                if let Some(committed) = committed {
                    if offsets[0] > committed {
                        model.push((committed, offsets[0]));
                    }
                }
                for pair in offsets.windows(2) {
                    if pair[1] > pair[0] + 1 {
                        model.push((pair[0] + 1, pair[1]));
                    }
                }
                let found: Vec<(i64, i64)> = jumps(committed_first, committed, &runs)
                    .into_iter()
                    .map(|jump| (jump.expected, jump.resumed))
                    .collect();
                let mut found_sorted = found.clone();
                found_sorted.sort();
                model.sort();
                prop_assert_eq!(found_sorted, model);
            }
        }
    }
}
