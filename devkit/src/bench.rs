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
//!   process itself, from `/proc` (see [`super::cpu`]), for the drain and the server ceiling.
//! - **naive**: an in-order consumer doing one transaction per event and a synchronous offset
//!   commit after each — on a sample, since it is slow.
//! - **latency**: produce → row committed, at a fixed offered load below saturation, observed
//!   through a NOTIFY trigger on a database of its own.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use secrecy::ExposeSecret;

use super::DevError;
use super::broker::EmbeddedBroker;
use super::group::GroupInspector;
use super::workload::{self, PlannedRecord, WorkloadSpec};
use history_service::config::Settings;
use history_service::domain::{HistoryEvent, Outcome, process_history_batch, process_history_once};
use history_service::store::{Database, PgHistoryRepository, migrate, verify};

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
        }
    }
}

/// One throughput measurement.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rate {
    pub events: usize,
    pub elapsed: Duration,
}

impl Rate {
    pub fn per_second(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub options: BenchOptions,
    pub distinct_events: usize,
    pub service: Rate,
    pub ceiling: Rate,
    pub server_ceiling: Rate,
    /// CPU of PostgreSQL's backends serving the service during the drain.
    pub service_pg_cpu: PgCpu,
    /// CPU of the service process during the drain.
    pub service_cpu: Duration,
    /// CPU of PostgreSQL's backends serving the (client-side) ceiling.
    pub ceiling_pg_cpu: PgCpu,
    /// CPU of PostgreSQL's backends running the server ceiling.
    pub server_pg_cpu: PgCpu,
    pub naive: Rate,
    pub peak_rss_mb: f64,
    pub transactions: Transactions,
    pub latency: Latency,
    /// The service's database holds every distinct event once, consistently.
    pub verified: bool,
}

impl BenchReport {
    pub fn render(&self) -> String {
        let o = &self.options;
        let mut out = format!(
            "history-dev bench: {} records ({:.0}% duplicates, {} distinct events), {} partitions, {} writers, batches of {}\n",
            o.events,
            o.duplicates * 100.0,
            self.distinct_events,
            o.partitions,
            o.writers,
            o.batch
        );
        out.push_str("  phase      records   seconds    events/s\n");
        for (name, rate, note) in [
            (
                "service",
                self.service,
                "first fetch to final offset commit",
            ),
            (
                "ceiling",
                self.ceiling,
                "batched statement alone, no Kafka, no actors",
            ),
            (
                "server",
                self.server_ceiling,
                "set-based insert, keys generated in the database",
            ),
            (
                "naive",
                self.naive,
                "one transaction and one offset commit per event",
            ),
        ] {
            out.push_str(&format!(
                "  {name:<8} {:>9} {:>9.2} {:>11.0}   ({note})\n",
                rate.events,
                rate.elapsed.as_secs_f64(),
                rate.per_second()
            ));
        }
        out.push_str(&format!(
            "  service peak RSS {:.1} MB; database verified: {}\n",
            self.peak_rss_mb,
            if self.verified { "yes" } else { "NO" }
        ));
        out.push_str(&format!(
            "  CPU per event: the service {:.1} us while it drains; PostgreSQL {:.1} us while the \
             service drains, {:.1} us in the ceiling, {:.1} us in the server ceiling (of which \
             autovacuum {:.1}, {:.1}, {:.1} us)\n",
            self.service_us_per_event(),
            self.pg_us_per_event(),
            per_event_us(self.ceiling_pg_cpu.total, self.ceiling.events),
            self.server_pg_us_per_event(),
            per_event_us(self.service_pg_cpu.autovacuum, self.service.events),
            per_event_us(self.ceiling_pg_cpu.autovacuum, self.ceiling.events),
            per_event_us(self.server_pg_cpu.autovacuum, self.server_ceiling.events),
        ));
        out.push_str(&format!(
            "  service transactions: {}, {:.1} ms and {:.0} events each on average\n",
            self.transactions.count, self.transactions.mean_ms, self.transactions.mean_events
        ));
        out.push_str(&format!(
            "  latency (produce -> row committed) at {}/s for {} s: {} samples, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms\n",
            o.latency_rate,
            o.latency_seconds,
            self.latency.samples,
            self.latency.p50_ms,
            self.latency.p99_ms,
            self.latency.max_ms
        ));
        out.push_str(&self.result_line());
        out.push('\n');
        out
    }

