//! The part of the actor system that does not depend on Kafka: the OffsetCommitter, the pool of
//! DB writers (each on its own arbiter thread), and the starting of partition actors. Both the
//! real Kafka supervisor and the tests' mock supervisor drive the pipeline through this handle.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;

use super::committer::OffsetCommitter;
use super::messages::{
    AttachKafka, CommitOffsets, CommitPosition, Drain, Epoch, FlowControl, TopicPartition, Work,
    WriteJob, WriteJobs,
};
use super::partition::PartitionActor;
use super::writer::{DbWriter, WriterSettings};
use crate::config::PipelineSettings;
use crate::kafka::dead_letter_topic::DeadLetterPublisher;
use crate::metrics::Stats;
use crate::store::{PgHistoryRepository, PgPool};

/// A cheap, cloneable, thread-safe handle on the running pipeline.
#[derive(Clone)]
pub struct Pipeline {
    shared: Arc<Shared>,
}

struct Shared {
    committer: Addr<OffsetCommitter>,
    writers: Vec<Addr<DbWriter>>,
    settings: PipelineSettings,
    stats: Arc<Stats>,
    /// Routes an event to a writer by its `event_id`, so one event is never in two concurrent
    /// transactions of this process (no lock waits between our own writers).
    router: std::collections::hash_map::RandomState,
    arbiters: Mutex<Vec<Arbiter>>,
}

impl Pipeline {
    /// Starts the committer on the current arbiter and `settings.writers` writers, each on an
    /// arbiter (thread) of its own.
    pub fn start(settings: &PipelineSettings, pool: PgPool, stats: Arc<Stats>) -> Pipeline {
        Self::start_with(settings, pool, stats, None)
    }

    /// [`Pipeline::start`], with dead letters also published to a Kafka topic.
    pub fn start_with(
        settings: &PipelineSettings,
        pool: PgPool,
        stats: Arc<Stats>,
        publisher: Option<Arc<DeadLetterPublisher>>,
    ) -> Pipeline {
        crate::metrics::set_window_limit(settings.max_in_flight_per_partition);
        let committer = OffsetCommitter::new(settings.commit_interval()).start();
        let writer_settings = WriterSettings {
            batch_max_events: settings.batch_max_events,
            batch_linger: settings.batch_linger(),
            retry_initial: settings.retry_initial(),
            retry_max: settings.retry_max(),
        };
        let mut arbiters = Vec::with_capacity(settings.writers);
        let writers = (0..settings.writers)
            .map(|id| {
                let arbiter = Arbiter::new();
                let repository = PgHistoryRepository::new(pool.clone());
                let committer = committer.clone();
                let writer_settings = writer_settings.clone();
                let stats = stats.clone();
                let publisher = publisher.clone();
                let writer = DbWriter::start_in_arbiter(&arbiter.handle(), move |_| {
                    DbWriter::new(id, repository, publisher, committer, writer_settings, stats)
                });
                arbiters.push(arbiter);
                writer
            })
            .collect();
        Pipeline {
            shared: Arc::new(Shared {
                committer,
                writers,
                settings: settings.clone(),
                stats,
                router: Default::default(),
                arbiters: Mutex::new(arbiters),
            }),
        }
    }

    /// Tells the committer where to send its commits.
    pub fn attach_kafka(&self, kafka: Recipient<CommitOffsets>) {
        self.shared.committer.do_send(AttachKafka(kafka));
    }

    /// Starts the actor of a newly assigned partition on the current arbiter.
    pub fn start_partition(
        &self,
        tp: TopicPartition,
        epoch: Epoch,
        kafka: Recipient<FlowControl>,
    ) -> Addr<PartitionActor> {
        PartitionActor::new(tp, epoch, self.clone(), kafka).start()
    }

    pub fn committer(&self) -> &Addr<OffsetCommitter> {
        &self.shared.committer
    }

    pub fn settings(&self) -> &PipelineSettings {
        &self.shared.settings
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.shared.stats
    }

    /// Sends tracked jobs to their writers, one message per writer.
    pub fn dispatch(&self, jobs: impl IntoIterator<Item = WriteJob>) {
        let writers = &self.shared.writers;
        let mut per_writer: Vec<Vec<WriteJob>> = vec![Vec::new(); writers.len()];
        for job in jobs {
            let index = match &job.work {
                Work::Event(event) => self.route(&event.event_id),
                Work::DeadLetter(_) => job.offset.unsigned_abs() as usize % writers.len(),
            };
            per_writer[index].push(job);
        }
        for (writer, jobs) in writers.iter().zip(per_writer) {
            if !jobs.is_empty() {
                writer.do_send(WriteJobs(jobs));
            }
        }
    }

    fn route(&self, event_id: &str) -> usize {
        (self.shared.router.hash_one(event_id) % self.shared.writers.len() as u64) as usize
    }

    /// Waits until nothing is in flight or the deadline passes; returns the positions to commit.
    pub async fn drain(&self, deadline: Duration) -> Vec<CommitPosition> {
        self.shared
            .committer
            .send(Drain { deadline })
            .await
            .unwrap_or_default()
    }

    /// Stops the writers' threads. In-flight writes are abandoned (their offsets were never
    /// committed, so they are re-read on the next start).
    pub fn stop(&self) {
        let arbiters = std::mem::take(&mut *self.shared.arbiters.lock().unwrap());
        for arbiter in arbiters {
            arbiter.stop();
            let _ = arbiter.join();
        }
    }
}
