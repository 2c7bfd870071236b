//! Wires the service from its settings and runs it until the shutdown trigger fires:
//! migrations, the pipeline, the Kafka supervisor on its own thread, the HTTP endpoints; then
//! the graceful stop — stop fetching, let in-flight work finish (bounded by
//! `pipeline.shutdown_timeout_ms`), commit, leave the group.

use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::{info, warn};

use crate::actors::Pipeline;
use crate::actors::supervisor::{
    CloseConsumer, CommitFinal, KafkaSupervisor, StopFetching, Traces,
};
use crate::actors::trace_check::TraceCheck;
use crate::config::{ConfigError, Settings};
use crate::domain::CommitOutcome;
use crate::domain::backoff::Backoff;
use crate::domain::turns::Turns;
use crate::health::Readiness;
use crate::http;
use crate::kafka::context::CommitterLink;
use crate::kafka::dead_letter_topic::DeadLetterPublisher;
use crate::kafka::error_log::ClientErrorLog;
use crate::kafka::fetch_sizing::{FetchSizing, SizingWatch};
use crate::kafka::tail::TailReader;
use crate::kafka::topic_watch::TopicWatchSettings;
use crate::kafka::{self, SupervisorContext};
use crate::metrics::{Stats, StatsSnapshot};
use crate::store::{Database, StoreError, migrate};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Every Kafka client error reaches here through `KafkaSetupError`, which has the configured
    /// property values cut out of librdkafka's messages: no `From<KafkaError>` on purpose.
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaSetupError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("LISTEN_FDS names no usable TCP listening socket at file descriptor 3")]
    HandedOverListener { source: std::io::Error },
    #[error("cannot serve http on {addr}")]
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

// Loading is defined here, above every layer whose checks it runs: the configuration layer
// reads and checks the plain values, the Kafka layer the pass-through librdkafka properties,
// the store parses the database's.
impl Settings {
    /// The settings the service starts with: the built-in defaults, `file` (the `--config`
    /// path, if any) and the environment, read and validated by the configuration layer, then
    /// each librdkafka property checked by the Kafka layer and the database's URL and password
    /// file parsed by the store. A value the service could not
    /// start with fails here, naming its key and the reason, never a secret.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, None)
    }

    /// Like [`Settings::load`], with the environment given explicitly (tests).
    pub fn load_from(
        file: Option<&Path>,
        environment: Option<std::collections::HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let settings = Settings::read_from(file, environment)?;
        crate::kafka::properties::validate(&settings.kafka)?;
        settings.database.postgres_config()?;
        Ok(settings)
    }
}

/// What a run did, for the demo's and the benchmark's reports and the exit code.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub stats: StatsSnapshot,
    pub left: Leftover,
}

/// What the final commit did not cover when the service stopped. The next owner of those
/// partitions reads these records again: unresolved ones are written then, resolved ones come
/// out `AlreadyApplied`. Nothing is lost either way; this measures rework, and says whether the
/// stop was clean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leftover {
    /// Records still in flight at the shutdown deadline (the database did not answer in time).
    pub unresolved: usize,
    /// Records written but behind an unresolved one, so no commit could cover them.
    pub resolved_behind: usize,
    /// Partitions whose final position the broker did not confirm.
    pub uncommitted_partitions: usize,
    /// The stop was cut short (a second signal, or its deadline) before the drain reported:
    /// `unresolved` counts the records held then, and what was resolved is not known committed.
    pub interrupted: bool,
}

impl Leftover {
    /// True when the final commit covered every record this process wrote.
    pub fn is_clean(&self) -> bool {
        *self == Leftover::default()
    }
}

