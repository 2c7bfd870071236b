//! `history-dev bench`: how fast the service drains a backlog, against what PostgreSQL
//! itself allows and against what a naive consumer does, on the same generated records.
//!
//! - **service**: the real binary (`run`, a child process) drains a backlog from the embedded
//!   broker; timed from its first fetch to the group's final offset commit covering every record.
//!   Its peak resident memory is read from `/proc`.
//! - **ceiling**: the same rows written to a fresh database by the batched statement alone, with
//!   as many connections as the service has writers: no Kafka, no actors.
//! - **server ceiling**: what PostgreSQL does with no client in the way — the same number of
//!   events inserted by a set-based statement with keys generated in the database, in
//!   transactions of a batch each, on as many connections.
//! - **CPU per event**: PostgreSQL's backends serving the service's database and the service
//!   process itself, from `/proc` (see [`crate::cpu`]), for the drain and the server ceiling.
//! - **naive**: an in-order consumer doing one transaction per event and a synchronous offset
//!   commit after each — on a sample, since it is slow.
//! - **latency**: produce → row committed, at a fixed offered load below saturation, observed
//!   through a NOTIFY trigger on a database of its own.
//!
//! Two other runs measure one thing each: [`shapes`] (`--partitions 1,3,…`) and [`fairness`]
//! (`--fairness`).

mod backends;
mod child;
pub mod fairness;
pub mod floor;
mod latency;
mod phases;
mod report;
pub mod shapes;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::DevError;
use crate::broker::EmbeddedBroker;
use crate::group::GroupInspector;
use crate::workload::{self, WorkloadSpec};
use history_service::config::Settings;
use history_service::store::{Database, migrate, verify};

pub use floor::Floors;
pub use report::{BenchReport, Latency, PgCpu, Rate, Transactions};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub events: usize,
    pub partitions: i32,
    pub duplicates: f64,
    pub writers: usize,
    pub batch: usize,
    /// Records the naive consumer processes (its rate is measured on this sample).
    pub naive_events: usize,
    /// Offered load of the latency phase, events per second.
    pub latency_rate: u32,
    pub latency_seconds: u64,
    /// Keep the benchmark's databases instead of dropping them.
    pub keep_databases: bool,
    /// Give up on a phase after this long.
    pub timeout: Duration,
    /// The fairness phase's backlog producer's `batch.size` (librdkafka's default, 1 MB, when
    /// `None`): how many records of one partition a fetch response brings at once.
    pub producer_batch_bytes: Option<usize>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            events: 100_000,
            partitions: 24,
            duplicates: 0.1,
            writers: 2,
            batch: 1000,
            naive_events: 2000,
            latency_rate: 2000,
            latency_seconds: 10,
            keep_databases: false,
            timeout: Duration::from_secs(600),
            producer_batch_bytes: None,
        }
    }
}

const TOPIC: &str = "bench.tickets";
const LATENCY_TOPIC: &str = "bench.latency";

