//! Record batches written straight onto the wire: a Kafka Produce request (version 3) carrying
//! one v2 RecordBatch. Either one no client can read — attributes naming a compression codec
//! and a body that is not data of that codec (a corrupt batch, or a codec id from a later
//! Kafka) — or a transaction's marker, the control record a transaction coordinator writes
//! when a transactional producer commits or aborts (the embedded broker has no transaction
//! coordinator that writes them). The embedded broker stores batches as they come, so a
//! consumer meets them as it would on a real cluster.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Kafka's Produce API key, and the version used (the first with v2 record batches).
const PRODUCE: i16 = 0;
const PRODUCE_VERSION: i16 = 3;

/// CRC-32C (Castagnoli), as RecordBatch v2 checksums its body.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A v2 RecordBatch claiming `records` records compressed with `codec` (the attribute's low
/// three bits: 1 gzip, 2 snappy, 3 lz4, 4 zstd; 5–7 unassigned), its body `body`.
pub fn record_batch(codec: u8, records: i32, body: &[u8]) -> Vec<u8> {
    batch(i16::from(codec & 0x07), records, (-1, -1), body)
}

/// Attributes of a batch written by a transactional producer, and of a control batch.
const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;

/// The marker that ends a transaction of producer `producer` (id, epoch): a control batch of
/// one record whose key says COMMIT (or ABORT) and whose value names the coordinator's epoch.
pub fn transaction_marker(producer: (i64, i16), commit: bool) -> Vec<u8> {
    let key: [u8; 4] = [0, 0, 0, u8::from(commit)]; // version 0, type 0 abort / 1 commit
    let value: [u8; 6] = [0, 0, 0, 0, 0, 0]; // version 0, coordinator epoch 0
    let mut record = vec![
        0, // attributes
        0, // timestampDelta (zigzag varint)
        0, // offsetDelta
        zigzag(key.len()),
    ];
    record.extend_from_slice(&key);
    record.push(zigzag(value.len()));
    record.extend_from_slice(&value);
    record.push(0); // no headers
    let mut body = vec![zigzag(record.len())];
    body.extend_from_slice(&record);
    batch(TRANSACTIONAL | CONTROL, 1, producer, &body)
}

/// A small length as a zigzag varint of one byte.
fn zigzag(length: usize) -> u8 {
    assert!(length < 64, "one byte of varint");
    (length as u8) << 1
}

fn batch(
    attributes: i16,
    records: i32,
    (producer_id, producer_epoch): (i64, i16),
    body: &[u8],
) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64);
    // Everything the checksum covers: from the attributes to the end.
    let mut checked = Vec::new();
    checked.extend_from_slice(&attributes.to_be_bytes());
    checked.extend_from_slice(&(records - 1).to_be_bytes()); // lastOffsetDelta
    checked.extend_from_slice(&now.to_be_bytes()); // baseTimestamp
    checked.extend_from_slice(&now.to_be_bytes()); // maxTimestamp
    checked.extend_from_slice(&producer_id.to_be_bytes());
    checked.extend_from_slice(&producer_epoch.to_be_bytes());
    checked.extend_from_slice(&(-1i32).to_be_bytes()); // baseSequence
    checked.extend_from_slice(&records.to_be_bytes());
    checked.extend_from_slice(body);
    let mut after_length = Vec::new();
    after_length.extend_from_slice(&(-1i32).to_be_bytes()); // partitionLeaderEpoch
    after_length.push(2); // magic
    after_length.extend_from_slice(&crc32c(&checked).to_be_bytes());
    after_length.extend_from_slice(&checked);
    let mut batch = Vec::new();
    batch.extend_from_slice(&0i64.to_be_bytes()); // baseOffset: the broker assigns it
    batch.extend_from_slice(&(after_length.len() as i32).to_be_bytes());
    batch.extend_from_slice(&after_length);
    batch
}

fn string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as i16).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// Sends `batch` to `partition` of `topic` on `broker` (its leader) and returns the offset the
/// broker gave its first record.
pub fn produce(broker: &str, topic: &str, partition: i32, batch: &[u8]) -> Result<i64, String> {
    let mut request = Vec::new();
    request.extend_from_slice(&PRODUCE.to_be_bytes());
    request.extend_from_slice(&PRODUCE_VERSION.to_be_bytes());
    request.extend_from_slice(&1i32.to_be_bytes()); // correlation id
    string(&mut request, "history-devkit-raw");
    request.extend_from_slice(&(-1i16).to_be_bytes()); // no transactional id
    request.extend_from_slice(&(-1i16).to_be_bytes()); // acks = all
    request.extend_from_slice(&10_000i32.to_be_bytes()); // timeout
    request.extend_from_slice(&1i32.to_be_bytes()); // one topic
    string(&mut request, topic);
    request.extend_from_slice(&1i32.to_be_bytes()); // one partition
    request.extend_from_slice(&partition.to_be_bytes());
    request.extend_from_slice(&(batch.len() as i32).to_be_bytes());
    request.extend_from_slice(batch);

    let mut stream = TcpStream::connect(broker).map_err(|err| format!("{broker}: {err}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|err| err.to_string())?;
    stream
        .write_all(&(request.len() as i32).to_be_bytes())
        .and_then(|()| stream.write_all(&request))
        .map_err(|err| format!("sending the Produce request: {err}"))?;
    let mut size = [0u8; 4];
    stream
        .read_exact(&mut size)
        .map_err(|err| format!("reading the Produce response: {err}"))?;
    let mut response = vec![0u8; i32::from_be_bytes(size) as usize];
    stream
        .read_exact(&mut response)
        .map_err(|err| format!("reading the Produce response: {err}"))?;
    // correlation id, #topics, topic, #partitions, partition, error code, base offset, ...
    let mut at = 4 + 4;
    let name_len = i16::from_be_bytes([response[at], response[at + 1]]) as usize;
    at += 2 + name_len + 4 + 4;
    let error = i16::from_be_bytes([response[at], response[at + 1]]);
    at += 2;
    let offset = i64::from_be_bytes(response[at..at + 8].try_into().expect("8 bytes"));
    if error != 0 {
        return Err(format!("the broker refused the batch: error code {error}"));
    }
    Ok(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_crc32c() {
        // The check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn a_batch_carries_its_length_magic_and_codec() {
        let batch = record_batch(4, 5, b"not zstd");
        let length = i32::from_be_bytes(batch[8..12].try_into().unwrap()) as usize;
        assert_eq!(length, batch.len() - 12);
        assert_eq!(batch[16], 2, "magic");
        assert_eq!(i16::from_be_bytes([batch[21], batch[22]]), 4, "attributes");
    }
}
