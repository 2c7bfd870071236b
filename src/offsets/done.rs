//! The offsets above a commit's position that are already done, carried in the commit's
//! metadata so that the partition's next owner skips them instead of writing them again.
//!
//! Kafka's committed position says only "everything before this offset is done". When one
//! record holds a partition's position back (a slow write, an event the database rejects),
//! everything resolved after it would be read and written again by the next owner — after a
//! revoke, a crash, a rolling restart. So each commit lists, in its metadata, the runs of
//! offsets above its position that are resolved, and a new owner skips the records it finds
//! listed.
//!
//! The encoding is text (the metadata is a string to most Kafka tools): `hs1:` and the URL-safe
//! base64 of LEB128 varints — the position the list belongs to, then for each run the distance
//! from the end of the one before and its length — and a CRC-32 of them. The position is in it
//! because the list means something only relative to the offset committed with it: a tool that
//! moves a group's offset and keeps the metadata would otherwise make it list the wrong records.
//! A run may cover offsets the consumer never saw (compacted away, transaction markers): runs
//! are built only from records delivered next to each other, so nothing lies between them that
//! a consumer is ever handed.
//!
//! A broker refuses metadata longer than its `offset.metadata.max.bytes` (4 KiB by default), so
//! a list is encoded lowest runs first and cut where it would not fit: it may list less than is
//! done, never something that is not. Anything the decoder does not recognise — another
//! version, another tool's metadata, a damaged text, another position — is refused, and the new
//! owner processes everything above the position.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What a list written by this version starts with.
pub(crate) const PREFIX: &str = "hs1:";

/// A run of done offsets, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Run {
    pub first: i64,
    pub last: i64,
}

impl Run {
    /// Offsets in the run (never 0: both ends are in it).
    pub fn offsets(&self) -> u64 {
        (self.last - self.first) as u64 + 1
    }
}

/// Offsets known to be done, as sorted runs that neither overlap nor touch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoneOffsets {
    runs: Vec<Run>,
}

/// Metadata that is not a list of this version for this position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("not written by this service's version 1 (it starts {0:?})")]
    Foreign(String),
    #[error("damaged: {0}")]
    Damaged(&'static str),
    #[error("it belongs to position {listed}, not to the committed {committed}")]
    OtherPosition { listed: i64, committed: i64 },
}

/// A list encoded for a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// The metadata: empty when nothing is listed.
    pub text: String,
    /// Offsets listed.
    pub listed: u64,
    /// Offsets done but not listed: the bound cut them.
    pub cut: u64,
}

impl DoneOffsets {
    /// The list of `runs`, in any order, overlapping or not.
    pub fn from_runs(runs: impl IntoIterator<Item = Run>) -> Self {
        let mut runs: Vec<Run> = runs
            .into_iter()
            .filter(|run| run.first <= run.last)
            .collect();
        runs.sort_unstable();
        let mut merged: Vec<Run> = Vec::with_capacity(runs.len());
        for run in runs {
            match merged.last_mut() {
                Some(last) if run.first <= last.last.saturating_add(1) => {
                    last.last = last.last.max(run.last);
                }
                _ => merged.push(run),
            }
        }
        DoneOffsets { runs: merged }
    }

    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Offsets listed.
    pub fn count(&self) -> u64 {
        self.runs.iter().map(Run::offsets).sum()
    }

    /// Offsets listed above `offset`.
    pub fn count_above(&self, offset: i64) -> u64 {
        let index = self.runs.partition_point(|run| run.last <= offset);
        self.runs[index..]
            .iter()
            .map(|run| (run.last - run.first.max(offset.saturating_add(1))) as u64 + 1)
            .sum()
    }

    pub fn contains(&self, offset: i64) -> bool {
        let index = self.runs.partition_point(|run| run.last < offset);
        self.runs.get(index).is_some_and(|run| run.first <= offset)
    }

    /// The part of the list above `offset`.
    pub fn above(&self, offset: i64) -> DoneOffsets {
        let index = self.runs.partition_point(|run| run.last <= offset);
        let mut runs = self.runs[index..].to_vec();
        if let Some(first) = runs.first_mut() {
            first.first = first.first.max(offset.saturating_add(1));
        }
        DoneOffsets { runs }
    }

