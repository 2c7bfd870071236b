//! Reading the Kafka requests a client sends, off the wire: what a test needs to check every
//! OffsetCommit a broker received, rather than what the client logged about them. The
//! [`fault proxy`](crate::fault_proxy) hands each connection's upstream bytes to a
//! [`RequestFrames`], which cuts them into requests; [`OffsetCommit::parse`] reads a commit
//! request of any version librdkafka sends (0 to 9; flexible from 8).

/// Kafka's API key of OffsetCommit.
pub const OFFSET_COMMIT: i16 = 8;
/// The first OffsetCommit version with flexible (compact, tagged) encoding.
const OFFSET_COMMIT_FIRST_FLEXIBLE: i16 = 8;

/// Cuts one connection's upstream bytes into whole requests (each a 4-byte big-endian size,
/// then that many bytes).
#[derive(Debug, Default)]
pub struct RequestFrames {
    pending: Vec<u8>,
}

impl RequestFrames {
    /// Takes the next bytes of the connection; returns the requests they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        self.pending.extend_from_slice(bytes);
        let mut frames = Vec::new();
        while let Some(size) = self.pending.get(..4) {
            let size = u32::from_be_bytes(size.try_into().expect("four bytes")) as usize;
            if self.pending.len() < 4 + size {
                break;
            }
            frames.push(self.pending[4..4 + size].to_vec());
            self.pending.drain(..4 + size);
        }
        frames
    }
}

/// A request's header: which API, which version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<String>,
}

/// One OffsetCommit request, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommit {
    pub version: i16,
    pub group_id: String,
    /// The generation (classic protocol) or the member epoch (KIP-848); -1 before v1.
    pub generation: i32,
    pub member_id: String,
    pub partitions: Vec<CommittedPartition>,
}

/// One partition's position in an [`OffsetCommit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedPartition {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub metadata: Option<String>,
}

/// A request that could not be read: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed request at byte {at}: {what}")]
pub struct WireError {
    pub at: usize,
    pub what: &'static str,
}

impl OffsetCommit {
    /// Reads `frame` (one request, without its size) if it is an OffsetCommit; `Ok(None)` for
    /// any other request.
    pub fn parse(frame: &[u8]) -> Result<Option<OffsetCommit>, WireError> {
        let mut reader = Reader {
            bytes: frame,
            at: 0,
        };
        let header = reader.header()?;
        if header.api_key != OFFSET_COMMIT {
            return Ok(None);
        }
        let version = header.api_version;
        let flexible = version >= OFFSET_COMMIT_FIRST_FLEXIBLE;
        if flexible {
            reader.tagged_fields()?;
        }
        let group_id = reader.string(flexible)?.unwrap_or_default();
        let (generation, member_id) = if version >= 1 {
            let generation = reader.i32()?;
            let member = reader.string(flexible)?.unwrap_or_default();
            (generation, member)
        } else {
            (-1, String::new())
        };
        if version >= 7 {
            let _group_instance_id = reader.string(flexible)?;
        }
        if (2..=4).contains(&version) {
            let _retention_time_ms = reader.i64()?;
        }
        let mut partitions = Vec::new();
        for _ in 0..reader.array_len(flexible)? {
            let topic = reader.string(flexible)?.unwrap_or_default();
            for _ in 0..reader.array_len(flexible)? {
                let partition = reader.i32()?;
                let offset = reader.i64()?;
                if version >= 6 {
                    let _leader_epoch = reader.i32()?;
                }
                if version == 1 {
                    let _timestamp = reader.i64()?;
                }
                let metadata = reader.string(flexible)?;
                if flexible {
                    reader.tagged_fields()?;
                }
                partitions.push(CommittedPartition {
                    topic: topic.clone(),
                    partition,
                    offset,
                    metadata,
                });
            }
            if flexible {
                reader.tagged_fields()?;
            }
        }
        if flexible {
            reader.tagged_fields()?;
        }
        if reader.at != frame.len() {
            return Err(WireError {
                at: reader.at,
                what: "bytes after the request's last field",
            });
        }
        Ok(Some(OffsetCommit {
            version,
            group_id,
            generation,
            member_id,
            partitions,
        }))
    }
}

/// Writes requests as the protocol lays them out.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn i16(&mut self, v: i16) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn varint(&mut self, mut v: u64) -> &mut Self {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
        self
    }
    fn string(&mut self, s: Option<&str>, compact: bool) -> &mut Self {
        match (s, compact) {
            (None, true) => self.varint(0),
            (None, false) => self.i16(-1),
            (Some(s), true) => {
                self.varint(s.len() as u64 + 1);
                self.0.extend_from_slice(s.as_bytes());
                self
            }
            (Some(s), false) => {
                self.i16(s.len() as i16);
                self.0.extend_from_slice(s.as_bytes());
                self
            }
        }
    }
    fn array(&mut self, len: usize, compact: bool) -> &mut Self {
        if compact {
            self.varint(len as u64 + 1)
        } else {
            self.i32(len as i32)
        }
    }
    fn no_tags(&mut self, flexible: bool) -> &mut Self {
        if flexible {
            self.varint(0);
        }
        self
    }
}