pub async fn run(settings: &Settings, options: &BenchOptions) -> Result<BenchReport, DevError> {
    let run_id = format!("{:08x}", rand::random::<u32>());
    let broker = EmbeddedBroker::start(1)?;
    broker.create_topic(TOPIC, options.partitions)?;
    broker.create_topic(LATENCY_TOPIC, 4)?;
    let brokers = broker.bootstrap_servers();
    let server = crate::postgres::prepare(&settings.database.postgres_config()?).await?;
    let databases = BenchDatabases::new(&server.config, &run_id, options.keep_databases);

    let records = workload::generate(&WorkloadSpec {
        records: options.events,
        duplicates: options.duplicates,
        poison: 0.0,
        partitions: options.partitions,
        id_prefix: format!("bench-{run_id}"),
        tickets: 10_000,
        max_payload_bytes: settings.pipeline.max_payload_bytes,
        seed: 42,
    });
    let distinct_events = workload::distinct_events(&records);
    eprintln!(
        "producing {} records to {TOPIC} ({} partitions)...",
        records.len(),
        options.partitions
    );
    let produce_started = Instant::now();
    let produce = {
        let (brokers, records) = (brokers.clone(), records.clone());
        tokio::task::spawn_blocking(move || workload::produce(&brokers, TOPIC, &records))
    };
    produce.await.expect("producer thread")?;
    eprintln!("  produced in {:.1?}", produce_started.elapsed());
    let inspector = GroupInspector::new(&brokers, "bench-inspector")?;
    check_retention(&inspector, options)?;
    let ends = inspector.ends(TOPIC, options.partitions, Duration::from_secs(10))?;

    eprintln!("service: draining the backlog with `history-service run`...");
    let service_db = databases.create("service").await?;
    let server_config = server.config.clone();
    let drain = phases::measure_service(
        settings,
        options,
        &brokers,
        &server.config,
        &service_db,
        TOPIC,
        &ends,
        &run_id,
    )
    .await?;
    let (service, peak_rss_mb, transactions) = (drain.rate, drain.peak_rss_mb, drain.transactions);
    let verified = {
        let client = Database::plain(service_db.clone()).connect().await?;
        let report = verify::verify(&client, 5).await?;
        report.is_consistent() && report.history_rows == distinct_events as i64
    };
    eprintln!(
        "  {:.0} events/s, peak RSS {peak_rss_mb:.1} MB",
        service.per_second()
    );

    eprintln!("floor: the same records consumed, copied (and decoded) by a bare poll loop...");
    let floors = floor::measure(
        &brokers,
        TOPIC,
        records.len(),
        &run_id,
        settings.pipeline.max_payload_bytes,
    )
    .await?;
    eprintln!(
        "  {:.2} us per event consumed, {:.2} us consumed and decoded",
        floors.consume_us, floors.decode_us
    );

    eprintln!("ceiling: the batched statement alone...");
    let ceiling_db = databases.create("ceiling").await?;
    let (ceiling, ceiling_pg_cpu) =
        phases::measure_ceiling(&server_config, &ceiling_db, &records, options).await?;
    eprintln!(
        "  {:.0} events/s, PostgreSQL {:.1} us per event",
        ceiling.per_second(),
        report::per_event_us(ceiling_pg_cpu.total, ceiling.events)
    );

    eprintln!("server ceiling: a set-based insert with keys generated in the database...");
    let server_db = databases.create("server").await?;
    let (server_ceiling, server_pg_cpu) =
        phases::measure_server_ceiling(&server_config, &server_db, options).await?;
    eprintln!(
        "  {:.0} events/s, PostgreSQL {:.1} us per event",
        server_ceiling.per_second(),
        report::per_event_us(server_pg_cpu.total, server_ceiling.events)
    );

    eprintln!("naive: one transaction and one offset commit per event...");
    let naive_db = databases.create("naive").await?;
    let naive = phases::measure_naive(&naive_db, &brokers, options, &run_id).await?;
    eprintln!("  {:.0} events/s", naive.per_second());

    eprintln!(
        "latency: {} events/s for {} s...",
        options.latency_rate, options.latency_seconds
    );
    let latency_db = databases.create("latency").await?;
    let latency =
        latency::measure_latency(settings, options, &brokers, &latency_db, &run_id).await?;
    eprintln!(
        "  p50 {:.1} ms, p99 {:.1} ms",
        latency.p50_ms, latency.p99_ms
    );

    databases.drop_all().await;
    drop(server);
    Ok(BenchReport {
        options: options.clone(),
        distinct_events,
        service,
        ceiling,
        server_ceiling,
        service_pg_cpu: drain.pg_cpu,
        service_cpu: drain.service_cpu,
        floors,
        ceiling_pg_cpu,
        server_pg_cpu,
        naive,
        peak_rss_mb,
        transactions,
        latency,
        verified,
    })
}

/// The mock broker keeps at most 5 MiB per partition: a backlog must fit, or the benchmark
/// would silently measure fewer records.
fn check_retention(inspector: &GroupInspector, options: &BenchOptions) -> Result<(), DevError> {
    for partition in 0..options.partitions {
        let (low, _) = inspector.watermarks(TOPIC, partition, Duration::from_secs(5))?;
        if low > 0 {
            return Err(DevError::Bench(format!(
                "partition {partition} dropped its first {low} records (the embedded broker keeps \
                 5 MiB per partition): use more --partitions"
            )));
        }
    }
    Ok(())
}

/// The benchmark's own databases on the configured server, dropped at the end.
struct BenchDatabases {
    server: tokio_postgres::Config,
    run_id: String,
    keep: bool,
    created: Mutex<Vec<String>>,
}

impl BenchDatabases {
    fn new(server: &tokio_postgres::Config, run_id: &str, keep: bool) -> Self {
        BenchDatabases {
            server: server.clone(),
            run_id: run_id.to_owned(),
            keep,
            created: Mutex::new(Vec::new()),
        }
    }

    /// A fresh database; the server is checkpointed first, so that no phase pays for the
    /// dirty pages of the one before.
    async fn create(&self, purpose: &str) -> Result<tokio_postgres::Config, DevError> {
        let name = format!("history_bench_{}_{purpose}", self.run_id);
        let mut config = self.server.clone();
        config.dbname(&name);
        migrate::create_database_if_missing(&Database::plain(config.clone())).await?;
        self.created.lock().unwrap().push(name);
        if let Ok(client) = Database::plain(config.clone()).connect().await {
            // Needs a superuser or pg_checkpoint; without it the phases just share the noise.
            let _ = client.batch_execute("CHECKPOINT").await;
        }
        Ok(config)
    }

    async fn drop_all(&self) {
        let names = std::mem::take(&mut *self.created.lock().unwrap());
        if self.keep {
            eprintln!("kept databases: {}", names.join(", "));
            return;
        }
        let mut admin = self.server.clone();
        admin.dbname("postgres");
        if let Ok(client) = Database::plain(admin).connect().await {
            for name in names {
                let _ = client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await;
            }
        }
    }
}