    /// The list's offsets above `position`, as metadata for a commit of `position`, in at most
    /// `max_bytes` bytes: the lowest runs that fit.
    pub fn encode(&self, position: i64, max_bytes: usize) -> Encoded {
        let runs = self.above(position).runs;
        let total: u64 = runs.iter().map(Run::offsets).sum();
        let empty = Encoded {
            text: String::new(),
            listed: 0,
            cut: total,
        };
        if runs.is_empty() || position < 0 {
            return empty;
        }
        let mut payload = Vec::with_capacity(16 + runs.len() * 4);
        write_varint(&mut payload, position as u64);
        let header = payload.len();
        let mut kept = 0;
        let mut listed = 0;
        let mut end = position;
        for run in &runs {
            let before = payload.len();
            write_varint(&mut payload, (run.first - end - 1) as u64);
            write_varint(&mut payload, run.offsets() - 1);
            if text_len(payload.len() + CHECKSUM_BYTES) > max_bytes {
                payload.truncate(before);
                break;
            }
            kept += 1;
            listed += run.offsets();
            end = run.last + 1;
        }
        if kept == 0 {
            debug_assert_eq!(payload.len(), header);
            return empty;
        }
        let checksum = crc32fast::hash(&payload);
        payload.extend_from_slice(&checksum.to_be_bytes());
        let mut text = String::with_capacity(text_len(payload.len()));
        text.push_str(PREFIX);
        URL_SAFE_NO_PAD.encode_string(&payload, &mut text);
        Encoded {
            text,
            listed,
            cut: total - listed,
        }
    }

    /// The list in the metadata of a commit of `committed`; `None` for no metadata.
    pub fn decode(committed: i64, metadata: &[u8]) -> Result<Option<DoneOffsets>, Unreadable> {
        if metadata.is_empty() {
            return Ok(None);
        }
        let Some(body) = metadata.strip_prefix(PREFIX.as_bytes()) else {
            let start = &metadata[..metadata.len().min(8)];
            return Err(Unreadable::Foreign(
                String::from_utf8_lossy(start).into_owned(),
            ));
        };
        let payload = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| Unreadable::Damaged("not base64"))?;
        if payload.len() < CHECKSUM_BYTES {
            return Err(Unreadable::Damaged("too short"));
        }
        let (payload, checksum) = payload.split_at(payload.len() - CHECKSUM_BYTES);
        if crc32fast::hash(payload).to_be_bytes() != checksum {
            return Err(Unreadable::Damaged("checksum mismatch"));
        }
        let mut input = payload;
        let listed = read_varint(&mut input)?;
        let listed = i64::try_from(listed).map_err(|_| Unreadable::Damaged("position"))?;
        if listed != committed {
            return Err(Unreadable::OtherPosition { listed, committed });
        }
        let mut runs = Vec::new();
        let mut end = committed;
        while !input.is_empty() {
            let gap = read_varint(&mut input)?;
            let length = read_varint(&mut input)?;
            let first = offset_after(end, gap, 1)?;
            let last = offset_after(first, length, 0)?;
            runs.push(Run { first, last });
            end = offset_after(last, 0, 1)?;
        }
        if runs.is_empty() {
            return Err(Unreadable::Damaged("no runs"));
        }
        Ok(Some(DoneOffsets { runs }))
    }
}

const CHECKSUM_BYTES: usize = 4;

/// The metadata's length for a payload of `payload` bytes.
fn text_len(payload: usize) -> usize {
    PREFIX.len() + (payload * 4).div_ceil(3)
}

