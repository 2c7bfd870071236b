//! Whether the client's prefetch lets partitions take turns, and the sign that it no longer does.
//!
//! Partitions take turns when each has a queue of its own in the client
//! (`crate::kafka::split_queues`): its share of `queued.max.messages.kbytes`, and what its last
//! fetch brought. That last part is bounded by `max.partition.fetch.bytes` — set to half the
//! partition's share of the client's budget — except that a broker returns a partition's first
//! record batch whole, however large: a producer's batch of a megabyte (librdkafka's
//! `batch.size`, and what any producer reaches writing a backlog) is held whole in each
//! partition's queue. With small batches (the Java producer's 16 KiB) the queues stay within the
//! client's budget however many partitions there are; with batches larger than half a
//! partition's share they do not, and the partitions are taken in fetch order again, from one
//! queue, whose limits hold whatever the batches.
//!
//! What a partition's queue holds is its share of `queued.*` at most when a fetch is sent, plus
//! the fetch's part: so a queue found holding more than its share and a whole fetch part (with a
//! margin for the estimate of its bytes) shows a batch larger than the partition's turn allows.

use super::budget::Fetch;

/// The smallest part of a fetch response a partition may be given while partitions take turns:
/// a few of the Java producer's default batches (16 KiB). Below it, there are too many
/// partitions for the budget, whatever the producers.
pub(crate) const MIN_PARTITION_FETCH_BYTES: usize = 64 << 10;

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
}

impl Turns {
    /// The turns of `partitions` partitions sharing `client_bytes` (the client's part of
    /// `budget_bytes`), each with `queue_each` bytes of queue; or, when each partition's part
    /// of a fetch would be below [`MIN_PARTITION_FETCH_BYTES`], the budget they would need.
    pub fn plan(
        budget_bytes: usize,
        client_bytes: usize,
        queue_each: usize,
        partitions: usize,
    ) -> Result<Turns, usize> {
        let partitions = partitions.max(1);
        let turns = Turns {
            budget_bytes,
            partitions,
            queue_each,
            share_each: client_bytes / partitions,
        };
        if turns.partition_fetch_bytes() < MIN_PARTITION_FETCH_BYTES {
            return Err(turns.budget_for(MIN_PARTITION_FETCH_BYTES));
        }
        Ok(turns)
    }

    /// `max.partition.fetch.bytes` while partitions take turns: half a partition's share, so
    /// that one fetched part is taken while the next is on its way.
    pub fn partition_fetch_bytes(&self) -> usize {
        self.share_each / 2
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

    /// The bytes a partition's queue may hold with batches that fit its turn: its share of the
    /// queue and one fetch part, a quarter more for the estimate.
    pub fn most_queued(&self) -> usize {
        self.queue_each + self.partition_fetch_bytes() / 4 * 5
    }

    /// The batch a queue of `queued_bytes` shows, when it is larger than the turns allow.
    pub fn outgrown_by(&self, queued_bytes: usize) -> Option<usize> {
        (queued_bytes > self.most_queued()).then(|| queued_bytes - self.queue_each)
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

    /// The defaults: a 32 MiB budget, whose client half is 16 MiB with 4 MiB of queue.
    const BUDGET: usize = 32 << 20;
    const CLIENT: usize = 16 << 20;
    const QUEUE: usize = 4 << 20;

    #[test]
    fn partitions_take_turns_while_each_fetch_part_is_a_few_small_batches() {
        let turns = Turns::plan(BUDGET, CLIENT, QUEUE / 24, 24).unwrap();
        assert_eq!(turns.partition_fetch_bytes(), CLIENT / 48);
        assert!(Turns::plan(BUDGET, CLIENT, QUEUE / 128, 128).is_ok());
        // 129 partitions would be given less than 64 KiB each: twice the budget would do.
        let Err(needed) = Turns::plan(BUDGET, CLIENT, QUEUE / 129, 129) else {
            panic!("129 partitions take turns in a 32 MiB budget");
        };
        let twice = 2 * 129 * 2 * MIN_PARTITION_FETCH_BYTES;
        assert!((twice..twice + twice / 1000).contains(&needed), "{needed}");
    }

    #[test]
    fn a_queue_holding_its_share_and_a_fetch_part_is_within_its_turn() {
        let turns = Turns::plan(BUDGET, CLIENT, QUEUE / 24, 24).unwrap();
        let full = turns.queue_each + turns.partition_fetch_bytes();
        assert_eq!(turns.outgrown_by(full), None);
        assert_eq!(turns.outgrown_by(turns.most_queued()), None);
        // A megabyte batch fetched into a queue just below its share.
        let batch = 1_000_000;
        let queued = turns.queue_each - 1 + batch;
        assert_eq!(turns.outgrown_by(queued), Some(batch - 1));
        // Its budget: two such batches for each of the 24 partitions, in the client's half.
        let needed = turns.budget_for(batch);
        let exact = 2 * 24 * 2 * batch;
        assert!(
            (exact..exact + exact / 100_000).contains(&needed),
            "{needed}"
        );
    }

    #[test]
    fn each_partitions_part_of_a_fetch_is_its_turns_share_at_most() {
        let budget = super::super::budget::Split::of(8000, BUDGET);
        let fetch = budget.fetch(1, 4);
        assert_eq!(fetch.partition_bytes, 1 << 20);
        let many = Turns::plan(BUDGET, CLIENT, QUEUE / 24, 24).unwrap();
        assert_eq!(many.fetch(fetch).partition_bytes, CLIENT / 48);
        assert_eq!(many.fetch(fetch).max_bytes, fetch.max_bytes);
        let few = Turns::plan(BUDGET, CLIENT, QUEUE / 3, 3).unwrap();
        assert_eq!(few.fetch(fetch), fetch);
    }

    #[test]
    fn megabyte_batches_fit_the_turns_of_six_partitions_at_the_defaults() {
        let turns = Turns::plan(BUDGET, CLIENT, QUEUE / 6, 6).unwrap();
        assert_eq!(turns.outgrown_by(turns.queue_each + (1 << 20)), None);
    }
}