/// Hooks a caller can observe while the service runs.
#[derive(Clone, Default)]
pub struct RunHandles {
    /// Set once the service has started; its counters, live.
    pub stats: Arc<std::sync::OnceLock<Arc<Stats>>>,
    /// The bound HTTP address, once serving.
    pub http_addr: Arc<std::sync::OnceLock<SocketAddr>>,
    /// A listening socket to serve the endpoints on instead of binding `http.listen` (a test
    /// hands over one bound to port 0). Without it, a socket handed over through `LISTEN_FDS`
    /// is served, if there is one.
    pub http_listener: Arc<std::sync::Mutex<Option<std::net::TcpListener>>>,
}

/// What ends a run: `requested` begins the graceful stop — stop fetching, drain, commit, leave
/// the group; `hurried`, completing once that stop has begun (a second signal), cuts it short:
/// nothing more is awaited, no thread joined, and the report says what was left (not clean
/// unless the stop had already got that far). The caller then exits the process without
/// waiting for anything either.
pub struct Stop<R, H> {
    pub requested: R,
    pub hurried: H,
}

impl<R: Future<Output = ()>> Stop<R, std::future::Pending<()>> {
    /// A stop that begins when `requested` completes and is never cut short.
    pub fn when(requested: R) -> Self {
        Stop {
            requested,
            hurried: std::future::pending(),
        }
    }
}

/// Runs the service until `stop` says so, publishing its live handles. Must be called inside
/// an actix system.
pub async fn run<R, H>(
    settings: &Settings,
    stop: Stop<R, H>,
    handles: RunHandles,
) -> Result<RunReport, ServiceError>
where
    R: Future<Output = ()>,
    H: Future<Output = ()>,
{
    let Stop {
        requested: shutdown,
        hurried: hurry,
    } = stop;
    let mut shutdown = std::pin::pin!(shutdown);
    let database = Database::from_settings(&settings.database)?;
    info!(
        database = %database.target(),
        brokers = %settings.kafka.brokers,
        group = %settings.kafka.group_id,
        topics = ?settings.kafka.topics,
        group_protocol = settings.kafka.group_protocol.name(),
        group_instance_id = %settings.kafka.group_instance_id,
        writers = settings.pipeline.writers,
        librdkafka = %kafka::features::librdkafka_version(),
        builtin_features = %kafka::features::builtin()
            .map(|features| features.join(","))
            .unwrap_or_else(|err| format!("unknown ({err})")),
        "history-service starting"
    );
    let stats = Stats::new();
    if settings.http.enabled {
        // The recorder before anything registers a family, or that registration is lost.
        http::prometheus();
        crate::metrics::register_families();
        crate::metrics::set_group_protocol(
            settings.kafka.group_protocol.name(),
            settings.kafka.is_static_member(),
        );
    }
    let _ = handles.stats.set(stats.clone());
    let readiness = Readiness::new(stats.clone(), settings.pipeline.unready_after_failing());

    // Served from the first moment: probes see a live process (and why it is not ready yet)
    // while it migrates or waits for the database.
    let http = if settings.http.enabled {
        let addr = settings.http.listen_addr()?;
        let handed = match handles.http_listener.lock().map(|mut held| held.take()) {
            Ok(Some(listener)) => Some(listener),
            _ => http::handed_over_listener()
                .map_err(|source| ServiceError::HandedOverListener { source })?,
        };
        let listen = match handed {
            Some(listener) => http::Listen::Handed(listener),
            None => http::Listen::Bind(addr),
        };
        let (server, bound) = http::serve(listen, readiness.clone())
            .map_err(|source| ServiceError::Http { addr, source })?;
        info!(%bound, "serving /metrics, /healthz and /readyz");
        let _ = handles.http_addr.set(bound);
        Some(server)
    } else {
        None
    };

    let started = start(settings, &database, &stats, &readiness, shutdown.as_mut()).await;
    let Started {
        pipeline,
        supervisor,
        kafka_arbiter,
    } = match started {
        Ok(Some(started)) => started,
        // A start-up error, or a shutdown before the service ran: stop serving before the
        // caller's runtime ends.
        outcome => {
            if let Some(server) = http {
                server.stop(true).await;
            }
            return outcome.map(|_| RunReport {
                stats: stats.snapshot(),
                left: Leftover::default(),
            });
        }
    };

    shutdown.await;
    let timeout = settings.pipeline.shutdown_timeout();
    info!(
        timeout_ms = timeout.as_millis() as u64,
        "shutdown requested: stopping fetch, draining in-flight records"
    );
    let clock = StopClock::start(timeout);
    let progress = RefCell::new(StopProgress::default());
    let stopped = {
        let orderly = stop_in_order(
            &clock,
            &progress,
            pipeline.clone(),
            supervisor,
            kafka_arbiter,
            http,
        );
        tokio::select! {
            biased;
            () = hurry => Some("second signal: stopping now"),
            finished = tokio::time::timeout(timeout + STOP_GRACE, orderly) => match finished {
                Ok(()) => None,
                Err(_) => Some("the stop's deadline passed: stopping now"),
            },
        }
    };
    if let Some(why) = stopped {
        warn!(
            elapsed_ms = clock.elapsed().as_millis() as u64,
            "{why}: what is not done is left to the next owner"
        );
    }
    let held = pipeline.intake().level().records;
    let (left, committed_partitions) = progress.into_inner().leftover(held);
    let stats = stats.snapshot();
    if left.is_clean() {
        info!(
            applied = stats.applied,
            already_applied = stats.already_applied,
            dead_letters = stats.dead_lettered,
            unknown = stats.unknown,
            committed_partitions,
            left = 0,
            elapsed_ms = clock.elapsed().as_millis() as u64,
            "history-service stopped: the final commit covers every record written"
        );
    } else {
        warn!(
            applied = stats.applied,
            already_applied = stats.already_applied,
            dead_letters = stats.dead_lettered,
            unknown = stats.unknown,
            unresolved = left.unresolved,
            resolved_behind = left.resolved_behind,
            uncommitted_partitions = left.uncommitted_partitions,
            interrupted = left.interrupted,
            left = left.unresolved + left.resolved_behind,
            elapsed_ms = clock.elapsed().as_millis() as u64,
            "history-service stopped: records left behind the final commit; the next owner \
             reads them again, processing the unresolved ones and skipping the resolved ones the \
             commit lists as done (kafka.commit_metadata_max_bytes)"
        );
    }
    Ok(RunReport { stats, left })
}

