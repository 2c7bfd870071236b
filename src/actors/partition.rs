//! One PartitionActor per assigned partition: decodes its records and has the OffsetCommitter
//! admit them (track their offsets and hand them to the DB writers) — never more than
//! `max_in_flight_per_partition` records between the committed position and the newest one.
//! The Kafka side pauses the partition when what it handed over fills that ([`WindowFill`]); the
//! actor asks it to resume once everything is admitted and the window has drained to half.
//! Each record keeps its share of the instance's budget ([`Held`]) through decoding into its
//! job, so what waits here counts as held.

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;
use tracing::{debug, debug_span, warn};

use super::messages::{
    Admit, AdmitReply, DecodedEvent, Drained, Epoch, Held, PassedOver, Record, RecordBytes,
    Records, StopPartition, TopicPartition, WindowState, WindowUpdate, Work, WriteJob,
};
use super::pipeline::Pipeline;
use super::window_fill::WindowFill;
use crate::domain::DeadLetter;
use crate::domain::HistoryEvent;

pub struct PartitionActor {
    tp: TopicPartition,
    epoch: Epoch,
    pipeline: Pipeline,
    kafka: Recipient<Drained>,
    /// What this partition holds, shared with the Kafka side that pauses it.
    window_fill: Arc<WindowFill>,
    /// Decoded records waiting for room in the window, in offset order.
    pending: VecDeque<WriteJob>,
    /// The window as the committer last reported it.
    window: WindowState,
    /// An Admit request is on its way; the next waits for its reply, keeping records in order.
    admitting: bool,
    /// What the client passed over after the pending records, to admit after them.
    passed_over: Option<i64>,
}

impl PartitionActor {
    pub fn new(
        tp: TopicPartition,
        epoch: Epoch,
        pipeline: Pipeline,
        kafka: Recipient<Drained>,
        window_fill: Arc<WindowFill>,
    ) -> Self {
        PartitionActor {
            tp,
            epoch,
            pipeline,
            kafka,
            window_fill,
            pending: VecDeque::new(),
            window: WindowState::default(),
            admitting: false,
            passed_over: None,
        }
    }

    fn window_limit(&self) -> usize {
        self.pipeline.settings().max_in_flight_per_partition
    }

    fn decode(&self, record: Record, held: Held) -> WriteJob {
        let max_payload = self.pipeline.settings().max_payload_bytes;
        // Cheap when debug is off; with it on, every line logged about the record carries its
        // partition, offset and event_id. Warnings name them themselves.
        let span = debug_span!(
            "record",
            partition = %self.tp,
            offset = record.offset,
            event_id = tracing::field::Empty
        );
        let _entered = span.enter();
        let work = match HistoryEvent::decode(record.payload.as_deref(), max_payload) {
            Ok(event) => {
                span.record("event_id", event.event_id.as_str());
                Work::Event(Box::new(DecodedEvent {
                    event,
                    record: RecordBytes {
                        key: record.key,
                        payload: record.payload,
                        timestamp_ms: record.timestamp_ms,
                    },
                }))
            }
            Err(error) => {
                warn!(
                    partition = %self.tp,
                    offset = record.offset,
                    reason = error.code(),
                    %error,
                    "poison record: it goes to the dead-letter table"
                );
                Work::DeadLetter(Box::new(DeadLetter::new(
                    &error,
                    record.key,
                    record.payload,
                    record.timestamp_ms,
                )))
            }
        };
        WriteJob {
            tp: self.tp.clone(),
            epoch: self.epoch,
            // The committer stamps the generation it tracks the offset under.
            generation: 0,
            offset: record.offset,
            work,
            held,
        }
    }

    fn observe(&mut self, window: WindowState) {
        if window.version >= self.window.version {
            self.window = window;
            self.window_fill.window(window.len);
        }
    }

