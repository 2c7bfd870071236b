//! Property tests of the offset window against a model: the records of the partition's current
//! log as the window has seen them (offset → resolved), over random fetches with gaps,
//! resolutions in any order, moves back of the log (a re-created topic, a truncation, the same
//! offsets delivered again) and late outcomes of the records a move back made obsolete.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{Generation, OffsetWindow, TrackResult, UntrackedOffset};

#[derive(Debug, Clone)]
enum Op {
    /// Fetch the next record, `gap` offsets after the previous one (compaction, markers).
    Fetch { gap: u8 },
    /// The log moves back: the next record is at or below the highest one delivered; `pick`
    /// selects where (from the lowest offset ever delivered to the highest).
    Rewind { pick: usize },
    /// Resolve an in-flight record of the current log; `pick` selects which.
    Resolve { pick: usize },
    /// The outcome of a record a move back made obsolete arrives; `pick` selects which.
    LateOutcome { pick: usize },
    /// The client moved past `gap` offsets after the last record without a record (transaction
    /// markers): it passes over to there.
    PassOver { gap: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4).prop_map(|gap| Op::Fetch { gap }),
        1 => any::<usize>().prop_map(|pick| Op::Rewind { pick }),
        6 => any::<usize>().prop_map(|pick| Op::Resolve { pick }),
        2 => any::<usize>().prop_map(|pick| Op::LateOutcome { pick }),
        1 => (1u8..4).prop_map(|gap| Op::PassOver { gap }),
    ]
}

/// What the test knows of the partition.
#[derive(Debug, Default)]
struct Model {
    /// The current log's records the window tracked: offset → (generation, resolved).
    records: BTreeMap<i64, (Generation, bool)>,
    /// Records a move back made obsolete, not yet resolved: their outcomes are still to come.
    obsolete: Vec<(i64, Generation)>,
    /// The highest offset delivered since the last move back, and the lowest ever.
    highest: Option<i64>,
    lowest: Option<i64>,
}

impl Model {
    fn unresolved(&self) -> usize {
        self.records
            .values()
            .filter(|(_, resolved)| !resolved)
            .count()
    }
}

/// The safety rules: the position never passes a record of the current log that is not
/// resolved, never passes what was delivered, and the counts agree with the model.
fn check(window: &OffsetWindow, model: &Model) {
    if let Some(position) = window.position() {
        for (&offset, &(_, resolved)) in &model.records {
            assert!(
                resolved || offset >= position,
                "position {position} passes unresolved {offset}: {model:?}"
            );
        }
        if let Some(highest) = model.highest {
            assert!(
                position <= highest + 1,
                "position {position} past {highest}"
            );
        }
    }
    assert_eq!(window.unresolved(), model.unresolved(), "{model:?}");
}

fn track(window: &mut OffsetWindow, model: &mut Model, offset: i64) -> TrackResult {
    let result = window.track(offset);
    let generation = result.generation();
    match result {
        TrackResult::Tracked(_) => {
            assert!(model.highest.is_none_or(|highest| offset > highest));
        }
        TrackResult::Rewound(rewind) => {
            assert!(model.highest.is_some_and(|highest| offset <= highest));
            assert_eq!(rewind.to, offset);
            // Everything tracked from the rewind's offset on is forgotten; unresolved ones
            // still owe their outcome.
            let forgotten: Vec<i64> = model.records.range(offset..).map(|(&o, _)| o).collect();
            let mut unresolved = 0;
            for o in forgotten {
                let (g, resolved) = model.records.remove(&o).expect("present");
                if !resolved {
                    unresolved += 1;
                    model.obsolete.push((o, g));
                }
            }
            assert_eq!(rewind.forgotten, unresolved);
            assert!(rewind.position_after.is_none_or(|p| p <= offset));
        }
    }
    model.records.insert(offset, (generation, false));
    model.highest = Some(offset);
    model.lowest = Some(model.lowest.map_or(offset, |lowest| lowest.min(offset)));
    result
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_position_never_passes_an_unresolved_record_of_the_current_log(
        start in 0i64..1_000_000,
        ops in prop::collection::vec(op(), 0..300),
    ) {
        let mut window = OffsetWindow::new();
        let mut model = Model::default();
        let mut last_position = None;
        for op in ops {
            match op {
                Op::Fetch { gap } => {
                    let offset = model.highest.map_or(start, |h| h + 1) + i64::from(gap);
                    track(&mut window, &mut model, offset);
                }
                Op::Rewind { pick } => {
                    let (Some(lowest), Some(highest)) = (model.lowest, model.highest) else {
                        continue;
                    };
                    let offset = lowest + (pick as i64).rem_euclid(highest - lowest + 1);
                    prop_assert!(matches!(
                        track(&mut window, &mut model, offset),
                        TrackResult::Rewound(_)
                    ));
                    last_position = window.position();
                }
                Op::Resolve { pick } => {
                    let in_flight: Vec<(i64, Generation)> = model
                        .records
                        .iter()
                        .filter(|(_, (_, resolved))| !resolved)
                        .map(|(&offset, &(generation, _))| (offset, generation))
                        .collect();
                    if in_flight.is_empty() {
                        continue;
                    }
                    let (offset, generation) = in_flight[pick % in_flight.len()];
                    let before = window.len();
                    let released = window.resolve(offset, generation).unwrap();
                    prop_assert_eq!(before - released, window.len());
                    model.records.insert(offset, (generation, true));
                }
                Op::PassOver { gap } => {
                    let next = model.highest.map_or(start, |h| h + 1);
                    prop_assert!(window.pass_over(next + i64::from(gap)));
                    // Not past the last record: nothing to pass over.
                    prop_assert!(!window.pass_over(next + i64::from(gap)));
                    model.highest = Some(next + i64::from(gap) - 1);
                }
                Op::LateOutcome { pick } => {
                    if model.obsolete.is_empty() {
                        continue;
                    }
                    let (offset, generation) =
                        model.obsolete.swap_remove(pick % model.obsolete.len());
                    let (position, len, unresolved) =
                        (window.position(), window.len(), window.unresolved());
                    prop_assert_eq!(
                        window.resolve(offset, generation),
                        Err(UntrackedOffset::Forgotten(offset))
                    );
                    prop_assert_eq!(
                        (window.position(), window.len(), window.unresolved()),
                        (position, len, unresolved),
                        "a late outcome changed the window"
                    );
                }
            }
            check(&window, &model);
            // Between moves back, the position only moves forward.
            prop_assert!(window.position() >= last_position);
            last_position = window.position();
        }
        // Every record of the current log resolved, in a scrambled order: the position reaches
        // the end, whatever obsolete outcomes are still to come.
        let mut rest: Vec<(i64, Generation)> = model
            .records
            .iter()
            .filter(|(_, (_, resolved))| !resolved)
            .map(|(&offset, &(generation, _))| (offset, generation))
            .collect();
        rest.reverse();
        let half = rest.len() / 2;
        rest.rotate_left(half);
        for (offset, generation) in rest {
            window.resolve(offset, generation).unwrap();
            model.records.insert(offset, (generation, true));
            check(&window, &model);
        }
        if let Some(highest) = model.highest {
            prop_assert_eq!(window.position(), Some(highest + 1));
            prop_assert!(window.is_empty());
        }
        for (offset, generation) in model.obsolete {
            prop_assert_eq!(
                window.resolve(offset, generation),
                Err(UntrackedOffset::Forgotten(offset))
            );
        }
    }
}