    fn pg_us_per_event(&self) -> f64 {
        per_event_us(self.service_pg_cpu.total, self.service.events)
    }

    fn service_us_per_event(&self) -> f64 {
        per_event_us(self.service_cpu, self.service.events)
    }

    fn server_pg_us_per_event(&self) -> f64 {
        per_event_us(self.server_pg_cpu.total, self.server_ceiling.events)
    }

    /// The machine-readable summary, the last line of the output.
    pub fn result_line(&self) -> String {
        let (service, ceiling, naive, server) = (
            self.service.per_second(),
            self.ceiling.per_second(),
            self.naive.per_second(),
            self.server_ceiling.per_second(),
        );
        format!(
            "RESULT events={} service_eps={:.0} ceiling_eps={:.0} naive_eps={:.0} ceiling_ratio={:.2} naive_ratio={:.1} peak_rss_mb={:.1} p99_ms={:.1} \
             server_ceiling_eps={:.0} server_ratio={:.2} pg_us_per_event={:.1} service_us_per_event={:.1} server_pg_us_per_event={:.1}",
            self.options.events,
            service,
            ceiling,
            naive,
            service / ceiling.max(1e-9),
            service / naive.max(1e-9),
            self.peak_rss_mb,
            self.latency.p99_ms,
            server,
            service / server.max(1e-9),
            self.pg_us_per_event(),
            self.service_us_per_event(),
            self.server_pg_us_per_event()
        )
    }
}

/// PostgreSQL's CPU in a phase: every backend of the phase's database, and the part of it spent
/// by autovacuum workers (the tables grow by a million rows in a large run).
#[derive(Debug, Clone, Copy, Default)]
pub struct PgCpu {
    pub total: Duration,
    pub autovacuum: Duration,
}

fn per_event_us(cpu: Duration, events: usize) -> f64 {
    cpu.as_secs_f64() * 1e6 / events.max(1) as f64
}

const TOPIC: &str = "bench.tickets";
const LATENCY_TOPIC: &str = "bench.latency";

pub async fn run(settings: &Settings, options: &BenchOptions) -> Result<BenchReport, DevError> {
    let run_id = format!("{:08x}", rand::random::<u32>());
    let broker = EmbeddedBroker::start(1)?;
    broker.create_topic(TOPIC, options.partitions)?;
    broker.create_topic(LATENCY_TOPIC, 4)?;
    let brokers = broker.bootstrap_servers();
    let server = super::postgres::prepare(&settings.database.postgres_config()?).await?;
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
    let drain = measure_service(
        settings,
        options,
        &brokers,
        &server.config,
        &service_db,
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

    eprintln!("ceiling: the batched statement alone...");
    let ceiling_db = databases.create("ceiling").await?;
    let (ceiling, ceiling_pg_cpu) =
        measure_ceiling(&server_config, &ceiling_db, &records, options).await?;
    eprintln!(
        "  {:.0} events/s, PostgreSQL {:.1} us per event",
        ceiling.per_second(),
        per_event_us(ceiling_pg_cpu.total, ceiling.events)
    );

    eprintln!("server ceiling: a set-based insert with keys generated in the database...");
    let server_db = databases.create("server").await?;
    let (server_ceiling, server_pg_cpu) =
        measure_server_ceiling(&server_config, &server_db, options).await?;
    eprintln!(
        "  {:.0} events/s, PostgreSQL {:.1} us per event",
        server_ceiling.per_second(),
        per_event_us(server_pg_cpu.total, server_ceiling.events)
    );

    eprintln!("naive: one transaction and one offset commit per event...");
    let naive_db = databases.create("naive").await?;
    let naive = measure_naive(&naive_db, &brokers, options, &run_id).await?;
    eprintln!("  {:.0} events/s", naive.per_second());

    eprintln!(
        "latency: {} events/s for {} s...",
        options.latency_rate, options.latency_seconds
    );
    let latency_db = databases.create("latency").await?;
    let latency = measure_latency(settings, options, &brokers, &latency_db, &run_id).await?;
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

fn url_of(config: &tokio_postgres::Config, settings: &Settings) -> String {
    // The server's address with the benchmark's database; a password, if any, comes from the
    // configured URL and is passed on unchanged.
    let mut url = url::Url::parse(settings.database.url.expose_secret())
        .unwrap_or_else(|_| url::Url::parse("postgres://postgres@127.0.0.1:5432/x").unwrap());
    if let Some(tokio_postgres::config::Host::Tcp(host)) = config.get_hosts().first() {
        let _ = url.set_host(Some(host));
    }
    if let Some(port) = config.get_ports().first() {
        let _ = url.set_port(Some(*port));
    }
    url.set_path(config.get_dbname().unwrap_or("history"));
    url.to_string()
}

/// A `history-service run` child process with its stderr watched line by line.
struct ServiceChild {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    metrics_port: Option<u16>,
}

impl ServiceChild {
    fn spawn(env: Vec<(String, String)>) -> Result<Self, DevError> {
        let metrics_port = env
            .iter()
            .find(|(key, _)| key == "HISTORY__HTTP__LISTEN")
            .and_then(|(_, listen)| listen.rsplit_once(':')?.1.parse().ok());
        let exe = service_binary()?;
        let mut child = Command::new(exe)
            .arg("run")
            .envs(env)
            .env_remove("HISTORY_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| DevError::Bench(format!("cannot start the service: {err}")))?;
        let stderr = child.stderr.take().expect("piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push((Instant::now(), line));
            }
        });
        Ok(ServiceChild {
            child,
            lines,
            metrics_port,
        })
    }

    /// When a line containing `needle` was logged, if it was.
    fn seen(&self, needle: &str) -> Option<Instant> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|(_, line)| line.contains(needle))
            .map(|(at, _)| *at)
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    fn log_tail(&self) -> String {
        let lines = self.lines.lock().unwrap();
        let start = lines.len().saturating_sub(20);
        lines[start..]
            .iter()
            .map(|(_, line)| line.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The service's own account of its transactions, from its /metrics.
    fn transactions(&self) -> Transactions {
        let Some(port) = self.metrics_port else {
            return Transactions::default();
        };
        let text = super::probe::get(port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        let value = |series: &str| super::probe::sample(&text, series).unwrap_or(0.0);
        let count = value("history_transaction_seconds_count");
        Transactions {
            count: count as u64,
            mean_ms: value("history_transaction_seconds_sum") / count.max(1.0) * 1e3,
            mean_events: value("history_batch_events_sum") / count.max(1.0),
        }
    }

    /// Peak resident set size so far, in MB (VmHWM).
    fn peak_rss_mb(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|status| {
                status.lines().find_map(|line| {
                    let kb = line.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?;
                    kb.trim().parse::<f64>().ok()
                })
            })
            .map_or(0.0, |kb| kb / 1024.0)
    }

    fn stop(mut self) {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.exited() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_or(0, |addr| addr.port())
}

fn service_env(
    settings: &Settings,
    options: &BenchOptions,
    brokers: &str,
    database: &tokio_postgres::Config,
    group: &str,
    topic: &str,
) -> Vec<(String, String)> {
    [
        ("HISTORY__DATABASE__URL", url_of(database, settings)),
        ("HISTORY__KAFKA__BROKERS", brokers.to_owned()),
        ("HISTORY__KAFKA__GROUP_ID", group.to_owned()),
        ("HISTORY__KAFKA__TOPICS", topic.to_owned()),
        ("HISTORY__PIPELINE__WRITERS", options.writers.to_string()),
        (
            "HISTORY__DATABASE__POOL_SIZE",
            (options.writers + 2)
                .max(settings.database.pool_size as usize)
                .to_string(),
        ),
        (
            "HISTORY__PIPELINE__BATCH_MAX_EVENTS",
            options.batch.to_string(),
        ),
        // Frequent commits so the final one follows the last write closely.
        ("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "50".to_owned()),
        // The embedded broker holds an empty fetch for the whole wait even when records arrive
        // (Kafka answers at once), so a short wait keeps it from dominating the latency.
        ("HISTORY__KAFKA__FETCH_WAIT_MAX_MS", "5".to_owned()),
        (
            "HISTORY__HTTP__LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        ("HISTORY__LOG__FORMAT", "human".to_owned()),
        ("HISTORY__LOG__FILTER", "info".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// What the drain came to.
struct Drain {
    rate: Rate,
    peak_rss_mb: f64,
    transactions: Transactions,
    /// CPU of PostgreSQL's backends serving the service's database, first fetch to the end.
    pg_cpu: PgCpu,
    /// CPU of the service process, first fetch to the end.
    service_cpu: Duration,
}

/// The backends connected to one database, found through `pg_stat_activity` from a session on
/// another database (so the observer is not among them).
struct Backends {
    admin: tokio_postgres::Client,
    database: String,
    autovacuum: std::collections::HashSet<u32>,
}

impl Backends {
    async fn connect(
        server: &tokio_postgres::Config,
        database: &tokio_postgres::Config,
    ) -> Result<Self, DevError> {
        let mut admin = server.clone();
        admin.dbname("postgres");
        Ok(Backends {
            admin: Database::plain(admin).connect().await?,
            database: database.get_dbname().unwrap_or_default().to_owned(),
            autovacuum: Default::default(),
        })
    }

    /// The backends' CPU ticks now (none if the server cannot be seen from here).
    async fn ticks(&mut self) -> Vec<(u32, u64)> {
        let rows = self
            .admin
            .query(
                "SELECT pid, backend_type FROM pg_stat_activity WHERE datname = $1",
                &[&self.database],
            )
            .await
            .unwrap_or_default();
        let mut pids = Vec::with_capacity(rows.len());
        for row in rows {
            let pid = row.get::<_, i32>(0) as u32;
            if row
                .get::<_, Option<&str>>(1)
                .is_some_and(|kind| kind.starts_with("autovacuum"))
            {
                self.autovacuum.insert(pid);
            }
            pids.push(pid);
        }
        super::cpu::read_ticks(pids)
    }

    fn cpu(&self, tally: &super::cpu::CpuTally) -> PgCpu {
        PgCpu {
            total: tally.spent(),
            autovacuum: tally.spent_by(|pid| self.autovacuum.contains(&pid)),
        }
    }

    /// Runs `work`, sampling the backends' CPU meanwhile (backends come and go: autovacuum
    /// workers, lazily connected pools).
    async fn during<F: std::future::Future>(&mut self, work: F) -> (F::Output, PgCpu) {
        let mut tally = super::cpu::CpuTally::start(self.ticks().await);
        futures::pin_mut!(work);
        loop {
            tokio::select! {
                output = &mut work => {
                    tally.record(self.ticks().await);
                    return (output, self.cpu(&tally));
                }
                _ = actix_rt::time::sleep(Duration::from_millis(20)) => {
                    tally.record(self.ticks().await);
                }
            }
        }
    }
}

async fn measure_service(
    settings: &Settings,
    options: &BenchOptions,
    brokers: &str,
    server: &tokio_postgres::Config,
    database: &tokio_postgres::Config,
    ends: &[i64],
    run_id: &str,
) -> Result<Drain, DevError> {
    use super::cpu::{CpuTally, process_ticks};
    let group = format!("bench-service-{run_id}");
    let mut backends = Backends::connect(server, database).await?;
    let mut child = ServiceChild::spawn(service_env(
        settings, options, brokers, database, &group, TOPIC,
    ))?;
    let inspector = GroupInspector::new(brokers, &group)?;
    let deadline = Instant::now() + options.timeout;
    let expected: Vec<Option<i64>> = ends.iter().map(|&e| (e > 0).then_some(e)).collect();
    let mut peak = 0.0f64;
    // Both tallies start when the first fetch is seen: the start-up (migrations, joining the
    // group) is not the drain. Backends connected later count whole.
    let mut pg_cpu: Option<CpuTally> = None;
    let mut service_cpu: Option<CpuTally> = None;
    let child_pid = child.child.id();
    let finished = loop {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
        peak = peak.max(child.peak_rss_mb());
        let backend_ticks = backends.ticks().await;
        let child_ticks = process_ticks(child_pid).map(|ticks| (child_pid, ticks));
        match (&mut pg_cpu, &mut service_cpu) {
            (Some(pg), Some(service)) => {
                pg.record(backend_ticks);
                service.record(child_ticks);
            }
            _ if child.seen("first records fetched").is_some() => {
                pg_cpu = Some(CpuTally::start(backend_ticks));
                service_cpu = Some(CpuTally::start(child_ticks));
            }
            _ => {}
        }
        if child.exited() || Instant::now() > deadline {
            let tail = child.log_tail();
            child.stop();
            return Err(DevError::Bench(format!(
                "the service did not drain the backlog:\n{tail}"
            )));
        }
        let committed = inspector.committed(TOPIC, options.partitions, Duration::from_secs(2));
        if committed.ok().as_ref() == Some(&expected) {
            break Instant::now();
        }
    };
    peak = peak.max(child.peak_rss_mb());
    let started = child
        .seen("first records fetched")
        .ok_or_else(|| DevError::Bench("the service never logged its first fetch".into()))?;
    let transactions = child.transactions();
    let pg_cpu = pg_cpu.map_or_else(PgCpu::default, |tally| backends.cpu(&tally));
    let service_cpu = service_cpu.map_or(Duration::ZERO, |tally| tally.spent());
    child.stop();
    Ok(Drain {
        rate: Rate {
            events: options.events,
            elapsed: finished - started,
        },
        peak_rss_mb: peak,
        transactions,
        pg_cpu,
        service_cpu,
    })
}

/// The statement of the server-side ceiling: `$1` events with random keys, generated in the
/// database (real event ids are random), claimed in the inbox and recorded in one statement.
const SERVER_CEILING_STATEMENT: &str = "\
    WITH i AS (INSERT INTO inbox (event_id) \
               SELECT 'ev-' || md5(random()::text) FROM generate_series(1, $1::int) \
               ON CONFLICT (event_id) DO NOTHING RETURNING event_id) \
    INSERT INTO history_events \
    SELECT event_id, 'ticket-1', 'open', 'resolved', '2026-10-03T08:00:00Z' FROM i";

/// The server-side ceiling: `options.writers` connections insert `options.events` events in
/// total, `options.batch` per transaction. Returns the rate and the CPU of the backends.
async fn measure_server_ceiling(
    server: &tokio_postgres::Config,
    database: &tokio_postgres::Config,
    options: &BenchOptions,
) -> Result<(Rate, PgCpu), DevError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let db = Database::plain(database.clone());
    let mut client = db.connect().await?;
    migrate::run_migrations(&mut client).await?;
    drop(client);
    let mut clients = Vec::with_capacity(options.writers);
    for _ in 0..options.writers.max(1) {
        clients.push(db.connect().await?);
    }
    let mut backends = Backends::connect(server, database).await?;
    let remaining = Arc::new(AtomicUsize::new(options.events));
    let batch = options.batch.max(1);
    let started = Instant::now();
    let workers: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let remaining = remaining.clone();
            tokio::spawn(async move {
                let statement = client.prepare(SERVER_CEILING_STATEMENT).await?;
                let mut inserted = 0usize;
                loop {
                    let claimed = remaining
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                            left.checked_sub(batch.min(left)).filter(|_| left > 0)
                        })
                        .map_or(0, |left| batch.min(left));
                    if claimed == 0 {
                        return Ok::<usize, tokio_postgres::Error>(inserted);
                    }
                    client.batch_execute("BEGIN").await?;
                    let count = client.execute(&statement, &[&(claimed as i32)]).await?;
                    client.batch_execute("COMMIT").await?;
                    inserted += count as usize;
                }
            })
        })
        .collect();
    let (inserted, cpu) = backends
        .during(async {
            let mut inserted = 0;
            for worker in workers {
                inserted += worker
                    .await
                    .expect("server ceiling worker")
                    .map_err(history_service::store::StoreError::from)?;
            }
            Ok::<usize, DevError>(inserted)
        })
        .await;
    Ok((
        Rate {
            events: inserted?,
            elapsed: started.elapsed(),
        },
        cpu,
    ))
}

async fn measure_ceiling(
    server: &tokio_postgres::Config,
    database: &tokio_postgres::Config,
    records: &[PlannedRecord],
    options: &BenchOptions,
) -> Result<(Rate, PgCpu), DevError> {
    let db = Database::plain(database.clone());
    let mut client = db.connect().await?;
    migrate::run_migrations(&mut client).await?;
    let events: Vec<HistoryEvent> = records
        .iter()
        .filter_map(|r| HistoryEvent::decode(r.payload.as_deref(), usize::MAX).ok())
        .collect();
    let batch = options.batch;
    let writers = options.writers;
    let pool = db.pool(writers as u32, Duration::from_secs(10));
    // Warm the connections (and their prepared statements) outside the measurement.
    {
        let mut warm = Vec::new();
        for _ in 0..writers {
            let mut conn = pool.get_owned().await?;
            conn.statements()
                .await
                .map_err(history_service::store::StoreError::from)?;
            warm.push(conn);
        }
    }
    let events = Arc::new(events);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut backends = Backends::connect(server, database).await?;
    let started = Instant::now();
    let workers: Vec<_> = (0..writers)
        .map(|_| {
            let (events, next, pool) = (events.clone(), next.clone(), pool.clone());
            tokio::spawn(async move {
                let repository = PgHistoryRepository::new(pool);
                loop {
                    let start = next.fetch_add(batch, std::sync::atomic::Ordering::Relaxed);
                    if start >= events.len() {
                        return Ok::<(), history_service::store::StoreError>(());
                    }
                    let end = (start + batch).min(events.len());
                    let refs: Vec<&HistoryEvent> = events[start..end].iter().collect();
                    process_history_batch(&repository, &refs).await?;
                }
            })
        })
        .collect();
    let (done, cpu) = backends
        .during(async {
            for worker in workers {
                worker.await.expect("ceiling worker")?;
            }
            Ok::<(), history_service::store::StoreError>(())
        })
        .await;
    done?;
    Ok((
        Rate {
            events: records.len(),
            elapsed: started.elapsed(),
        },
        cpu,
    ))
}

async fn measure_naive(
    database: &tokio_postgres::Config,
    brokers: &str,
    options: &BenchOptions,
    run_id: &str,
) -> Result<Rate, DevError> {
    let db = Database::plain(database.clone());
    let mut client = db.connect().await?;
    migrate::run_migrations(&mut client).await?;
    let repository = PgHistoryRepository::new(db.pool(1, Duration::from_secs(10)));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("bench-naive-{run_id}"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[TOPIC])?;
    let limit = options.naive_events.min(options.events);
    let mut processed = 0;
    let mut started = None;
    let deadline = Instant::now() + options.timeout;
    while processed < limit {
        if Instant::now() > deadline {
            return Err(DevError::Bench("the naive consumer stalled".into()));
        }
        // A short poll: this is the naive consumer's own thread of control.
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message?;
        started.get_or_insert_with(Instant::now);
        if let Ok(event) = HistoryEvent::decode(message.payload(), usize::MAX) {
            if let Outcome::Unknown(err) = process_history_once(&repository, &event).await {
                return Err(err.into());
            }
        }
        consumer.commit_message(&message, CommitMode::Sync)?;
        processed += 1;
    }
    Ok(Rate {
        events: processed,
        elapsed: started.map_or(Duration::ZERO, |s| s.elapsed()),
    })
}

async fn measure_latency(
    settings: &Settings,
    options: &BenchOptions,
    brokers: &str,
    database: &tokio_postgres::Config,
    run_id: &str,
) -> Result<Latency, DevError> {
    let db = Database::plain(database.clone());
    let mut client = db.connect().await?;
    migrate::run_migrations(&mut client).await?;
    // The benchmark's probe, not part of the product's schema: every committed history row
    // notifies its event_id.
    client
        .batch_execute(
            "CREATE FUNCTION bench_notify() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_notify('history_bench', NEW.event_id); RETURN NULL; END $$;
             CREATE TRIGGER bench_notify AFTER INSERT ON history_events
             FOR EACH ROW EXECUTE FUNCTION bench_notify();",
        )
        .await
        .map_err(history_service::store::StoreError::from)?;
    let committed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let listener = listen(database, committed.clone()).await?;

    let group = format!("bench-latency-{run_id}");
    let mut child = ServiceChild::spawn(service_env(
        settings,
        options,
        brokers,
        database,
        &group,
        LATENCY_TOPIC,
    ))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.seen("partitions assigned").is_none() {
        if child.exited() || Instant::now() > deadline {
            let tail = child.log_tail();
            child.stop();
            return Err(DevError::Bench(format!(
                "the service did not join:\n{tail}"
            )));
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }

    let total = options.latency_rate as usize * options.latency_seconds as usize;
    let sent = {
        let (brokers, rate, run_id) = (brokers.to_owned(), options.latency_rate, run_id.to_owned());
        tokio::task::spawn_blocking(move || produce_paced(&brokers, &run_id, total, rate))
            .await
            .expect("latency producer")?
    };
    let wait_until = Instant::now() + Duration::from_secs(30);
    while committed.lock().unwrap().len() < total && Instant::now() < wait_until {
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    child.stop();
    listener.abort();

    let committed = committed.lock().unwrap();
    // The first second warms up connections and caches; it is not the steady state.
    let warm_up = options.latency_rate as usize;
    let mut latencies: Vec<f64> = sent
        .iter()
        .skip(warm_up.min(sent.len() / 2))
        .filter_map(|(id, at)| {
            committed
                .get(id)
                .map(|done| (*done - *at).as_secs_f64() * 1e3)
        })
        .collect();
    if latencies.is_empty() {
        return Err(DevError::Bench("no latency sample arrived".into()));
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    Ok(Latency {
        samples: latencies.len(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        max_ms: *latencies.last().unwrap(),
    })
}

/// LISTENs for the probe's notifications, recording when each event's row was committed.
async fn listen(
    database: &tokio_postgres::Config,
    committed: Arc<Mutex<HashMap<String, Instant>>>,
) -> Result<tokio::task::JoinHandle<()>, DevError> {
    let (client, mut connection) = database
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(history_service::store::StoreError::from)?;
    let handle = tokio::spawn(async move {
        let client = client;
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        let listening = client.batch_execute("LISTEN history_bench");
        futures::pin_mut!(listening);
        let mut listening = Some(listening);
        loop {
            if let Some(pending) = listening.as_mut() {
                tokio::select! {
                    _ = pending => listening = None,
                    message = futures::StreamExt::next(&mut messages) => {
                        if !record(message, &committed) { return; }
                    }
                }
            } else {
                let message = futures::StreamExt::next(&mut messages).await;
                if !record(message, &committed) {
                    return;
                }
            }
        }
    });
    // Give LISTEN a moment to be registered before anything is produced.
    actix_rt::time::sleep(Duration::from_millis(200)).await;
    Ok(handle)
}

fn record(
    message: Option<Result<tokio_postgres::AsyncMessage, tokio_postgres::Error>>,
    committed: &Mutex<HashMap<String, Instant>>,
) -> bool {
    match message {
        Some(Ok(tokio_postgres::AsyncMessage::Notification(note))) => {
            committed
                .lock()
                .unwrap()
                .insert(note.payload().to_owned(), Instant::now());
            true
        }
        Some(Ok(_)) => true,
        _ => false,
    }
}

/// Produces `total` events at `rate` per second; returns each event's id and send time.
fn produce_paced(
    brokers: &str,
    run_id: &str,
    total: usize,
    rate: u32,
) -> Result<Vec<(String, Instant)>, DevError> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "1")
        .create()?;
    let started = Instant::now();
    let mut sent = Vec::with_capacity(total);
    for n in 0..total {
        let due = started + Duration::from_secs_f64(n as f64 / f64::from(rate));
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let event_id = format!("latency-{run_id}-{n}");
        let ticket = format!("ticket-{}", n % 1000);
        let payload =
            workload::event_payload(&event_id, &ticket, "open", "closed", chrono::Utc::now());
        let record = BaseRecord::<[u8], [u8]>::to(LATENCY_TOPIC)
            .key(ticket.as_bytes())
            .payload(&payload);
        let at = Instant::now();
        producer
            .send(record)
            .map_err(|(err, _)| DevError::Kafka(err))?;
        sent.push((event_id, at));
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(sent)
}

/// What the service's writers did during the drain.
#[derive(Debug, Clone, Copy, Default)]
pub struct Transactions {
    pub count: u64,
    pub mean_ms: f64,
    pub mean_events: f64,
}

/// The production binary the benchmark drives: `history-service`, beside `history-dev` (both
/// built by `cargo build --release --workspace`), or the path in `HISTORY_SERVICE_BIN`.
fn service_binary() -> Result<std::path::PathBuf, DevError> {
    if let Some(path) = std::env::var_os("HISTORY_SERVICE_BIN") {
        return Ok(path.into());
    }
    let me = std::env::current_exe()
        .map_err(|err| DevError::Bench(format!("cannot find my own binary: {err}")))?;
    let beside = me.with_file_name("history-service");
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(DevError::Bench(format!(
            "{} not found: build both binaries with `cargo build --release --workspace` (or \
             set HISTORY_SERVICE_BIN)",
            beside.display()
        )))
    }
}