/// `from + step + extra`, if it is an offset.
fn offset_after(from: i64, step: u64, extra: i64) -> Result<i64, Unreadable> {
    i64::try_from(step)
        .ok()
        .and_then(|step| from.checked_add(step))
        .and_then(|offset| offset.checked_add(extra))
        .ok_or(Unreadable::Damaged("offset out of range"))
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn read_varint(input: &mut &[u8]) -> Result<u64, Unreadable> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = input
            .split_first()
            .ok_or(Unreadable::Damaged("cut short"))?;
        *input = rest;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 {
            return Err(Unreadable::Damaged("number too large"));
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Unreadable::Damaged("number too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(pairs: &[(i64, i64)]) -> DoneOffsets {
        DoneOffsets::from_runs(pairs.iter().map(|&(first, last)| Run { first, last }))
    }

    #[test]
    fn a_list_reads_back_as_written() {
        let done = runs(&[(501, 14_670), (14_672, 14_672), (20_000, 20_009)]);
        let encoded = done.encode(500, 4096);
        assert!(encoded.text.starts_with(PREFIX), "{}", encoded.text);
        assert!(encoded.text.len() < 40, "{}", encoded.text);
        assert_eq!(encoded.listed, done.count());
        assert_eq!(encoded.cut, 0);
        assert_eq!(
            DoneOffsets::decode(500, encoded.text.as_bytes()),
            Ok(Some(done))
        );
    }

    #[test]
    fn only_what_is_above_the_position_is_listed() {
        let done = runs(&[(10, 20), (30, 31)]);
        let encoded = done.encode(15, 4096);
        assert_eq!(encoded.listed, 5 + 2);
        assert_eq!(
            DoneOffsets::decode(15, encoded.text.as_bytes()),
            Ok(Some(runs(&[(16, 20), (30, 31)])))
        );
        assert_eq!(done.encode(40, 4096).text, "");
    }

    #[test]
    fn a_list_that_does_not_fit_is_cut_to_its_lowest_runs() {
        let done = DoneOffsets::from_runs((0..2_000).map(|i| Run {
            first: 100 + i * 3,
            last: 100 + i * 3,
        }));
        let encoded = done.encode(99, 100);
        assert!(encoded.text.len() <= 100, "{}", encoded.text.len());
        let read = DoneOffsets::decode(99, encoded.text.as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(read.runs(), &done.runs()[..read.runs().len()]);
        assert_eq!(encoded.listed, read.count());
        assert_eq!(encoded.cut, 2_000 - read.count());
        assert_eq!(done.encode(99, 10).text, "", "not even one run fits");
    }

    #[test]
    fn metadata_of_another_kind_position_or_damaged_is_refused() {
        let encoded = runs(&[(11, 12)]).encode(10, 4096).text;
        assert_eq!(DoneOffsets::decode(10, b""), Ok(None));
        assert!(matches!(
            DoneOffsets::decode(10, b"{\"pc\":1}"),
            Err(Unreadable::Foreign(_))
        ));
        assert!(matches!(
            DoneOffsets::decode(10, b"hs2:AAAA"),
            Err(Unreadable::Foreign(_))
        ));
        assert_eq!(
            DoneOffsets::decode(11, encoded.as_bytes()),
            Err(Unreadable::OtherPosition {
                listed: 10,
                committed: 11
            })
        );
        let mut damaged = encoded.clone().into_bytes();
        let at = damaged.len() - 3;
        damaged[at] = if damaged[at] == b'A' { b'B' } else { b'A' };
        assert!(matches!(
            DoneOffsets::decode(10, &damaged),
            Err(Unreadable::Damaged(_))
        ));
        assert!(matches!(
            DoneOffsets::decode(10, &[0xff, 0xfe, 0x00]),
            Err(Unreadable::Foreign(_))
        ));
    }

    #[test]
    fn membership_and_clipping() {
        let done = runs(&[(5, 7), (8, 9), (12, 12)]);
        assert_eq!(done.runs().len(), 2, "touching runs merge");
        assert!(!done.contains(4));
        assert!(done.contains(5) && done.contains(9) && done.contains(12));
        assert!(!done.contains(10) && !done.contains(13));
        assert_eq!(done.above(6), runs(&[(7, 9), (12, 12)]));
        assert_eq!(done.above(12), DoneOffsets::default());
        assert_eq!(done.count_above(6), done.above(6).count());
        assert_eq!(done.count_above(4), 6);
        assert_eq!(done.count_above(12), 0);
    }
}
