//! The part of the actor system below the Kafka side: the OffsetCommitter, the pool of DB
//! writers (each on its own arbiter thread), and the starting of partition actors
//! ([`Pipeline::start_partition`], defined next to the actor, which holds this handle). Both the
//! real Kafka supervisor and the tests' mock supervisor drive the pipeline through this handle.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;

use super::committer::OffsetCommitter;
use super::dispatcher::{Dispatcher, WriterLink};
use super::messages::{AttachKafka, CommitOffsets, Drain, DrainReport};
use super::writer::{DbWriter, WriterSettings};
use crate::config::PipelineSettings;
use crate::kafka::dead_letter_topic::{self, DeadLetterPublisher};
use crate::kafka::intake::Intake;
use crate::metrics::Stats;
use crate::store::{PgHistoryRepository, PgPool};

/// A cheap, cloneable, thread-safe handle on the running pipeline.
#[derive(Clone)]
pub struct Pipeline {
    shared: Arc<Shared>,
}

struct Shared {
    committer: Addr<OffsetCommitter>,
    settings: PipelineSettings,
    stats: Arc<Stats>,
    /// What the service holds of what it fetched, and which partitions the client fetches.
    intake: Arc<Intake>,
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
        let budget = settings.budget();
        crate::metrics::set_window_limit(settings.max_in_flight_per_partition);
        crate::metrics::set_held_limits(budget.service.records, budget.service.bytes);
        let mut arbiters = Vec::with_capacity(settings.writers + 1);
        if let Some(publisher) = &publisher {
            // On a thread of its own, stopped with the writers.
            let arbiter = Arbiter::new();
            arbiter.spawn(dead_letter_topic::relay(
                publisher.clone(),
                pool.clone(),
                settings.retry_initial(),
                settings.retry_max(),
            ));
            arbiters.push(arbiter);
        }
        let writer_settings = WriterSettings {
            batch_max_events: settings.batch_max_events,
            batch_linger: settings.batch_linger(),
            batch_aim: settings.batch_aim(),
            retry_initial: settings.retry_initial(),
            retry_max: settings.retry_max(),
            replica: Arc::from(crate::replica::name()),
        };
        // The committer dispatches to the writers and the writers report to the committer:
        // `create` hands out the committer's address before the committer itself exists.
        let committer = OffsetCommitter::create(|ctx| {
            let me = ctx.address();
            let writers = (0..settings.writers)
                .map(|id| {
                    let arbiter = Arbiter::new();
                    let repository = PgHistoryRepository::new(pool.clone());
                    let committer = me.clone();
                    let writer_settings = writer_settings.clone();
                    let stats = stats.clone();
                    let publisher = publisher.clone();
                    let writer = DbWriter::start_in_arbiter(&arbiter.handle(), move |_| {
                        DbWriter::new(id, repository, publisher, committer, writer_settings, stats)
                    });
                    arbiters.push(arbiter);
                    WriterLink {
                        jobs: writer.clone().recipient(),
                        withdraw: writer.recipient(),
                    }
                })
                .collect();
            OffsetCommitter::new(settings.commit_interval(), Dispatcher::new(writers))
        });
        Pipeline {
            shared: Arc::new(Shared {
                committer,
                settings: settings.clone(),
                stats,
                intake: Intake::new(budget.service),
                arbiters: Mutex::new(arbiters),
            }),
        }
    }

    /// Tells the committer where to send its commits.
    pub fn attach_kafka(&self, kafka: Recipient<CommitOffsets>) {
        self.shared.committer.do_send(AttachKafka(kafka));
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

    pub fn intake(&self) -> &Arc<Intake> {
        &self.shared.intake
    }

    /// Waits until nothing is in flight or the deadline passes; reports the positions to commit
    /// and what is left.
    pub async fn drain(&self, deadline: Duration) -> DrainReport {
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
