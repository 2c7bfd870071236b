//! Whether the client's prefetch lets partitions take turns, and the sign that it no longer does.
//!
//! Partitions take turns when each has a queue of its own in the client
//! (`crate::kafka::split_queues`). A partition then holds its share of `queued.max.messages.kbytes`
//! when it is fetched, plus what the fetch brings: its part of the response on the wire, and
//! those batches decompressed. So each partition's part of a fetch (`max.partition.fetch.bytes`)
//! is half of what is left of its share of the client's half of the budget after its queue,
//! divided by one plus `kafka.max_compression_ratio` — the sizing of the fetch responses
//! (`super::budget::Split::fetch`), partition by partition. Except that a broker returns a
//! partition's first record batch whole, however large: a producer's batch of a megabyte
//! (librdkafka's `batch.size`, what any producer reaches writing a backlog) is held whole in
//! each partition's queue. With small batches (the Java producer's 16 KiB) the queues stay
//! within the client's half however many partitions there are, compressed or not; with larger
//! ones they do not, and the partitions are taken in fetch order again, from one queue, whose
//! limits hold whatever the batches.
//!
//! Half of what the share leaves beside the queue is for the fetches, the other half for the
//! batch whose last records are still being taken when the next arrives (a batch's memory goes
//! with its last record; measured: about two batches a partition). A queue found holding
//! (decompressed) more than its share of the queue and half the rest — with a quarter's margin
//! for the estimate of its bytes — shows a batch larger than the partition's turn allows.

use super::budget::Fetch;

/// The smallest part of a fetch response a partition may be given while partitions take turns:
/// a quarter of the Java producer's default batch (16 KiB). Below it, there are too many partitions for
/// the budget, whatever the producers. (A part smaller than a batch is not refused: a broker
/// returns the first partition's batch whole, and librdkafka grows a partition's fetch size
/// when it gets part of a batch.)
pub(crate) const MIN_PARTITION_FETCH_BYTES: usize = 4 << 10;

/// The client's prefetch shared among partitions that take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turns {
    /// `pipeline.max_in_flight_bytes`, of which the client has a part.
    pub budget_bytes: usize,
    pub partitions: usize,
    /// Each partition's share of the client's queue (`queued.max.messages.kbytes`), in bytes.
    pub queue_each: usize,
    /// Each partition's share of what the client may hold: its queue and its fetch responses.
    pub share_each: usize,
    /// The most a partition's batches decompress by (`kafka.max_compression_ratio`).
    pub ratio: usize,
}

impl Turns {
    /// The turns of `partitions` partitions sharing `client_bytes` (the client's part of
    /// `budget_bytes`), each with `queue_each` bytes of queue, their batches decompressing by
    /// `ratio` at most; or, when each partition's part of a fetch would be below
    /// [`MIN_PARTITION_FETCH_BYTES`], the budget they would need.
    pub fn plan(
        budget_bytes: usize,
        client_bytes: usize,
        queue_each: usize,
        partitions: usize,
        ratio: usize,
    ) -> Result<Turns, usize> {
        let partitions = partitions.max(1);
        let turns = Turns {
            budget_bytes,
            partitions,
            queue_each,
            share_each: client_bytes / partitions,
            ratio: ratio.max(1),
        };
        let part = turns.partition_fetch_bytes();
        if part < MIN_PARTITION_FETCH_BYTES {
            // Every part of the budget grows with it.
            let budget = budget_bytes as u128 * MIN_PARTITION_FETCH_BYTES as u128;
            return Err(budget.div_ceil(part.max(1) as u128) as usize);
        }
        Ok(turns)
    }

    /// What a partition's share leaves for its fetches, beside its queue.
    fn fetch_share(&self) -> usize {
        self.share_each.saturating_sub(self.queue_each)
    }

    /// `max.partition.fetch.bytes` while partitions take turns: half of what the partition's
    /// share leaves beside its queue (the other half for the batch still being taken when the
    /// next arrives), for the part on the wire and the same decompressed.
    pub fn partition_fetch_bytes(&self) -> usize {
        self.fetch_share() / 2 / (1 + self.ratio)
    }