impl OffsetCommit {
    /// This commit as a request of its `version`, framed (its size first), with
    /// `correlation_id`: what a client of the group would send. For tests that play another
    /// member, such as one a broker assigned the same partition to.
    pub fn encode(&self, correlation_id: i32) -> Vec<u8> {
        let version = self.version;
        let flexible = version >= OFFSET_COMMIT_FIRST_FLEXIBLE;
        let mut w = Writer::default();
        w.i16(OFFSET_COMMIT)
            .i16(version)
            .i32(correlation_id)
            .string(Some("history-devkit"), false)
            .no_tags(flexible);
        w.string(Some(&self.group_id), flexible);
        if version >= 1 {
            w.i32(self.generation)
                .string(Some(&self.member_id), flexible);
        }
        if version >= 7 {
            w.string(None, flexible);
        }
        if (2..=4).contains(&version) {
            w.i64(-1);
        }
        let mut topics: Vec<(&str, Vec<&CommittedPartition>)> = Vec::new();
        for position in &self.partitions {
            match topics
                .iter_mut()
                .find(|(topic, _)| *topic == position.topic)
            {
                Some((_, partitions)) => partitions.push(position),
                None => topics.push((&position.topic, vec![position])),
            }
        }
        w.array(topics.len(), flexible);
        for (topic, partitions) in topics {
            w.string(Some(topic), flexible)
                .array(partitions.len(), flexible);
            for position in partitions {
                w.i32(position.partition).i64(position.offset);
                if version >= 6 {
                    w.i32(-1);
                }
                if version == 1 {
                    w.i64(-1);
                }
                w.string(position.metadata.as_deref(), flexible)
                    .no_tags(flexible);
            }
            w.no_tags(flexible);
        }
        w.no_tags(flexible);
        let mut framed = (w.0.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(&w.0);
        framed
    }
}

/// The error code of each partition in an OffsetCommit response of `version` (one framed
/// response, without its size): `(topic, partition, code)`, 0 for a commit applied.
pub fn offset_commit_response(
    response: &[u8],
    version: i16,
) -> Result<Vec<(String, i32, i16)>, WireError> {
    let flexible = version >= OFFSET_COMMIT_FIRST_FLEXIBLE;
    let mut reader = Reader {
        bytes: response,
        at: 0,
    };
    let _correlation_id = reader.i32()?;
    if flexible {
        reader.tagged_fields()?;
    }
    if version >= 3 {
        let _throttle_ms = reader.i32()?;
    }
    let mut codes = Vec::new();
    for _ in 0..reader.array_len(flexible)? {
        let topic = reader.string(flexible)?.unwrap_or_default();
        for _ in 0..reader.array_len(flexible)? {
            let partition = reader.i32()?;
            let code = reader.i16()?;
            if flexible {
                reader.tagged_fields()?;
            }
            codes.push((topic.clone(), partition, code));
        }
        if flexible {
            reader.tagged_fields()?;
        }
    }
    Ok(codes)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, count: usize, what: &'static str) -> Result<&[u8], WireError> {
        let end = self
            .at
            .checked_add(count)
            .filter(|end| *end <= self.bytes.len())
            .ok_or(WireError { at: self.at, what })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn i16(&mut self) -> Result<i16, WireError> {
        Ok(i16::from_be_bytes(
            self.take(2, "a truncated int16")?.try_into().unwrap(),
        ))
    }

    fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_be_bytes(
            self.take(4, "a truncated int32")?.try_into().unwrap(),
        ))
    }

    fn i64(&mut self) -> Result<i64, WireError> {
        Ok(i64::from_be_bytes(
            self.take(8, "a truncated int64")?.try_into().unwrap(),
        ))
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1, "a truncated varint")?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError {
            at: self.at,
            what: "a varint longer than ten bytes",
        })
    }

    /// A string, nullable: INT16 size (-1 null) or, flexible, a compact one (size + 1 as an
    /// unsigned varint, 0 null).
    fn string(&mut self, compact: bool) -> Result<Option<String>, WireError> {
        let size = if compact {
            match self.varint()? {
                0 => return Ok(None),
                size => (size - 1) as usize,
            }
        } else {
            match self.i16()? {
                -1 => return Ok(None),
                size if size < 0 => {
                    return Err(WireError {
                        at: self.at,
                        what: "a negative string size",
                    });
                }
                size => size as usize,
            }
        };
        let at = self.at;
        let bytes = self.take(size, "a truncated string")?;
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| WireError {
                at,
                what: "a string that is not UTF-8",
            })
    }

    /// An array's length: INT32 or, flexible, a compact one (length + 1; 0 is null, read as
    /// empty).
    fn array_len(&mut self, compact: bool) -> Result<usize, WireError> {
        let len = if compact {
            self.varint()?.saturating_sub(1)
        } else {
            self.i32()?.max(0) as u64
        };
        // Each element takes a byte at least: a larger length is a malformed frame, not an
        // allocation.
        if len > (self.bytes.len() - self.at) as u64 {
            return Err(WireError {
                at: self.at,
                what: "an array longer than the request",
            });
        }
        Ok(len as usize)
    }

    fn tagged_fields(&mut self) -> Result<(), WireError> {
        for _ in 0..self.varint()? {
            let _tag = self.varint()?;
            let size = self.varint()? as usize;
            self.take(size, "a truncated tagged field")?;
        }
        Ok(())
    }

    /// The request header: v1 (client id as an INT16 string) is what every version reads
    /// first; a flexible request's header v2 adds tagged fields, read by the caller, who knows
    /// the version.
    fn header(&mut self) -> Result<RequestHeader, WireError> {
        Ok(RequestHeader {
            api_key: self.i16()?,
            api_version: self.i16()?,
            correlation_id: self.i32()?,
            client_id: self.string(false)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OffsetCommit of `version` with two topics, the second of two partitions.
    fn offset_commit(version: i16) -> Vec<u8> {
        let flexible = version >= 8;
        let mut w = Writer::default();
        w.i16(OFFSET_COMMIT)
            .i16(version)
            .i32(77)
            .string(Some("rdkafka"), false);
        if flexible {
            // A tagged field in the header, to be skipped.
            w.varint(1).varint(0).varint(3);
            w.0.extend_from_slice(b"abc");
        }
        w.string(Some("group-a"), flexible);
        if version >= 1 {
            w.i32(5).string(Some("member-1"), flexible);
        }
        if version >= 7 {
            w.string(None, flexible);
        }
        if (2..=4).contains(&version) {
            w.i64(-1);
        }
        w.array(2, flexible);
        for (topic, partitions) in [("t1", vec![(0, 10)]), ("t2", vec![(3, 7), (4, 1 << 40)])] {
            w.string(Some(topic), flexible)
                .array(partitions.len(), flexible);
            for (partition, offset) in partitions {
                w.i32(partition).i64(offset);
                if version >= 6 {
                    w.i32(-1);
                }
                if version == 1 {
                    w.i64(0);
                }
                w.string(if offset == 7 { None } else { Some("m") }, flexible);
                w.no_tags(flexible);
            }
            w.no_tags(flexible);
        }
        w.no_tags(flexible);
        w.0
    }

    #[test]
    fn every_version_of_an_offset_commit_is_read() {
        for version in 0..=9 {
            let commit = OffsetCommit::parse(&offset_commit(version))
                .unwrap_or_else(|err| panic!("v{version}: {err}"))
                .unwrap();
            assert_eq!(commit.version, version);
            assert_eq!(commit.group_id, "group-a");
            let positions: Vec<_> = commit
                .partitions
                .iter()
                .map(|p| {
                    (
                        p.topic.as_str(),
                        p.partition,
                        p.offset,
                        p.metadata.as_deref(),
                    )
                })
                .collect();
            assert_eq!(
                positions,
                vec![
                    ("t1", 0, 10, Some("m")),
                    ("t2", 3, 7, None),
                    ("t2", 4, 1 << 40, Some("m"))
                ],
                "v{version}"
            );
            if version >= 1 {
                assert_eq!(
                    (commit.generation, commit.member_id.as_str()),
                    (5, "member-1")
                );
            }
        }
    }

    #[test]
    fn other_requests_are_not_commits_and_a_truncated_commit_is_an_error() {
        let mut fetch = Writer::default();
        fetch.i16(1).i16(12).i32(1).string(Some("c"), false);
        assert_eq!(OffsetCommit::parse(&fetch.0), Ok(None));
        let whole = offset_commit(9);
        for cut in [3, 12, whole.len() / 2, whole.len() - 1] {
            assert!(OffsetCommit::parse(&whole[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = whole.clone();
        longer.push(0);
        assert!(OffsetCommit::parse(&longer).is_err());
    }

    #[test]
    fn an_encoded_commit_reads_back_the_same_at_every_version() {
        for version in 0..=9 {
            let commit = OffsetCommit::parse(&offset_commit(version))
                .unwrap()
                .unwrap();
            let framed = commit.encode(5);
            let frames = RequestFrames::default().push(&framed);
            assert_eq!(frames.len(), 1);
            let mut again = OffsetCommit::parse(&frames[0]).unwrap().unwrap();
            if version == 0 {
                again.generation = commit.generation;
            }
            assert_eq!(again, commit, "v{version}");
        }
    }

    #[test]
    fn frames_are_cut_wherever_the_bytes_split() {
        let requests = [offset_commit(8), offset_commit(2), vec![0; 3]];
        let mut wire = Vec::new();
        for request in &requests {
            wire.extend_from_slice(&(request.len() as u32).to_be_bytes());
            wire.extend_from_slice(request);
        }
        for chunk in [1, 2, 5, 64, wire.len()] {
            let mut frames = RequestFrames::default();
            let cut: Vec<Vec<u8>> = wire.chunks(chunk).flat_map(|c| frames.push(c)).collect();
            assert_eq!(cut, requests, "chunks of {chunk}");
        }
    }
}
