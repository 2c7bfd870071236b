//! Each assigned partition's records in a queue of its own, taken in turn.
//!
//! By default librdkafka forwards every partition's fetched records into the one consumer
//! queue, in the order the fetch responses came: a response carries each partition's first
//! record batch whole (thousands of records), and the prefetch limits count that one queue, so
//! while it is full nothing is fetched, and the fetch after it is filled by the partitions the
//! request names first. Taken in that order, the partitions are written one run after another:
//! under a slow database one at a time, the others waiting for their turn for tens of seconds.
//!
//! Here each partition's queue is split off the consumer queue before its fetching starts, so
//! the prefetch limits (`queued.min.messages`, `queued.max.messages.kbytes`) apply to each
//! partition, and the service takes one record of each partition that has one in turn. The
//! consumer queue is still polled, for rebalances, errors and the records of any partition that
//! was not split.
//!
//! The split is made in two steps. In the rebalance callback, before librdkafka starts fetching
//! the assigned partitions, [`mark_split`] turns the partition's forwarding off: librdkafka
//! keeps it off when it starts the fetch (`rd_kafka_toppar_op_fetch_start` leaves a queue the
//! application forwarded alone), so no record of it reaches the consumer queue and none can be
//! taken out of order. Then the record stream opens the queue ([`SplitQueue::open`]) when it
//! sees the assignment, and drops it when the partition is revoked. A queue keeps the consumer
//! it belongs to alive: librdkafka's queues must be destroyed before their client.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use tokio::sync::Notify;

use crate::domain::turns::Turns;
use crate::domain::{Record, TopicPartition};

/// Turns a partition's forwarding into the consumer queue off, before its fetching starts (in
/// the rebalance callback, ahead of the assignment). Returns whether it could.
pub(crate) fn mark_split<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    tp: &TopicPartition,
) -> bool {
    forward_partition(consumer, tp, false)
}

/// Gives a partition's queue back to the consumer queue, for a partition [`mark_split`] split
/// off before partitions stopped taking turns: its records come through the consumer queue,
/// as they would unsplit. Returns whether it could.
pub(crate) fn rejoin<C: ConsumerContext>(consumer: &impl Consumer<C>, tp: &TopicPartition) -> bool {
    forward_partition(consumer, tp, true)
}

