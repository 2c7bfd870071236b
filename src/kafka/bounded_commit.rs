//! An offset commit that waits for the broker's verdict at most until a deadline.
//!
//! `Consumer::commit(…, CommitMode::Sync)` waits without a bound: with the coordinator gone,
//! librdkafka defers the commit for `session.timeout.ms` and then fails it, and a request that
//! was on the wire when the broker died waits for `socket.timeout.ms` (60 s) — a stop or a
//! revoke that commits then takes that long, or longer with retries. Here the commit is handed
//! to librdkafka with a queue of our own for its result (`rd_kafka_commit_queue`, which only
//! queues the commit), and that queue is polled until the deadline, in a second step, so that
//! the caller can queue under a lock and wait without it. A commit whose verdict did not arrive
//! in time is not done, but not over either: librdkafka may still send it (it holds commits
//! while the coordinator is unavailable and sends them when it returns, behind whatever was
//! queued meanwhile), so the [`QueuedCommit`] is kept, and its verdict read later, rather than
//! dropped — see `CommitTurn` in the context.

use std::ptr::NonNull;
use std::time::Instant;

use rdkafka::TopicPartitionList;
use rdkafka::bindings as rdsys;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;

/// A commit handed to librdkafka, whose verdict is still to be read from a queue of its own.
/// It must be dropped before the client it was queued on is destroyed.
pub(crate) struct QueuedCommit {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
}

// SAFETY: a librdkafka queue may be polled and destroyed from any thread; the QueuedCommit is
// its only handle, so it is never used from two threads at once.
unsafe impl Send for QueuedCommit {}

/// What the broker said about a commit, as far as is known by a deadline.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// The commit, and every partition in it, was confirmed.
    Confirmed,
    /// The broker (or librdkafka) refused it.
    Refused(KafkaError),
    /// No verdict yet: librdkafka still holds or sends it.
    Pending,
}

/// Queues a commit of `offsets`; returns at once, without waiting for the broker.
pub(crate) fn queue_commit<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    offsets: &TopicPartitionList,
) -> Result<QueuedCommit, KafkaError> {
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is the live client behind `consumer`; the queue is ours, destroyed when the
    // QueuedCommit is dropped (or here, on failure); `offsets` is copied by librdkafka before
    // the call returns.
    unsafe {
        let queue = NonNull::new(rdsys::rd_kafka_queue_new(rk))
            .expect("librdkafka allocates queues or aborts");
        let err = rdsys::rd_kafka_commit_queue(
            rk,
            offsets.ptr(),
            queue.as_ptr(),
            None,
            std::ptr::null_mut(),
        );
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            rdsys::rd_kafka_queue_destroy(queue.as_ptr());
            return Err(KafkaError::ConsumerCommit(err.into()));
        }
        Ok(QueuedCommit { queue })
    }
}

impl QueuedCommit {
    /// Waits for the broker's verdict until `deadline` (polling at least once). After a
    /// `Confirmed` or `Refused`, nothing more comes.
    pub(crate) fn wait(&self, deadline: Instant) -> Verdict {
        // SAFETY: the queue is live until `self` drops; each event polled is destroyed after
        // its fields were read.
        unsafe {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let timeout_ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
                let event = rdsys::rd_kafka_queue_poll(self.queue.as_ptr(), timeout_ms);
                if event.is_null() {
                    if Instant::now() >= deadline {
                        return Verdict::Pending;
                    }
                    continue;
                }
                if rdsys::rd_kafka_event_type(event) != rdsys::RD_KAFKA_EVENT_OFFSET_COMMIT {
                    rdsys::rd_kafka_event_destroy(event);
                    continue;
                }
                let mut err = rdsys::rd_kafka_event_error(event);
                if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                    err = first_partition_error(rdsys::rd_kafka_event_topic_partition_list(event));
                }
                rdsys::rd_kafka_event_destroy(event);
                return if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                    Verdict::Confirmed
                } else {
                    Verdict::Refused(KafkaError::ConsumerCommit(err.into()))
                };
            }
        }
    }
}

impl Verdict {
    /// As a result: a verdict still pending is a commit that timed out.
    pub(crate) fn into_result(self) -> Result<(), KafkaError> {
        match self {
            Verdict::Confirmed => Ok(()),
            Verdict::Refused(err) => Err(err),
            Verdict::Pending => Err(KafkaError::ConsumerCommit(
                RDKafkaErrorCode::OperationTimedOut,
            )),
        }
    }
}

impl Drop for QueuedCommit {
    fn drop(&mut self) {
        // A verdict that arrives after this is dropped with the queue.
        // SAFETY: the queue is ours and destroyed once, here.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}

/// The first partition error of a commit's result, `NO_ERROR` if none.
///
/// # Safety
/// `list` is null or a valid list owned by a live event.
unsafe fn first_partition_error(
    list: *mut rdsys::rd_kafka_topic_partition_list_t,
) -> RDKafkaRespErr {
    // SAFETY: the caller's.
    if list.is_null() || unsafe { (*list).cnt <= 0 || (*list).elems.is_null() } {
        return RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    // SAFETY: the caller's; `elems` holds `cnt` elements.
    let elements = unsafe { std::slice::from_raw_parts((*list).elems, (*list).cnt as usize) };
    elements
        .iter()
        .map(|element| element.err)
        .find(|&err| err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap_or(RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
}
