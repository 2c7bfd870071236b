//! Wires the service from its settings and runs it until the shutdown trigger fires:
//! migrations, the pipeline, the Kafka supervisor on its own thread, the HTTP endpoints; then
//! the graceful stop — stop fetching, let in-flight work finish (bounded by
//! `pipeline.shutdown_timeout_ms`), commit, leave the group.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use actix::prelude::*;
use tracing::{info, warn};

use crate::actors::Pipeline;
use crate::actors::supervisor::{CloseConsumer, CommitFinal, KafkaSupervisor, StopFetching};
use crate::config::{ConfigError, Settings};
use crate::http::{self, Health};
use crate::kafka::dead_letter_topic::DeadLetterPublisher;
use crate::kafka::{self, SupervisorContext};
use crate::metrics::{Stats, StatsSnapshot};
use crate::store::{Database, StoreError, migrate};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaSetupError),
    #[error("kafka producer: {0}")]
    Producer(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot serve http on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// What a run did, for the demo's and the benchmark's reports.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub stats: StatsSnapshot,
}

/// Hooks a caller can observe while the service runs.
#[derive(Clone, Default)]
pub struct RunHandles {
    /// Set once the service has started; its counters, live.
    pub stats: Arc<std::sync::OnceLock<Arc<Stats>>>,
    /// The bound HTTP address, once serving.
    pub http_addr: Arc<std::sync::OnceLock<SocketAddr>>,
}

/// Runs the service until `shutdown` completes. Must be called inside an actix system.
pub async fn run(
    settings: &Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<RunReport, ServiceError> {
    run_with(settings, shutdown, RunHandles::default()).await
}

/// [`run`], publishing its live handles.
pub async fn run_with(
    settings: &Settings,
    shutdown: impl Future<Output = ()>,
    handles: RunHandles,
) -> Result<RunReport, ServiceError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let database = Database::from_settings(&settings.database)?;
    info!(
        database = %database.target(),
        brokers = %settings.kafka.brokers,
        group = %settings.kafka.group_id,
        topics = ?settings.kafka.topics,
        writers = settings.pipeline.writers,
        "history-service starting"
    );

    if settings.database.migrate_on_start {
        let migrated = tokio::select! {
            result = migrate_until_done(&database, settings) => Some(result),
            _ = &mut shutdown => None,
        };
        match migrated {
            Some(result) => result?,
            None => {
                return Ok(RunReport {
                    stats: StatsSnapshot::default(),
                });
            }
        }
    }

    let pool = database.pool(
        settings.database.pool_size,
        settings.database.connect_timeout(),
    );
    let stats = Stats::new();
    if settings.http.enabled {
        // The recorder before anything registers a family, or that registration is lost.
        http::prometheus();
        crate::metrics::register_families();
    }
    let _ = handles.stats.set(stats.clone());
    let publisher = if settings.dead_letter.topic.is_empty() {
        None
    } else {
        let publisher = DeadLetterPublisher::new(&settings.kafka, &settings.dead_letter.topic)?;
        info!(topic = %settings.dead_letter.topic, "dead letters are also published to a topic");
        Some(Arc::new(publisher))
    };
    let pipeline = Pipeline::start_with(&settings.pipeline, pool.clone(), stats.clone(), publisher);
    let joined = Arc::new(AtomicBool::new(false));
    let context = SupervisorContext::new(
        pipeline.committer().clone(),
        settings.kafka.revoke_timeout(),
        stats.clone(),
        joined.clone(),
    );
    let consumer = kafka::subscribe(&settings.kafka, context)?;
    let kafka_arbiter = Arbiter::new();
    let supervisor = {
        let pipeline = pipeline.clone();
        KafkaSupervisor::start_in_arbiter(&kafka_arbiter.handle(), move |_| {
            KafkaSupervisor::new(consumer, pipeline)
        })
    };
    pipeline.attach_kafka(supervisor.clone().recipient());

    let http = if settings.http.enabled {
        let addr = settings.http.listen_addr()?;
        let health = Health {
            joined,
            pool: pool.clone(),
        };
        let (server, bound) =
            http::serve(addr, health).map_err(|source| ServiceError::Http { addr, source })?;
        info!(%bound, "serving /metrics, /healthz and /readyz");
        let _ = handles.http_addr.set(bound);
        Some(server)
    } else {
        None
    };

    shutdown.await;
    info!("shutdown requested: stopping fetch, draining in-flight records");
    let _ = supervisor.send(StopFetching).await;
    let positions = pipeline.drain(settings.pipeline.shutdown_timeout()).await;
    let _ = supervisor.send(CommitFinal(positions)).await;
    let _ = supervisor.send(CloseConsumer).await;
    if let Some(server) = http {
        server.stop(true).await;
    }
    pipeline.stop();
    kafka_arbiter.stop();
    let _ = kafka_arbiter.join();
    let stats = stats.snapshot();
    info!(
        applied = stats.applied,
        already_applied = stats.already_applied,
        dead_letters = stats.dead_lettered,
        unknown = stats.unknown,
        "history-service stopped"
    );
    Ok(RunReport { stats })
}

/// Applies migrations, retrying while the database does not answer (it may start after us, or
/// restart under us). A migration the database itself rejects is retried a few times, then
/// stops the service: it will not go away by waiting.
async fn migrate_until_done(database: &Database, settings: &Settings) -> Result<(), ServiceError> {
    const REJECTIONS_TOLERATED: u32 = 3;
    let mut delay = settings.pipeline.retry_initial();
    let mut rejections = 0;
    loop {
        let attempt = async {
            let mut client = database.connect().await?;
            migrate::run_migrations(&mut client).await
        };
        let err = match attempt.await {
            Ok(_) => return Ok(()),
            Err(err) => err,
        };
        if let StoreError::Migration(_) = err {
            rejections += 1;
            if rejections > REJECTIONS_TOLERATED {
                return Err(err.into());
            }
        }
        warn!(
            error = %err,
            retry_in_ms = delay.as_millis() as u64,
            database = %database.target(),
            "migrations could not run; retrying"
        );
        actix_rt::time::sleep(delay).await;
        delay = (delay * 2).min(settings.pipeline.retry_max().max(Duration::from_secs(1)));
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = terminate.recv() => info!("SIGTERM received"),
        _ = interrupt.recv() => info!("SIGINT received"),
    }
}