/// Forwards the partition's queue into the consumer queue, or nowhere. The setting stays on the
/// partition's queue (librdkafka's own state) after the handles made here are gone.
fn forward_partition<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    tp: &TopicPartition,
    to_consumer_queue: bool,
) -> bool {
    let Ok(topic) = CString::new(&*tp.topic) else {
        return false;
    };
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is the live client; the handles made here are destroyed before return (a
    // forwarding keeps a reference of its own to the queue it forwards to).
    unsafe {
        let queue = rdsys::rd_kafka_queue_get_partition(rk, topic.as_ptr(), tp.partition);
        if queue.is_null() {
            return false;
        }
        let target = if to_consumer_queue {
            rdsys::rd_kafka_queue_get_consumer(rk)
        } else {
            std::ptr::null_mut()
        };
        let forwarded = !to_consumer_queue || !target.is_null();
        if forwarded {
            rdsys::rd_kafka_queue_forward(queue, target);
        }
        if !target.is_null() {
            rdsys::rd_kafka_queue_destroy(target);
        }
        rdsys::rd_kafka_queue_destroy(queue);
        forwarded
    }
}

/// What a partition queue hands over: a record, or an error with librdkafka's description.
pub(crate) type Fetched = Result<Record, (KafkaError, String)>;

/// One partition's own queue of fetched records.
pub(crate) struct SplitQueue<K> {
    tp: TopicPartition,
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    /// Set by librdkafka when the queue goes from empty to not empty; the pointer given to
    /// librdkafka is this `Signal`'s, kept alive by this handle until the callback is off.
    signal: Arc<Signal>,
    /// Records taken until the queue's length is looked at again.
    until_check: u32,
    /// The client the queue belongs to: declared last, dropped after the queue.
    _client: Arc<K>,
}

/// What librdkafka's callback touches when a partition queue goes from empty to not empty.
struct Signal {
    /// Whether the queue may hold records: cleared before a poll, set when a poll took one or
    /// the queue had one put in since. A queue found empty is not polled again until then —
    /// the partitions waiting for a seat after the turns ended are empty, and polling
    /// each for every record taken from the consumer queue cost a fifth of the service's CPU
    /// (a lock and a clock read each, for every queue).
    ready: AtomicBool,
    /// The record stream's wake.
    wake: Arc<Notify>,
}

// SAFETY: librdkafka's queues may be polled and destroyed from any thread; this handle is the
// queue's only owner here, and `take` needs `&mut self`.
unsafe impl<K: Send + Sync> Send for SplitQueue<K> {}

impl<K> SplitQueue<K> {
    /// Opens the partition's own queue on `consumer` (splitting it off the consumer queue if
    /// [`mark_split`] did not); `wake` is notified whenever it goes from empty to not empty.
    pub(crate) fn open<C: ConsumerContext>(
        consumer: Arc<K>,
        tp: TopicPartition,
        wake: Arc<Notify>,
    ) -> Option<Self>
    where
        K: Consumer<C>,
    {
        let topic = CString::new(&*tp.topic).ok()?;
        let rk = consumer.client().native_ptr();
        // Ready at first: the queue may hold records already, which no callback announces.
        let signal = Arc::new(Signal {
            ready: AtomicBool::new(true),
            wake,
        });
        // SAFETY: `rk` is alive while `consumer` is, which the handle keeps; the queue is
        // destroyed in `drop`, after the callback is turned off. The callback's opaque pointer
        // is the signal's, which the handle keeps alive.
        unsafe {
            let queue = NonNull::new(rdsys::rd_kafka_queue_get_partition(
                rk,
                topic.as_ptr(),
                tp.partition,
            ))?;
            rdsys::rd_kafka_queue_forward(queue.as_ptr(), std::ptr::null_mut());
            rdsys::rd_kafka_queue_cb_event_enable(
                queue.as_ptr(),
                Some(wake_up),
                Arc::as_ptr(&signal) as *mut std::ffi::c_void,
            );
            Some(SplitQueue {
                tp,
                queue,
                signal,
                until_check: 0,
                _client: consumer,
            })
        }
    }

    pub(crate) fn partition(&self) -> &TopicPartition {
        &self.tp
    }

    /// The records fetched and not yet taken.
    fn queued(&self) -> usize {
        // SAFETY: the queue is alive until `self` drops.
        unsafe { rdsys::rd_kafka_queue_length(self.queue.as_ptr()) }
    }

    /// Hands the queue back to the consumer queue, with the records it holds (librdkafka
    /// appends them to it, in order): the partition's records come through the consumer queue
    /// from now on.
    fn rejoin(self, main: NonNull<rdsys::rd_kafka_queue_t>) {
        // SAFETY: both queues are alive; the forwarding keeps a reference of its own to `main`.
        // `self` is dropped below: its callback off, its handle destroyed.
        unsafe { rdsys::rd_kafka_queue_forward(self.queue.as_ptr(), main.as_ptr()) };
    }

    /// The next record (or error, with librdkafka's description of it) of the partition, if
    /// one was fetched; never waits, and does not poll a queue found empty until librdkafka
    /// says it holds something again.
    pub(crate) fn take(&mut self) -> Option<Fetched> {
        // Cleared before the poll: a record put in after the poll found none sets it again
        // (librdkafka calls back under the queue's lock, after the poll released it).
        if !self.signal.ready.swap(false, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: the queue is alive until `self` drops; the message is destroyed after its
        // fields were copied.
        unsafe {
            let message = rdsys::rd_kafka_consume_queue(self.queue.as_ptr(), 0);
            if message.is_null() {
                // Empty, unless the poll was cut short (a callback yielded) with records left.
                if rdsys::rd_kafka_last_error() != RDKafkaRespErr::RD_KAFKA_RESP_ERR__TIMED_OUT {
                    self.signal.ready.store(true, Ordering::Release);
                }
                return None;
            }
            self.signal.ready.store(true, Ordering::Release);
            let taken = record_of_native(&*message);
            rdsys::rd_kafka_message_destroy(message);
            Some(taken)
        }
    }
}

impl<K> SplitQueue<K> {
    /// Drops what the queue holds of a fetch the partition's pause made stale (librdkafka
    /// discards such records as a poll meets them; unpolled, a paused partition's queue would
    /// keep its batch). Returns a record that was not stale, which only a pause that did not
    /// take would leave.
    fn discard_stale(&mut self) -> Option<Fetched> {
        // SAFETY: as in `take`.
        unsafe {
            let message = rdsys::rd_kafka_consume_queue(self.queue.as_ptr(), 0);
            if message.is_null() {
                return None;
            }
            self.signal.ready.store(true, Ordering::Release);
            let taken = record_of_native(&*message);
            rdsys::rd_kafka_message_destroy(message);
            Some(taken)
        }
    }
}

impl<K> Drop for SplitQueue<K> {
    fn drop(&mut self) {
        // SAFETY: the queue is ours and destroyed once, here. Turning the callback off takes
        // the queue's lock, which a callback under way holds: none runs after this.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.queue.as_ptr(), None, std::ptr::null_mut());
            rdsys::rd_kafka_queue_destroy(self.queue.as_ptr());
        }
        // The signal may be dropped now: librdkafka holds no pointer to it any more.
        let _ = &self.signal;
    }
}

unsafe extern "C" fn wake_up(_: *mut rdsys::rd_kafka_t, opaque: *mut std::ffi::c_void) {
    // SAFETY: the opaque pointer is a `Signal` its queue's handle keeps alive while the
    // callback is on.
    let signal = unsafe { &*(opaque as *const Signal) };
    signal.ready.store(true, Ordering::Release);
    signal.wake.notify_one();
}

/// The service's copy of a message taken from a partition queue, or the error it carries (as
/// rdkafka reports a consumer's message errors) with its description (which names the
/// partition and offset, where librdkafka knows them: the consumer queue's events hand it to
/// the client's error callback).
///
/// # Safety
/// `message` is a live message of librdkafka's.
unsafe fn record_of_native(message: &rdsys::rd_kafka_message_t) -> Fetched {
    if message.err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
        let code: RDKafkaErrorCode = message.err.into();
        let error = if code == RDKafkaErrorCode::PartitionEOF {
            KafkaError::PartitionEOF(message.partition)
        } else {
            KafkaError::MessageConsumption(code)
        };
        // SAFETY: the caller's; an error message's payload is its description.
        let reason = unsafe { std::ffi::CStr::from_ptr(rdsys::rd_kafka_message_errstr(message)) }
            .to_string_lossy()
            .into_owned();
        return Err((error, reason));
    }
    // SAFETY: the caller's: key and payload point at `key_len` and `len` bytes, or are null.
    let bytes = |data: *const std::ffi::c_void, len: usize| {
        (!data.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec())
    };
    let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    // SAFETY: the caller's; librdkafka only reads the message.
    let timestamp = unsafe { rdsys::rd_kafka_message_timestamp(message, &mut kind) };
    Ok(Record {
        offset: message.offset,
        key: bytes(message.key, message.key_len),
        payload: bytes(message.payload, message.len),
        timestamp_ms: (kind != rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
            .then_some(timestamp),
    })
}

/// The partition's low and high watermarks as the client last saw them (the high one with each
/// fetch response, the low one with its statistics; -1001 where it saw none). Asks no broker.
pub(crate) fn watermarks<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    tp: &TopicPartition,
) -> Option<(i64, i64)> {
    let rk = consumer.client().native_ptr();
    let topic = CString::new(&*tp.topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: `rk` is the live client; librdkafka writes the two offsets it has cached.
    let err = unsafe {
        rdsys::rd_kafka_get_watermark_offsets(rk, topic.as_ptr(), tp.partition, &mut low, &mut high)
    };
    (err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR).then_some((low, high))
}

/// The records of a partition's log not handed over yet: from the offset after the last one
/// handed over (or, none handed over since its assignment, the log's start) to its high
/// watermark; `None` where a watermark it needs is not known (-1001). Nothing handed over, the
/// log's start is where the count begins, not where the group's position is: a partition with
/// a long history counts it all until a record of it is handed over.
pub(crate) fn not_handed_over(low: i64, high: i64, handed_next: Option<i64>) -> Option<i64> {
    if high < 0 {
        return None;
    }
    let from = handed_next.or((low >= 0).then_some(low))?;
    Some((high - from).max(0))
}

/// The open partition queues of the current assignment, taken one record at a time in turn,
/// and the consumer queue's turns for the partitions it carries.
pub(crate) struct SplitQueues<K> {
    queues: Vec<SplitQueue<K>>,
    /// The queue whose turn is next.
    next: usize,
    wake: Arc<Notify>,
    /// The record bytes taken so far, for the size of what a queue holds (librdkafka counts a
    /// record's payload); and what the queues found holding more than the turns allow showed.
    taken: Taken,
    outgrown: Vec<Outgrown>,
    /// The consumer queue's part of the turns ([`MainTurns`]).
    main: MainTurns,
}

/// The consumer queue as one participant of the turns, weighted by the partitions it carries
/// (those given back, and any that could not be split): while the partition queues have
/// records, it is owed a record for each partition it carries per round of the queues, so a
/// partition in fetch order is not starved by those in turn, nor they by it. The debt is not
/// kept while it has nothing to give: an idle consumer queue does not bank turns.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MainTurns {
    /// The partitions the consumer queue carries.
    carried: usize,
    /// Records owed to it, in units of one partition queue's record: it is due when it is owed
    /// a whole round of the queues.
    owed: usize,
}

