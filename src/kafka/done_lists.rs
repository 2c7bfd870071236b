//! The lists of done offsets on the Kafka side (`crate::offsets::done`): written into each
//! commit's metadata, read back with the committed positions when partitions are assigned.
//!
//! Reading happens inside the assignment's callback, before the poll hands over any record of
//! the new partitions, so the committer knows the list before the first record comes. It is one
//! OffsetFetch to the coordinator, bounded by the commit time-out: a coordinator that does not
//! answer in time costs the list (every record above the position is processed, as without one),
//! never the assignment.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix::Recipient;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, info, warn};

use super::messages::{Inherit, InheritedDone};
use crate::domain::{CommitPosition, Epoch, TopicPartition};
use crate::offsets::DoneOffsets;

/// Where lists go and how long they may be.
pub struct DoneLists {
    committer: Recipient<Inherit>,
    /// The metadata's bound: `kafka.commit_metadata_max_bytes`, halved each time a broker
    /// refuses metadata as too large.
    max_bytes: AtomicUsize,
}

impl DoneLists {
    pub fn new(committer: Recipient<Inherit>, max_bytes: usize) -> Self {
        DoneLists {
            committer,
            max_bytes: AtomicUsize::new(max_bytes),
        }
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes.load(Ordering::Relaxed)
    }

    /// A broker refused a commit's metadata as too large (its `offset.metadata.max.bytes` is
    /// below ours): lists are cut to half as long from now on.
    pub fn refused_as_too_large(&self) {
        let before = self.max_bytes();
        let after = before / 2;
        self.max_bytes.store(after, Ordering::Relaxed);
        error!(
            before,
            after,
            "the broker refused an offset commit's metadata as too large: its \
             offset.metadata.max.bytes is below kafka.commit_metadata_max_bytes; lists of done \
             offsets are cut to {after} bytes from now on — set the key to the broker's limit"
        );
    }

    /// Reads the committed positions of newly assigned `partitions` and hands the lists of done
    /// offsets in their metadata to the committer.
    pub fn read<C: ConsumerContext, K: Consumer<C>>(
        &self,
        consumer: &K,
        partitions: &[(TopicPartition, Epoch)],
        timeout: Duration,
    ) {
        if partitions.is_empty() || self.max_bytes() == 0 {
            return;
        }
        let mut asked = TopicPartitionList::with_capacity(partitions.len());
        for (tp, _) in partitions {
            asked.add_partition(&tp.topic, tp.partition);
        }
        let committed = match consumer.committed_offsets(asked, Timeout::After(timeout)) {
            Ok(committed) => committed,
            Err(err) => {
                warn!(
                    error = %err,
                    partitions = partitions.len(),
                    timeout_ms = timeout.as_millis() as u64,
                    "could not read the committed positions' lists of done offsets; every \
                     record above the committed positions is processed"
                );
                return;
            }
        };
        let inherited = lists_of(&committed, partitions);
        if !inherited.is_empty() {
            self.committer.do_send(Inherit(inherited));
        }
    }
}

/// The lists in `committed`, for the partitions assigned with their epochs.
fn lists_of(
    committed: &TopicPartitionList,
    partitions: &[(TopicPartition, Epoch)],
) -> Vec<InheritedDone> {
    let mut inherited = Vec::new();
    for (index, element) in committed.elements().iter().enumerate() {
        let Offset::Offset(position) = element.offset() else {
            continue;
        };
        let Some((tp, epoch)) = partitions
            .iter()
            .find(|(tp, _)| &*tp.topic == element.topic() && tp.partition == element.partition())
        else {
            continue;
        };
        match DoneOffsets::decode(position, raw_metadata(committed, index)) {
            // No list: the position alone still tells the committer where this assignment
            // starts, so that a first record held there does not keep what is done behind it
            // from being committed.
            Ok(None) => inherited.push(InheritedDone {
                tp: tp.clone(),
                epoch: *epoch,
                position,
                done: DoneOffsets::default(),
            }),
            Ok(Some(done)) => {
                info!(
                    %tp,
                    committed = position,
                    listed = done.count(),
                    runs = done.runs().len(),
                    "the previous owner listed offsets above its committed position as done: \
                     their records are skipped"
                );
                inherited.push(InheritedDone {
                    tp: tp.clone(),
                    epoch: *epoch,
                    position,
                    done,
                });
            }
            Err(unreadable) => warn!(
                %tp,
                committed = position,
                reason = %unreadable,
                "the committed position's metadata is not a list of done offsets this version \
                 reads; every record above the position is processed"
            ),
        }
    }
    inherited
}

