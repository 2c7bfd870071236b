//! Property tests of the offset window against the simplest possible model: a map of every
//! offset ever tracked to whether it is resolved.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{OffsetWindow, TrackResult};

#[derive(Debug, Clone)]
enum Op {
    /// Fetch the next record, `gap` offsets after the previous one (compaction, markers).
    Fetch { gap: u8 },
    /// Deliver again an offset fetched before (a redelivery); `pick` selects which.
    Redeliver { pick: usize },
    /// Resolve an in-flight offset; `pick` selects which.
    Resolve { pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4).prop_map(|gap| Op::Fetch { gap }),
        1 => any::<usize>().prop_map(|pick| Op::Redeliver { pick }),
        4 => any::<usize>().prop_map(|pick| Op::Resolve { pick }),
    ]
}

/// The model's commit position: one past the longest resolved prefix of all tracked offsets.
fn model_position(model: &BTreeMap<i64, bool>) -> Option<i64> {
    model
        .iter()
        .take_while(|&(_, &resolved)| resolved)
        .last()
        .map(|(&offset, _)| offset + 1)
}

fn check_invariants(window: &OffsetWindow, model: &BTreeMap<i64, bool>) {
    let position = window.position();
    assert_eq!(position, model_position(model));
    if let Some(position) = position {
        // The commit never passes an unresolved offset.
        assert!(
            model.range(..position).all(|(_, &resolved)| resolved),
            "position {position} passes an unresolved offset: {model:?}"
        );
    }
    let unresolved = model.values().filter(|&&resolved| !resolved).count();
    assert_eq!(window.unresolved(), unresolved);
    let held = match position {
        Some(position) => model.range(position..).count(),
        None => model.len(),
    };
    assert_eq!(window.len(), held);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_position_is_the_resolved_prefix_and_reaches_the_end(
        start in 0i64..1_000_000,
        ops in prop::collection::vec(op(), 0..300),
    ) {
        let mut window = OffsetWindow::new();
        let mut model: BTreeMap<i64, bool> = BTreeMap::new();
        let mut next = start;
        for op in ops {
            match op {
                Op::Fetch { gap } => {
                    let offset = next + i64::from(gap);
                    next = offset + 1;
                    prop_assert_eq!(window.track(offset), TrackResult::Tracked);
                    model.insert(offset, false);
                }
                Op::Redeliver { pick } => {
                    if model.is_empty() {
                        continue;
                    }
                    let (&offset, _) = model.iter().nth(pick % model.len()).unwrap();
                    let below = window.position().is_some_and(|p| offset < p);
                    let expected = if below { TrackResult::BelowPosition } else { TrackResult::AlreadyTracked };
                    prop_assert_eq!(window.track(offset), expected);
                }
                Op::Resolve { pick } => {
                    let in_flight: Vec<i64> = model
                        .iter()
                        .filter(|&(_, &resolved)| !resolved)
                        .map(|(&offset, _)| offset)
                        .collect();
                    if in_flight.is_empty() {
                        continue;
                    }
                    let offset = in_flight[pick % in_flight.len()];
                    let before = window.len();
                    let released = window.resolve(offset).unwrap();
                    prop_assert_eq!(before - released, window.len());
                    model.insert(offset, true);
                }
            }
            check_invariants(&window, &model);
        }
        // Resolve whatever is left, in a scrambled order: the position must reach the end.
        let mut rest: Vec<i64> = model.iter().filter(|(_, r)| !**r).map(|(&o, _)| o).collect();
        rest.reverse();
        let half = rest.len() / 2;
        rest.rotate_left(half);
        for offset in rest {
            window.resolve(offset).unwrap();
            model.insert(offset, true);
            check_invariants(&window, &model);
        }
        if let Some((&last, _)) = model.iter().next_back() {
            prop_assert_eq!(window.position(), Some(last + 1));
            prop_assert!(window.is_empty());
        }
    }

    #[test]
    fn late_offsets_above_the_position_are_held_in_order(
        offsets in prop::collection::btree_set(0i64..500, 1..60),
        order_seed in any::<u64>(),
    ) {
        // Track a set of offsets in a scrambled order (not Kafka's, but the window must not
        // care), resolve them in another scrambled order: the position never passes a hole.
        let mut shuffled: Vec<i64> = offsets.iter().copied().collect();
        let n = shuffled.len();
        for i in 0..n {
            let j = (order_seed.wrapping_mul(6364136223846793005).wrapping_add(i as u64) as usize) % n;
            shuffled.swap(i, j);
        }
        let mut window = OffsetWindow::new();
        let mut model = BTreeMap::new();
        for &offset in &shuffled {
            prop_assert_eq!(window.track(offset), TrackResult::Tracked);
            model.insert(offset, false);
            check_invariants(&window, &model);
        }
        shuffled.reverse();
        for offset in shuffled {
            window.resolve(offset).unwrap();
            model.insert(offset, true);
            check_invariants(&window, &model);
        }
        prop_assert_eq!(window.position(), Some(*offsets.iter().next_back().unwrap() + 1));
    }
}