impl MainTurns {
    /// A record was taken from one of `queues` partition queues.
    fn queue_served(&mut self, queues: usize) {
        // At most one round's worth is banked beyond what is due.
        self.owed = (self.owed + self.carried).min(2 * queues.max(1) * self.carried.max(1));
    }

    /// Whether the consumer queue's turn has come, beside `queues` partition queues.
    fn due(&self, queues: usize) -> bool {
        self.carried > 0 && self.owed >= queues.max(1)
    }

    fn served(&mut self, queues: usize) {
        self.owed = self.owed.saturating_sub(queues.max(1));
    }

    fn idle(&mut self) {
        self.owed = 0;
    }
}

/// Payload bytes and records taken from the queues.
#[derive(Default)]
struct Taken {
    bytes: u64,
    records: u64,
}

/// A partition's queue found holding more than its share and a whole fetch part: the batch
/// it showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outgrown {
    pub tp: TopicPartition,
    pub queued_records: usize,
    pub queued_bytes: usize,
    pub batch: usize,
}

/// How many records of a queue are taken between two looks at its length: the first record
/// of a fetch is looked at (a queue is looked at when taken from first), and the rest costs a
/// lock every this many.
const CHECK_EVERY: u32 = 64;

impl<K> Default for SplitQueues<K> {
    fn default() -> Self {
        SplitQueues {
            queues: Vec::new(),
            next: 0,
            wake: Arc::new(Notify::new()),
            taken: Taken::default(),
            outgrown: Vec::new(),
            main: MainTurns::default(),
        }
    }
}