/// The least the final commit, the consumer's close and the threads' end each get when the
/// drain used the whole deadline: a healthy broker answers within milliseconds.
const STEP_FLOOR: Duration = Duration::from_secs(1);

/// How far past `pipeline.shutdown_timeout_ms` the whole stop may run (the floors above, and
/// the answers of the actors) before it is cut short like a second signal.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The stop's one deadline, which every step waits against.
struct StopClock {
    started: Instant,
    deadline: Instant,
}

impl StopClock {
    fn start(timeout: Duration) -> Self {
        let started = Instant::now();
        StopClock {
            started,
            deadline: started + timeout,
        }
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// What is left of the deadline.
    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// What is left of the deadline, but at least [`STEP_FLOOR`].
    fn left_at_least_floor(&self) -> Duration {
        self.left().max(STEP_FLOOR)
    }
}

/// How far the stop got; read when it ends, in order or cut short.
#[derive(Default)]
struct StopProgress {
    drained: Option<crate::actors::messages::DrainReport>,
    committed: Option<CommitOutcome>,
}

impl StopProgress {
    /// What the stop left behind, and how many partitions the final commit covered. `held`:
    /// the records taken from Kafka and not resolved, counted when the drain did not report.
    fn leftover(self, held: usize) -> (Leftover, usize) {
        let Some(drained) = self.drained else {
            let left = Leftover {
                unresolved: held,
                interrupted: true,
                ..Leftover::default()
            };
            return (left, 0);
        };
        let (uncommitted, committed) = match self.committed {
            Some(outcome) => (outcome.failed.len(), outcome.confirmed.len()),
            None => (drained.positions.len(), 0),
        };
        let left = Leftover {
            unresolved: drained.unresolved,
            resolved_behind: drained.resolved_behind,
            uncommitted_partitions: uncommitted,
            interrupted: false,
        };
        (left, committed)
    }
}

/// The graceful stop, each step under what is left of the deadline: stop fetching, let
/// in-flight work finish, commit the final positions (waiting for the broker's confirmation),
/// close the consumer, stop serving, end the threads. A step that does not end in time is left
/// behind — a thread blocked on the broker is not waited for — and the stop goes on.
async fn stop_in_order(
    clock: &StopClock,
    progress: &RefCell<StopProgress>,
    pipeline: Pipeline,
    supervisor: Addr<KafkaSupervisor>,
    kafka_arbiter: Arbiter,
    http: Option<http::Endpoints>,
) {
    if tokio::time::timeout(clock.left(), supervisor.send(StopFetching))
        .await
        .is_err()
    {
        warn!("the Kafka supervisor did not stop fetching within the stop's deadline");
    }
    // The committer answers at the deadline itself; the margin is for its mailbox.
    let drain = pipeline.drain(clock.left());
    let Ok(drained) = tokio::time::timeout(clock.left() + STEP_FLOOR, drain).await else {
        warn!("the committer did not report the drain within the stop's deadline");
        return;
    };
    progress.borrow_mut().drained = Some(drained.clone());
    // The final commit gets what is left of the deadline, and at least the floor.
    let commit_deadline = Instant::now() + clock.left_at_least_floor();
    let commit = supervisor.send(CommitFinal {
        positions: drained.positions.clone(),
        deadline: commit_deadline,
    });
    let committed =
        match tokio::time::timeout(clock.left_at_least_floor() + STEP_FLOOR, commit).await {
            Ok(Ok(outcome)) => outcome,
            _ => {
                warn!("the Kafka supervisor did not answer the final commit in time");
                CommitOutcome {
                    confirmed: Vec::new(),
                    failed: drained.positions.clone(),
                }
            }
        };
    progress.borrow_mut().committed = Some(committed);
    let close = async {
        if let Ok(closed) = supervisor.send(CloseConsumer).await {
            let _ = closed.await;
        }
    };
    if tokio::time::timeout(clock.left_at_least_floor(), close)
        .await
        .is_err()
    {
        warn!(
            "the Kafka consumer did not close within the stop's deadline (the broker does not \
             answer): not waiting for it; the group moves its partitions after the session \
             timeout"
        );
    }
    if let Some(server) = http {
        server.stop(true).await;
    }
    // The writers', the relay's and the supervisor's threads end when their event loops do;
    // a producer or consumer closing against a dead broker may hold one up: not waited for
    // past the deadline.
    let (ended, joined) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("history-stop".into())
        .spawn(move || {
            pipeline.stop();
            kafka_arbiter.stop();
            let _ = kafka_arbiter.join();
            let _ = ended.send(());
        })
        .expect("cannot start the thread that ends the others");
    if tokio::time::timeout(clock.left_at_least_floor(), joined)
        .await
        .is_err()
    {
        warn!("the service's threads did not end within the stop's deadline: not waiting for them");
    }
}

/// What runs once the service has started.
struct Started {
    pipeline: Pipeline,
    supervisor: Addr<KafkaSupervisor>,
    kafka_arbiter: Arbiter,
}

/// Migrations, the pool, the pipeline and the consumer. `None` if shutdown came first. Every
/// step that can fail runs before the actors start, or stops them again before returning its
/// error: an actor left to the runtime's teardown is first polled without a runtime, and panics.
async fn start(
    settings: &Settings,
    database: &Database,
    stats: &Arc<Stats>,
    readiness: &Readiness,
    mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<Started>, ServiceError> {
    if settings.database.migrate_on_start {
        readiness.starting("migrations not applied yet");
        tokio::select! {
            result = migrate_until_done(database, settings, readiness) => result?,
            _ = &mut shutdown => return Ok(None),
        }
    }

    readiness.starting("starting the pipeline and the Kafka consumer");
    let pool = database.pool(
        settings.database.pool_size,
        settings.database.connect_timeout(),
    );
    let publisher = if settings.dead_letter.topic.is_empty() {
        None
    } else {
        let publisher = DeadLetterPublisher::new(&settings.kafka, &settings.dead_letter.topic)?;
        info!(topic = %settings.dead_letter.topic, "dead letters are also published to a topic");
        Some(Arc::new(publisher))
    };
    let pipeline = Pipeline::start_with(&settings.pipeline, pool.clone(), stats.clone(), publisher);
    // One log of client errors for every client of the cluster the service makes.
    let client_errors = ClientErrorLog::new(settings.kafka.error_log_interval());
    let context = SupervisorContext::new(
        CommitterLink {
            revoke: pipeline.committer().clone().recipient(),
            lost: pipeline.committer().clone().recipient(),
        },
        settings.kafka.revoke_timeout(),
        stats.clone(),
        readiness.joined(),
    )
    .with_error_log(client_errors.clone())
    .with_group(
        settings.kafka.group_protocol,
        settings.kafka.is_static_member(),
    )
    .with_topic_watch(TopicWatchSettings {
        topics: settings.kafka.topics.clone(),
        interval: settings.kafka.metadata_refresh(),
        missing: readiness.missing_topics(),
    })
    .with_health(readiness.client_health())
    .with_done_lists(
        pipeline.committer().clone().recipient(),
        settings.kafka.commit_metadata_max_bytes as usize,
    );
    let budget = settings.pipeline.budget();
    let cluster = tokio::select! {
        cluster = cluster_to_size_for(settings, client_errors.clone()) => cluster,
        _ = &mut shutdown => {
            let _ = pipeline.drain(Duration::ZERO).await;
            pipeline.stop();
            return Ok(None);
        }
    };
    let brokers = cluster.brokers;
    let sizing = FetchSizing::new(
        &budget,
        brokers,
        settings.kafka.max_compression_ratio as usize,
    );
    info!(
        brokers,
        partitions = cluster.partitions,
        max_compression_ratio = sizing.ratio,
        fetch_max_bytes = sizing.fetch.max_bytes,
        partition_fetch_bytes = sizing.fetch.partition_bytes,
        queue_kbytes = budget.queue_kbytes,
        "fetch requests sized: a response from every broker, decompressed, fits the Kafka \
         client's share of pipeline.max_in_flight_bytes"
    );
    if let Some(needed) =
        sizing.budget_needed_for_batches(settings.pipeline.max_in_flight_bytes, budget.fetch_bytes)
    {
        warn!(
            brokers,
            max_in_flight_bytes = settings.pipeline.max_in_flight_bytes,
            needed,
            "pipeline.max_in_flight_bytes leaves the Kafka client too little for one record \
             batch from each broker (a fetch returns a partition's first batch whole, often a \
             megabyte decompressed): its prefetch may exceed its share; raise \
             pipeline.max_in_flight_bytes to the value named"
        );
    }
    let queue_kbytes = match settings.kafka.fetch_queue_kbytes {
        0 => budget.queue_kbytes,
        explicit => explicit as usize,
    };
    let partitions = cluster.partitions.max(1);
    let turns = Turns::plan(
        settings.pipeline.max_in_flight_bytes,
        sizing.client_bytes,
        (queue_kbytes / partitions).max(1) * 1024,
        partitions,
        sizing.ratio,
    );
    match turns {
        Ok(turns) => info!(
            partitions,
            partition_fetch_bytes = turns.partition_fetch_bytes(),
            "each partition has a queue of its own: partitions take turns while their \
             producers' record batches fit their share of the Kafka client's prefetch"
        ),
        Err(needed) => warn!(
            partitions,
            max_in_flight_bytes = settings.pipeline.max_in_flight_bytes,
            needed,
            "partitions are taken in the order they were fetched, not in turn: the Kafka \
             client's share of pipeline.max_in_flight_bytes leaves each partition less than \
             a few small record batches; under a slow database one partition's run is written \
             while the others wait. Raise pipeline.max_in_flight_bytes to the value named for \
             them to take turns"
        ),
    }
    let turns = turns.ok();
    crate::metrics::set_partitions_in_turn(turns.is_some());
    crate::metrics::set_partitions_in_fetch_order(0);
    let fetch = turns.map_or(sizing.fetch, |turns| turns.fetch(sizing.fetch));
    let context = context
        .with_sizing(SizingWatch::new(sizing))
        .with_turns(turns);
    let consumer = match kafka::subscribe(
        &settings.kafka,
        &budget,
        if turns.is_some() { partitions } else { 1 },
        &fetch,
        context,
    ) {
        Ok(consumer) => consumer,
        Err(err) => {
            // The round trip makes sure the committer has started (and stops it taking work);
            // then the writers' threads end.
            let _ = pipeline.drain(Duration::ZERO).await;
            pipeline.stop();
            return Err(err.into());
        }
    };
    // The check makes its client when a partition is assigned; one made now proves the
    // settings it needs at start-up.
    let traces = match TailReader::sharing(&settings.kafka, client_errors.clone()) {
        Ok(_) => Traces {
            check: Arc::new(
                TraceCheck::new(
                    settings.kafka.clone(),
                    // A connection of its own: the check never waits for the writers' pool, nor
                    // takes a connection a writer waits for.
                    database.pool(1, settings.database.connect_timeout()),
                    settings.pipeline.max_payload_bytes,
                )
                .with_client_errors(client_errors),
            ),
            group: Arc::from(settings.kafka.group_id.as_str()),
            behind: readiness.database_behind(),
        },
        Err(err) => {
            let _ = pipeline.drain(Duration::ZERO).await;
            pipeline.stop();
            return Err(err.into());
        }
    };
    let kafka_arbiter = Arbiter::new();
    let supervisor = {
        let pipeline = pipeline.clone();
        KafkaSupervisor::start_in_arbiter(&kafka_arbiter.handle(), move |_| {
            KafkaSupervisor::new(consumer, pipeline).with_trace_check(traces)
        })
    };
    pipeline.attach_kafka(supervisor.clone().recipient());
    readiness.running(pool, database.clone());
    Ok(Some(Started {
        pipeline,
        supervisor,
        kafka_arbiter,
    }))
}

/// How long start-up waits for the cluster to say how many brokers it has.
const CLUSTER_METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// The cluster to size the fetch requests for: its brokers and the configured topics'
/// partitions, as one metadata request per topic tells, or — when no broker answers within
/// [`CLUSTER_METADATA_TIMEOUT`] — the brokers listed in `kafka.brokers` and one partition (the
/// service then says so, and warns later if it finds more brokers).
async fn cluster_to_size_for(settings: &Settings, errors: ClientErrorLog) -> kafka::ClusterShape {
    let kafka = settings.kafka.clone();
    let asked = tokio::task::spawn_blocking(move || {
        kafka::cluster_shape(&kafka, CLUSTER_METADATA_TIMEOUT, errors)
    })
    .await;
    let listed = settings
        .kafka
        .brokers
        .split(',')
        .filter(|entry| !entry.trim().is_empty())
        .count()
        .max(1);
    let unknown = kafka::ClusterShape {
        brokers: listed,
        partitions: 1,
    };
    match asked {
        Ok(Ok(shape)) => kafka::ClusterShape {
            brokers: if shape.brokers > 0 {
                shape.brokers
            } else {
                listed
            },
            partitions: shape.partitions.max(1),
        },
        Ok(Err(err)) => {
            warn!(
                error = %err,
                listed,
                "the cluster did not say how many brokers it has: fetch requests sized for the \
                 brokers listed in kafka.brokers"
            );
            unknown
        }
        Err(err) => {
            warn!(error = %err, listed, "the cluster's metadata could not be asked for");
            unknown
        }
    }
}

/// Applies migrations, retrying while the database does not answer (it may start after us, or
/// restart under us). A migration the database itself rejects is retried a few times, then
/// stops the service: it will not go away by waiting.
async fn migrate_until_done(
    database: &Database,
    settings: &Settings,
    readiness: &Readiness,
) -> Result<(), ServiceError> {
    const REJECTIONS_TOLERATED: u32 = 3;
    let mut backoff = Backoff::new(
        settings.pipeline.retry_initial(),
        settings.pipeline.retry_max().max(Duration::from_secs(1)),
    );
    let mut rejections = 0;
    loop {
        let attempt =
            migrate::run_migrations_within(database, settings.database.migration_timeout());
        let err = match attempt.await {
            Ok(_) => return Ok(()),
            Err(err) => err,
        };
        if let StoreError::Migration(_) = err {
            rejections += 1;
            if rejections > REJECTIONS_TOLERATED {
                return Err(err.into());
            }
            readiness.starting(format!("migrations not applied: {err}"));
        } else {
            readiness.starting(format!(
                "migrations not applied: the database does not answer: {err}"
            ));
        }
        let delay = backoff.next_delay();
        warn!(
            error = %err,
            retry_in_ms = delay.as_millis() as u64,
            database = %database.target(),
            "migrations could not run; retrying"
        );
        actix_rt::time::sleep(delay).await;
    }
}

/// Completes on SIGINT, SIGTERM or SIGHUP: each asks for the same graceful stop. (SIGHUP does
/// not reload: configuration is read at start, and a restart is how it changes.)
pub async fn shutdown_signal() {
    shutdown_signals().requested.await
}

/// The process's stop signals: the stop is requested on SIGINT, SIGTERM or SIGHUP, and hurried
/// by a SIGTERM or SIGINT after that one (stop now: see [`Stop`]). Must be called inside a
/// runtime: a task listens from then on, so that no signal is missed between the two.
pub fn shutdown_signals()
-> Stop<impl Future<Output = ()> + Send + 'static, impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    let (first, first_seen) = tokio::sync::oneshot::channel::<()>();
    let (second, second_seen) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => info!("SIGTERM received"),
            _ = interrupt.recv() => info!("SIGINT received"),
            _ = hangup.recv() => info!("SIGHUP received"),
        }
        let _ = first.send(());
        tokio::select! {
            _ = terminate.recv() => info!("SIGTERM received again"),
            _ = interrupt.recv() => info!("SIGINT received again"),
        }
        let _ = second.send(());
    });
    // A dropped sender (the runtime ending) never completes the future.
    let wait = |seen: tokio::sync::oneshot::Receiver<()>| async move {
        if seen.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    Stop {
        requested: wait(first_seen),
        hurried: wait(second_seen),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let environment = pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        Settings::load_from(None, Some(environment))
    }

    fn invalid_key(result: Result<Settings, ConfigError>) -> &'static str {
        match result {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected an invalid key, got {other:?}"),
        }
    }

    #[test]
    fn loading_checks_the_database_settings_naming_the_key() {
        assert!(load(&[]).is_ok());
        assert_eq!(
            invalid_key(load(&[(
                "HISTORY__DATABASE__URL",
                "postgres://u:s3cr3tpw@h:notaport/db"
            )])),
            "database.url"
        );
        assert_eq!(
            invalid_key(load(&[(
                "HISTORY__DATABASE__PASSWORD_FILE",
                "/nonexistent/history-password"
            )])),
            "database.password_file"
        );
        // The plain values are still checked by the configuration layer.
        assert_eq!(
            invalid_key(load(&[("HISTORY__PIPELINE__WRITERS", "0")])),
            "pipeline.writers"
        );
    }
}