    /// Moves pending records into the window as far as it has room.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.admitting {
            return;
        }
        if self.pending.is_empty() && self.passed_over.is_none() {
            self.resume_if_drained();
            return;
        }
        let room = self.window_limit().saturating_sub(self.window.len);
        if room == 0 {
            return;
        }
        let take = room.min(self.pending.len());
        let jobs: Vec<WriteJob> = self.pending.drain(..take).collect();
        // Only after every record before it.
        let passed_over = if self.pending.is_empty() {
            // A burst's queue is not kept at its peak size for the rest of the assignment.
            self.pending.shrink_to(self.window_limit());
            self.passed_over.take()
        } else {
            None
        };
        self.admitting = true;
        let admit = Admit {
            tp: self.tp.clone(),
            epoch: self.epoch,
            jobs,
            passed_over,
            partition: ctx.address().recipient(),
        };
        let request = self.pipeline.committer().send(admit);
        ctx.spawn(request.into_actor(self).map(move |reply, actor, ctx| {
            actor.admitting = false;
            match reply {
                Ok(AdmitReply::Accepted { window }) => {
                    actor.observe(window);
                    actor.window_fill.admitted(take);
                    actor.pump(ctx);
                }
                Ok(AdmitReply::Rejected) | Err(_) => {
                    debug!(tp = %actor.tp, epoch = actor.epoch, "assignment over");
                    ctx.stop();
                }
            }
        }));
    }

    fn resume_if_drained(&mut self) {
        if self.window_fill.drained() {
            debug!(tp = %self.tp, window = self.window.len, "window drained: asking to resume");
            self.kafka.do_send(Drained {
                tp: self.tp.clone(),
                epoch: self.epoch,
            });
        }
    }
}

impl Actor for PartitionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The supervisor never waits on this mailbox (it uses do_send); the window bounds it.
        ctx.set_mailbox_capacity(256);
        debug!(tp = %self.tp, epoch = self.epoch, "partition actor started");
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        debug!(
            tp = %self.tp,
            epoch = self.epoch,
            abandoned = self.pending.len(),
            "partition actor stopped"
        );
    }
}

impl Handler<Records> for PartitionActor {
    type Result = ();

    fn handle(&mut self, msg: Records, ctx: &mut Context<Self>) {
        self.pipeline.stats().records_fetched(msg.0.len() as u64);
        for (record, held) in msg.0 {
            let job = self.decode(record, held);
            self.pending.push_back(job);
        }
        self.pump(ctx);
    }
}

impl Handler<PassedOver> for PartitionActor {
    type Result = ();

    fn handle(&mut self, PassedOver(offset): PassedOver, ctx: &mut Context<Self>) {
        self.passed_over = Some(self.passed_over.map_or(offset, |known| known.max(offset)));
        self.pump(ctx);
    }
}

impl Handler<WindowUpdate> for PartitionActor {
    type Result = ();

    fn handle(&mut self, msg: WindowUpdate, ctx: &mut Context<Self>) {
        if msg.epoch == self.epoch {
            self.observe(msg.window);
            self.pump(ctx);
        }
    }
}

impl Handler<StopPartition> for PartitionActor {
    type Result = ();

    fn handle(&mut self, _: StopPartition, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

// Here rather than in pipeline.rs: the partition actor holds the pipeline handle, so the
// handle's file must not name the actor, or the two files would import each other.
impl Pipeline {
    /// Starts the actor of a newly assigned partition on the current arbiter, with the count of
    /// what it holds that the Kafka side keeps as it hands records over.
    pub fn start_partition(
        &self,
        tp: TopicPartition,
        epoch: Epoch,
        kafka: Recipient<Drained>,
    ) -> (Addr<PartitionActor>, Arc<WindowFill>) {
        let window_fill = Arc::new(WindowFill::new(self.settings().max_in_flight_per_partition));
        let actor =
            PartitionActor::new(tp, epoch, self.clone(), kafka, window_fill.clone()).start();
        (actor, window_fill)
    }
}