impl<K> SplitQueues<K> {
    /// What the queues' callbacks notify.
    pub(crate) fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Adds (or replaces) a partition's queue.
    pub(crate) fn insert(&mut self, queue: SplitQueue<K>) {
        self.remove(queue.partition());
        self.queues.push(queue);
    }

    /// Drops a partition's queue, if it has one: its records left there are not taken.
    pub(crate) fn remove(&mut self, tp: &TopicPartition) {
        if let Some(at) = self.queues.iter().position(|q| q.partition() == tp) {
            self.queues.remove(at);
            if self.next > at {
                self.next -= 1;
            }
        }
    }

    /// Drops what `tp`'s queue holds of fetches its pause made stale; returns a record that was
    /// not (see [`SplitQueue::discard_stale`]).
    pub(crate) fn discard_stale(&mut self, tp: &TopicPartition) -> Option<Fetched> {
        self.queues
            .iter_mut()
            .find(|queue| queue.partition() == tp)?
            .discard_stale()
    }

    /// The partitions with a queue of their own.
    pub(crate) fn partitions(&self) -> impl Iterator<Item = &TopicPartition> {
        self.queues.iter().map(SplitQueue::partition)
    }

    /// Whether `tp` has a queue of its own.
    pub(crate) fn contains(&self, tp: &TopicPartition) -> bool {
        self.queues.iter().any(|queue| queue.partition() == tp)
    }

