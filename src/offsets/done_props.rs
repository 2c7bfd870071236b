//! Property tests of the done-offsets list in a commit's metadata: what reads back is exactly
//! what was written above the position when it fits, a prefix of it when it does not, never
//! longer than the bound, and nothing a decoder is given makes it panic or list an offset at
//! or below the committed position.

use proptest::prelude::*;

use super::done::{DoneOffsets, PREFIX, Run};

/// Runs from (gap before, length) pairs, starting anywhere.
fn done_offsets() -> impl Strategy<Value = DoneOffsets> {
    (
        0i64..1_000_000,
        prop::collection::vec((0i64..5_000, 1i64..20_000), 0..300),
    )
        .prop_map(|(start, shape)| {
            let mut next = start;
            DoneOffsets::from_runs(shape.into_iter().map(|(gap, length)| {
                let first = next + gap;
                next = first + length;
                Run {
                    first,
                    last: first + length - 1,
                }
            }))
        })
}

proptest! {
    #[test]
    fn what_fits_reads_back_exactly(done in done_offsets(), position in 0i64..2_000_000) {
        let encoded = done.encode(position, 1 << 20);
        let above = done.above(position);
        prop_assert_eq!(encoded.listed, above.count());
        prop_assert_eq!(encoded.cut, 0);
        let read = DoneOffsets::decode(position, encoded.text.as_bytes()).unwrap();
        if above.is_empty() {
            prop_assert_eq!(read, None);
        } else {
            prop_assert_eq!(read, Some(above));
        }
    }

    #[test]
    fn what_does_not_fit_is_cut_to_a_prefix_within_the_bound(
        done in done_offsets(),
        position in 0i64..2_000_000,
        max_bytes in 0usize..400,
    ) {
        let encoded = done.encode(position, max_bytes);
        prop_assert!(encoded.text.len() <= max_bytes);
        let above = done.above(position);
        prop_assert_eq!(encoded.listed + encoded.cut, above.count());
        match DoneOffsets::decode(position, encoded.text.as_bytes()).unwrap() {
            None => prop_assert_eq!(encoded.listed, 0),
            Some(read) => {
                let kept = read.runs().len();
                prop_assert_eq!(read.runs(), &above.runs()[..kept]);
                prop_assert_eq!(read.count(), encoded.listed);
            }
        }
    }

    #[test]
    fn any_metadata_is_read_or_refused_without_listing_the_position_or_below(
        body in prop::collection::vec(any::<u8>(), 0..64),
        prefixed in any::<bool>(),
        committed in 0i64..1_000,
    ) {
        let mut metadata = if prefixed { PREFIX.as_bytes().to_vec() } else { Vec::new() };
        metadata.extend(body);
        if let Ok(Some(read)) = DoneOffsets::decode(committed, &metadata) {
            prop_assert!(read.runs().iter().all(|run| run.first > committed && run.first <= run.last));
        }
    }

    #[test]
    fn a_changed_character_is_refused(
        done in done_offsets(),
        position in 0i64..2_000_000,
        at in any::<prop::sample::Index>(),
        to in prop::sample::select(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".to_vec()),
    ) {
        let text = done.encode(position, 4096).text;
        prop_assume!(!text.is_empty());
        let mut damaged = text.clone().into_bytes();
        let index = PREFIX.len() + at.index(damaged.len() - PREFIX.len());
        prop_assume!(damaged[index] != to);
        damaged[index] = to;
        // One changed character changes at most six bits of the payload, which CRC-32 always
        // detects; only the last character's unused low bits may change nothing at all.
        match DoneOffsets::decode(position, &damaged) {
            Err(_) => {}
            Ok(read) => prop_assert_eq!(read, DoneOffsets::decode(position, text.as_bytes()).unwrap()),
        }
    }
}