    /// The fetch sizes of `fetch` with each partition's part of a response cut to its turn's
    /// share. A broker returns a partition's batches up to `max.partition.fetch.bytes` (its
    /// first whole, however large): at a megabyte each (librdkafka's default), 24 partitions'
    /// queues of small batches would hold 24 MiB, over the client's part of a 32 MiB budget.
    pub fn fetch(&self, fetch: Fetch) -> Fetch {
        Fetch {
            partition_bytes: fetch.partition_bytes.min(self.partition_fetch_bytes()),
            ..fetch
        }
    }

    /// The bytes (decompressed) a partition's queue may hold with batches that fit its turn:
    /// its share of the queue and half the rest (which a fetch part decompressed stays within),
    /// a quarter more for the estimate.
    pub fn most_queued(&self) -> usize {
        self.queue_each + self.fetch_share() / 8 * 5
    }

    /// The batch a queue of `queued_bytes` shows, when it is larger than the turns allow.
    pub fn outgrown_by(&self, queued_bytes: usize) -> Option<usize> {
        (queued_bytes > self.most_queued()).then(|| queued_bytes - self.queue_each)
    }

    /// How many backlogged partitions may fetch at once after the turns ended with a batch of
    /// `batch` bytes (the seats of [`super::rotation`]). A seated queue holds the batch being
    /// taken and the next, fetched when the queue runs low (a batch's memory goes with its last
    /// record), and librdkafka keeps an op and a message header beside each record's payload —
    /// about as much again as a small record — and a fetch response arriving holds a batch
    /// more, and a response holding several partitions' batches is freed with the last of
    /// them. So a seat is counted as its share of the queue and six such batches. Measured
    /// with batches of 687 KB of 190-byte records, the instance never pausing (a pause drops
    /// every queue and hid this): five seats (four batches each) held 18.6–19.2 MB of the
    /// client's heap and four (five batches) 16.2–17.3 MB, against a part of 16.8 MB — about
    /// 2.75 MB a seat above some 5.5 MB that do not go with the seats. The client's part of
    /// the budget holds this many — one at least, as one queue in fetch order would hold the
    /// batch.
    pub fn seats(&self, batch: usize) -> usize {
        ((self.share_each * self.partitions) / self.seat_bytes(batch).max(1)).max(1)
    }

    /// What a seat is counted to hold with batches of `batch` bytes ([`Self::seats`]).
    fn seat_bytes(&self, batch: usize) -> usize {
        self.queue_each + 6 * batch
    }