    /// Forgets the queues found holding more than the turns allow, returning what they showed:
    /// in the rotation a seated partition's batch may be larger than a turn.
    pub(crate) fn take_outgrown(&mut self) -> Vec<Outgrown> {
        std::mem::take(&mut self.outgrown)
    }

    /// The next record of the partitions in turn, starting after the one that gave the last:
    /// each partition with records gives one before any gives a second. Now and then the
    /// queue's length is compared with what `turns` allow ([`Self::outgrown`]).
    pub(crate) fn take(&mut self, turns: Option<&Turns>) -> Option<(TopicPartition, Fetched)> {
        let count = self.queues.len();
        for step in 0..count {
            let at = (self.next + step) % count;
            if let Some(taken) = self.queues[at].take() {
                self.next = (at + 1) % count;
                self.main.queue_served(count);
                if let (Some(turns), Ok(record)) = (turns, &taken) {
                    self.watch(at, record, turns);
                }
                return Some((self.queues[at].partition().clone(), taken));
            }
        }
        None
    }

    fn watch(&mut self, at: usize, record: &Record, turns: &Turns) {
        self.taken.bytes += record.payload.as_ref().map_or(0, Vec::len) as u64;
        self.taken.records += 1;
        let queue = &mut self.queues[at];
        if queue.until_check > 0 {
            queue.until_check -= 1;
            return;
        }
        queue.until_check = CHECK_EVERY - 1;
        // The record just taken was the queue's too.
        let queued_records = queue.queued() + 1;
        let mean = self.taken.bytes / self.taken.records;
        let queued_bytes = (queued_records as u64 * mean) as usize;
        if let Some(batch) = turns.outgrown_by(queued_bytes) {
            if !self.outgrown.iter().any(|o| &o.tp == queue.partition()) {
                self.outgrown.push(Outgrown {
                    tp: queue.partition().clone(),
                    queued_records,
                    queued_bytes,
                    batch,
                });
            }
        }
    }

    /// Whether `records` records, at the mean payload taken so far, fit what a partition's queue
    /// may hold in its turn.
    pub(crate) fn fits_a_turn(&self, records: i64, turns: &Turns) -> bool {
        let mean = self
            .taken
            .bytes
            .checked_div(self.taken.records)
            .unwrap_or(0);
        records.max(0) as u64 * mean <= turns.most_queued() as u64
    }

    /// What the first queue found holding more than the turns allow showed.
    pub(crate) fn outgrown_first(&self) -> Option<Outgrown> {
        self.outgrown.first().cloned()
    }

    /// Whether a queue was found holding more than the turns allow.
    pub(crate) fn has_outgrown(&self) -> bool {
        !self.outgrown.is_empty()
    }

    /// Hands `tp`'s queue back to the consumer queue of `consumer`, records and all (appended
    /// in order): the partition is taken in fetch order from now on. Returns whether it had a
    /// queue and could.
    pub(crate) fn rejoin<C: ConsumerContext>(
        &mut self,
        consumer: &impl Consumer<C>,
        tp: &TopicPartition,
    ) -> bool {
        let Some(at) = self.queues.iter().position(|q| q.partition() == tp) else {
            return false;
        };
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` is the live client; the handle is destroyed below, after the forward took
        // a reference of its own.
        let Some(main) = NonNull::new(unsafe { rdsys::rd_kafka_queue_get_consumer(rk) }) else {
            tracing::error!(%tp, "the consumer queue could not be opened: the partition keeps its own queue");
            return false;
        };
        let queue = self.queues.remove(at);
        if self.next > at {
            self.next -= 1;
        }
        if self.next >= self.queues.len() {
            self.next = 0;
        }
        queue.rejoin(main);
        // SAFETY: made above, destroyed once.
        unsafe { rdsys::rd_kafka_queue_destroy(main.as_ptr()) };
        true
    }

    /// Hands every queue but those `keep` names back to the consumer queue of `consumer`,
    /// records and all; returns the partitions given back, and how many records their queues
    /// held.
    pub(crate) fn rejoin_all_but<C: ConsumerContext>(
        &mut self,
        consumer: &impl Consumer<C>,
        keep: impl Fn(&TopicPartition) -> bool,
    ) -> (Vec<TopicPartition>, usize) {
        self.outgrown.clear();
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` is the live client; the handle is destroyed below, after the forwards
        // took references of their own.
        let Some(main) = NonNull::new(unsafe { rdsys::rd_kafka_queue_get_consumer(rk) }) else {
            return (Vec::new(), 0);
        };
        let mut held = 0;
        let mut partitions = Vec::with_capacity(self.queues.len());
        let (kept, given): (Vec<_>, Vec<_>) = self
            .queues
            .drain(..)
            .partition(|queue| keep(queue.partition()));
        self.queues = kept;
        for queue in given {
            held += queue.queued();
            partitions.push(queue.partition().clone());
            queue.rejoin(main);
        }
        self.next = 0;
        // SAFETY: made above, destroyed once.
        unsafe { rdsys::rd_kafka_queue_destroy(main.as_ptr()) };
        (partitions, held)
    }