/// The metadata of the `index`th element, as bytes: rdkafka's own accessor panics on metadata
/// that is not UTF-8, which another tool may well have written.
fn raw_metadata(list: &TopicPartitionList, index: usize) -> &[u8] {
    // SAFETY: `index` is below the list's count (it comes from enumerating its elements); the
    // element's metadata pointer and size are librdkafka's, valid while the list lives, and a
    // null pointer comes with size 0.
    unsafe {
        let element = &*(*list.ptr()).elems.add(index);
        if element.metadata.is_null() || element.metadata_size == 0 {
            return &[];
        }
        std::slice::from_raw_parts(element.metadata as *const u8, element.metadata_size)
    }
}

/// The commit of `positions`, each with its list of done offsets in its metadata (none when
/// `metadata_max_bytes` is 0).
pub fn commit_list(positions: &[CommitPosition], metadata_max_bytes: usize) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(positions.len());
    for position in positions {
        let mut element = tpl.add_partition(&position.tp.topic, position.tp.partition);
        // Only fails for an invalid offset value, which a position never is.
        let _ = element.set_offset(Offset::Offset(position.offset));
        if metadata_max_bytes > 0 && !position.done.is_empty() {
            let encoded = position.done.encode(position.offset, metadata_max_bytes);
            if !encoded.text.is_empty() {
                element.set_metadata(&encoded.text);
            }
        }
    }
    tpl
}

/// Whether a refused commit was refused for its metadata's size.
pub fn metadata_too_large(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(rdkafka::error::RDKafkaErrorCode::OffsetMetadataTooLarge)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::offsets::Run;

    fn position(offset: i64, runs: impl IntoIterator<Item = Run>) -> CommitPosition {
        CommitPosition {
            tp: TopicPartition::new("t", 0),
            epoch: 1,
            generation: 0,
            offset,
            done: Arc::new(DoneOffsets::from_runs(runs)),
        }
    }

    #[test]
    fn a_commit_carries_its_list_within_the_bound_and_none_when_lists_are_off() {
        let every_other = (0..5_000).map(|i| Run {
            first: 102 + 2 * i,
            last: 102 + 2 * i,
        });
        let positions = [position(100, every_other)];
        let list = commit_list(&positions, 256);
        let element = list.find_partition("t", 0).unwrap();
        assert_eq!(element.offset(), Offset::Offset(100));
        let metadata = raw_metadata(&list, 0);
        assert!(
            !metadata.is_empty() && metadata.len() <= 256,
            "{}",
            metadata.len()
        );
        let read = DoneOffsets::decode(100, metadata).unwrap().unwrap();
        assert!(read.contains(102) && !read.contains(103));

        let off = commit_list(&positions, 0);
        assert!(raw_metadata(&off, 0).is_empty());
        let nothing_done = commit_list(&[position(100, [])], 4096);
        assert!(raw_metadata(&nothing_done, 0).is_empty());
    }

    #[test]
    fn metadata_refused_as_too_large_halves_the_bound() {
        let error =
            KafkaError::ConsumerCommit(rdkafka::error::RDKafkaErrorCode::OffsetMetadataTooLarge);
        assert!(metadata_too_large(&error));
        assert!(!metadata_too_large(&KafkaError::ConsumerCommit(
            rdkafka::error::RDKafkaErrorCode::RebalanceInProgress
        )));
        let system = actix::System::new();
        system.block_on(async {
            use actix::Actor;
            struct Sink;
            impl actix::Actor for Sink {
                type Context = actix::Context<Self>;
            }
            impl actix::Handler<Inherit> for Sink {
                type Result = ();
                fn handle(&mut self, _: Inherit, _: &mut actix::Context<Self>) {}
            }
            let lists = DoneLists::new(Sink.start().recipient(), 4096);
            lists.refused_as_too_large();
            assert_eq!(lists.max_bytes(), 2048);
            lists.refused_as_too_large();
            assert_eq!(lists.max_bytes(), 1024);
        });
    }
}