    /// The budget with which every partition's share holds two batches of `batch` bytes (the
    /// client's part grows with the budget).
    pub fn budget_for(&self, batch: usize) -> usize {
        let needed = self.partitions as u128 * 2 * batch as u128;
        let client = (self.share_each * self.partitions).max(1) as u128;
        (self.budget_bytes as u128 * needed).div_ceil(client) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults: a 32 MiB budget, whose client half is 16 MiB with 4 MiB of queue, and
    /// batches that decompress by 10 at most.
    const BUDGET: usize = 32 << 20;
    const CLIENT: usize = 16 << 20;
    const QUEUE: usize = 4 << 20;
    const RATIO: usize = 10;

    fn turns(partitions: usize) -> Result<Turns, usize> {
        Turns::plan(BUDGET, CLIENT, QUEUE / partitions, partitions, RATIO)
    }

    #[test]
    fn a_partitions_fetch_part_is_what_its_share_leaves_beside_its_queue_on_the_wire_and_decompressed()
     {
        let many = turns(24).unwrap();
        // Half of 16 MiB / 24 less 4 MiB / 24, for the wire and ten times that decompressed.
        assert_eq!(many.partition_fetch_bytes(), (CLIENT - QUEUE) / 24 / 2 / 11);
        // On the wire and decompressed, twice, with the queue: within the share.
        let held = many.queue_each + 2 * many.partition_fetch_bytes() * (1 + RATIO);
        assert!(held <= many.share_each, "{held}");
        assert!(turns(139).is_ok());
        // 140 partitions would be given less than 4 KiB each: a slightly larger budget would do.
        let Err(needed) = turns(140) else {
            panic!("140 partitions take turns in a 32 MiB budget");
        };
        assert!((BUDGET + 1..BUDGET * 21 / 20).contains(&needed), "{needed}");
        assert!(Turns::plan(needed, needed / 2, needed / 8 / 140, 140, RATIO).is_ok());
    }

    #[test]
    fn a_queue_holding_its_share_and_a_fetch_part_decompressed_is_within_its_turn() {
        let many = turns(24).unwrap();
        let full = many.queue_each + many.partition_fetch_bytes() * RATIO;
        assert_eq!(many.outgrown_by(full), None);
        assert_eq!(many.outgrown_by(many.most_queued()), None);
        // A megabyte batch fetched into a queue just below its share.
        let batch = 1_000_000;
        let queued = many.queue_each - 1 + batch;
        assert_eq!(many.outgrown_by(queued), Some(batch - 1));
        // Its budget: two such batches for each of the 24 partitions, in the client's half.
        let needed = many.budget_for(batch);
        let exact = 2 * 24 * 2 * batch;
        assert!(
            (exact..exact + exact / 100_000).contains(&needed),
            "{needed}"
        );
    }

    #[test]
    fn each_partitions_part_of_a_fetch_is_its_turns_share_at_most() {
        let budget = super::super::budget::Split::of(8000, BUDGET);
        let fetch = budget.fetch(1, RATIO);
        assert_eq!(fetch.partition_bytes, 1 << 20);
        let many = turns(24).unwrap();
        assert_eq!(
            many.fetch(fetch).partition_bytes,
            many.partition_fetch_bytes()
        );
        assert!(many.fetch(fetch).partition_bytes < fetch.partition_bytes);
        assert_eq!(many.fetch(fetch).max_bytes, fetch.max_bytes);
        // One partition: its share leaves more than librdkafka's default part.
        let one = Turns::plan(BUDGET, CLIENT, QUEUE, 1, 1).unwrap();
        assert_eq!(one.fetch(fetch), fetch);
    }

    #[test]
    fn the_seated_partitions_hold_their_batches_within_the_clients_part() {
        for partitions in [4, 24, 48, 96] {
            let many = turns(partitions).unwrap();
            for batch in [16 << 10, 1_000_000, 4 << 20] {
                let most = many.seats(batch);
                // Each seat: its share of the queue, the batch being taken and the next, and
                // librdkafka's bookkeeping as large again, a response arriving, and what a
                // response shared with other seats keeps.
                let held = most * (many.queue_each + 6 * batch);
                assert!(
                    held <= CLIENT || most == 1,
                    "{partitions} × {batch}: {most} hold {held}"
                );
                let one_more = (most + 1) * (many.queue_each + 6 * batch);
                assert!(
                    one_more > many.share_each * partitions,
                    "{partitions} × {batch}: room for {}",
                    most + 1
                );
            }
        }
        // At the defaults, two of 24 partitions may fetch megabyte batches at once; three
        // those of the 690 KB a librdkafka producer's megabyte batch comes to on the log.
        assert_eq!(turns(24).unwrap().seats(1_000_000), 2);
        assert_eq!(turns(24).unwrap().seats(690_000), 3);
        // A batch larger than the client's part: one seat, as one queue in fetch order holds it.
        assert_eq!(turns(24).unwrap().seats(CLIENT), 1);
    }

    #[test]
    fn megabyte_batches_fit_the_turns_of_six_partitions_at_the_defaults() {
        let six = turns(6).unwrap();
        assert_eq!(six.outgrown_by(six.queue_each + (1 << 20)), None);
    }

    #[test]
    fn a_partitions_whole_backlog_in_one_batch_of_most_of_its_share_ends_the_turns() {
        // 100,000 records of 175 bytes over 24 partitions, each partition's in one batch:
        // 730 KB, within the share of 699 KB a queue with its batch being taken doubles.
        let many = turns(24).unwrap();
        assert!(many.outgrown_by(4_166 * 175).is_some());
        // Over 96 partitions, 182 KB each.
        let more = turns(96).unwrap();
        assert!(more.outgrown_by(1_041 * 175).is_some());
    }
}