    /// The consumer queue carries `partitions` assigned partitions (in fetch order).
    pub(crate) fn set_carried(&mut self, partitions: usize) {
        self.main.carried = partitions;
        if partitions == 0 {
            self.main.idle();
        }
    }

    /// Whether the consumer queue's turn has come: the partitions it carries are owed a round
    /// of records beside the partition queues'.
    pub(crate) fn main_due(&self) -> bool {
        self.main.due(self.queues.len())
    }

    /// The consumer queue was polled on its turn: `gave` whether it had something.
    pub(crate) fn main_polled(&mut self, gave: bool) {
        if gave {
            self.main.served(self.queues.len());
        } else {
            self.main.idle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{MainTurns, not_handed_over};

    #[test]
    fn what_is_not_handed_over_counts_from_the_last_record_handed_over_or_the_logs_start() {
        // No fetch response yet.
        assert_eq!(not_handed_over(-1001, -1001, Some(10)), None);
        assert_eq!(not_handed_over(0, 10, Some(10)), Some(0));
        assert_eq!(not_handed_over(0, 12, Some(10)), Some(2));
        // A log that moved back below what was handed over.
        assert_eq!(not_handed_over(0, 8, Some(10)), Some(0));
        // Nothing handed over: the log's start, where it is known.
        assert_eq!(not_handed_over(7, 7, None), Some(0));
        assert_eq!(not_handed_over(0, 7, None), Some(7));
        assert_eq!(not_handed_over(-1001, 7, None), None);
    }

    /// Takes `records` in turns from `queues` backlogged partition queues and a backlogged
    /// consumer queue carrying `carried` partitions; returns how many came from the consumer
    /// queue.
    fn from_main(queues: usize, carried: usize, records: usize) -> usize {
        let mut main = MainTurns { carried, owed: 0 };
        let mut taken = 0;
        for _ in 0..records {
            if main.due(queues) {
                main.served(queues);
                taken += 1;
            } else {
                main.queue_served(queues);
            }
        }
        taken
    }

    #[test]
    fn the_consumer_queue_gets_a_turn_for_each_partition_it_carries() {
        // 23 partitions in fetch order, one in turn: 23 of every 24 records.
        assert_eq!(from_main(1, 23, 24_000), 23_000);
        // 3 in fetch order, 21 in turn: 3 of every 24.
        assert_eq!(from_main(21, 3, 24_000), 3_000);
        assert_eq!(from_main(12, 12, 24_000), 12_000);
    }

    #[test]
    fn a_consumer_queue_carrying_nothing_is_never_due() {
        assert_eq!(from_main(4, 0, 1_000), 0);
    }

    #[test]
    fn an_idle_consumer_queue_banks_no_turns() {
        let mut main = MainTurns {
            carried: 5,
            owed: 0,
        };
        for _ in 0..1_000 {
            main.queue_served(2);
        }
        // At most two rounds are owed, however long the partition queues gave alone.
        assert!(main.owed <= 2 * 2 * 5, "{main:?}");
        main.idle();
        assert!(!main.due(2));
    }
}
