//! The chaos harness: the real `history-service` binary as child processes, `history-dev dev-kafka` as the
//! broker (faults injected through its standard input), a PostgreSQL cluster of the test's own
//! (restarted at will), a seeded schedule of faults, and checks made from outside.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use history_devkit::group::GroupInspector;
use history_devkit::postgres::ThrowawayCluster;
use history_devkit::workload::{self, PlannedRecord, RecordKind, WorkloadSpec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rdkafka::producer::{Producer, ThreadedProducer};

pub const TOPIC: &str = "tickets.status.v1";
pub const GROUP: &str = "history-chaos";
pub const PARTITIONS: i32 = 6;
/// The share of the run during which records are produced; the rest lets the service catch up.
pub const PRODUCTION_SHARE: f64 = 0.7;
/// The instances' `pipeline.max_payload_bytes`.
const MAX_PAYLOAD: usize = 4096;

/// How big a run is: the short mode runs in CI, the long one by `scripts/chaos.sh`.
pub struct Scale {
    pub records: usize,
    pub duration: Duration,
}

impl Scale {
    /// From HISTORY_CHAOS_RECORDS (default 3,000) and HISTORY_CHAOS_SECONDS (default 30).
    pub fn from_env() -> Scale {
        let number = |key: &str, default: u64| {
            std::env::var(key)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        Scale {
            records: number("HISTORY_CHAOS_RECORDS", 3000) as usize,
            duration: Duration::from_secs(number("HISTORY_CHAOS_SECONDS", 30)),
        }
    }
}

/// The seed of a run: HISTORY_CHAOS_SEED replays a run; otherwise a fresh one, printed.
pub fn seed() -> u64 {
    let seed = std::env::var("HISTORY_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("chaos seed: {seed} (HISTORY_CHAOS_SEED={seed} replays this schedule)");
    seed
}

/// Something the schedule does at a moment of the run.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Kill(usize),
    Start(usize),
    RestartPostgres,
    TerminateBackends,
    /// A line for `dev-kafka`'s fault channel.
    Broker(String),
}

/// A seeded schedule: the same seed gives the same actions at the same offsets.
pub fn schedule(
    seed: u64,
    duration: Duration,
    instances: usize,
    kills: usize,
) -> Vec<(Duration, Action)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut plan = Vec::new();
    // Kills spread over the first 85% of the run, each followed by a restart 0.3-2 s later.
    let slot = duration.mul_f64(0.85) / kills.max(1) as u32;
    for k in 0..kills {
        let kill_at = slot * k as u32 + slot.mul_f64(rng.random_range(0.2..0.7));
        let instance = k % instances;
        plan.push((kill_at, Action::Kill(instance)));
        let restart_after = Duration::from_millis(rng.random_range(300..2000));
        plan.push((kill_at + restart_after, Action::Start(instance)));
    }
    let mut at = |from: f64, to: f64| duration.mul_f64(rng.random_range(from..to));
    plan.push((at(0.3, 0.6), Action::RestartPostgres));
    // Sessions cut about every three seconds: each may land inside a transaction.
    let terminations = (duration.as_secs() / 3).max(2);
    for _ in 0..terminations {
        plan.push((at(0.05, 0.85), Action::TerminateBackends));
    }
    let down_at = at(0.15, 0.7);
    let up_after = at(0.03, 0.08);
    let broker = 1 + (seed % 3) as i32;
    plan.push((down_at, Action::Broker(format!("broker-down {broker}"))));
    plan.push((
        down_at + up_after,
        Action::Broker(format!("broker-up {broker}")),
    ));
    for (api, error) in [
        ("fetch", "transport"),
        ("offset-commit", "coordinator-not-available"),
        ("heartbeat", "rebalance-in-progress"),
        // The coordinator forgets the member: librdkafka declares the assignment lost.
        ("heartbeat", "unknown-member"),
        ("fetch", "not-leader"),
    ] {
        let count = 1 + (seed as usize + api.len()) % 4;
        plan.push((
            at(0.05, 0.85),
            Action::Broker(format!("request-errors {api} {count} {error}")),
        ));
    }
    plan.sort_by_key(|(when, _)| *when);
    plan
}

/// What happened, for the report.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    pub records: usize,
    pub distinct_events: usize,
    pub duplicates: usize,
    pub poison: usize,
    pub kills: usize,
    pub starts: usize,
    pub postgres_restarts: usize,
    pub backend_terminations: usize,
    pub broker_faults: usize,
    pub rebalances: usize,
    /// Assignments the service reported lost (no clean revoke, nothing committed).
    pub assignments_lost: usize,
    /// Commits checked against the database (every record before them was durable first).
    pub commits_checked: usize,
    /// Commits at or below a position already checked: covered by that check, not checked again.
    pub commits_covered: usize,
    pub lost: usize,
    pub doubled: usize,
    pub violations: Vec<String>,
    /// Each instance's /metrics just before the final stop.
    pub final_metrics: Vec<String>,
}

impl Figures {
    pub fn render(&self, seed: u64, elapsed: Duration) -> String {
        format!(
            "chaos run: seed {seed}, {:.0} s\n  records {}  (distinct events {}, duplicates {}, poison {})\n  \
             kills {}  starts {}  postgres restarts {}  backend terminations {}  broker faults {}\n  \
             rebalances {} (assignments lost {})  commits checked {} (covered by an earlier check {})\n  lost {}  doubled {}  commit-order violations {}\n",
            elapsed.as_secs_f64(),
            self.records,
            self.distinct_events,
            self.duplicates,
            self.poison,
            self.kills,
            self.starts,
            self.postgres_restarts,
            self.backend_terminations,
            self.broker_faults,
            self.rebalances,
            self.assignments_lost,
            self.commits_checked,
            self.commits_covered,
            self.lost,
            self.doubled,
            self.violations.len()
        )
    }
}

/// A commit the service logged: (instance, partition, offset, when it was logged — after the
/// broker confirmed it).
type CommitSeen = (usize, i32, i64, chrono::DateTime<chrono::Utc>);

/// Where the produced records landed, as the producer learns it.
#[derive(Default)]
pub struct Deliveries {
    pub by_index: Vec<Option<(i32, i64)>>,
    pub by_place: HashMap<(i32, i64), usize>,
    pub failed: usize,
}

/// One `history-service run` process slot.
struct Instance {
    child: Option<Child>,
    port: u16,
}

pub struct Chaos {
    pub seed: u64,
    pub binary: PathBuf,
    pub dir: PathBuf,
    pub postgres: ThrowawayCluster,
    pub database_url: String,
    broker: Child,
    broker_control: Mutex<ChildStdin>,
    pub brokers: String,
    instances: Vec<Instance>,
    commits: Sender<CommitSeen>,
    commit_feed: Option<Receiver<CommitSeen>>,
    pub rebalances: Arc<AtomicUsize>,
    pub assignments_lost: Arc<AtomicUsize>,
    pub figures: Figures,
    pub runtime: tokio::runtime::Runtime,
}

impl Chaos {
    /// `rate` is the planned production rate, records per second: the slow disk is sized so
    /// that the writers are busy about three quarters of the time.
    pub fn start(seed: u64, instances: usize, rate: f64) -> Chaos {
        let binary = PathBuf::from(
            std::env::var("HISTORY_CHAOS_BIN")
                .unwrap_or_else(|_| env!("CARGO_BIN_EXE_history-service").to_owned()),
        );
        let dir = std::env::temp_dir().join(format!("history-chaos-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Commit timestamps let the checker tell when each row became durable.
        let postgres = ThrowawayCluster::start_installed(&["track_commit_timestamp=on"])
            .expect("a PostgreSQL cluster of our own");
        let admin_url = postgres.url("postgres");
        let database_url = postgres.url("chaos");
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client.batch_execute("CREATE DATABASE chaos").await.unwrap();
            let (mut client, connection) =
                tokio_postgres::connect(&database_url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
            tokio::spawn(connection);
            history_service::store::migrate::run_migrations(&mut client)
                .await
                .unwrap();
            // A slow, uneven disk: each history row costs a random few milliseconds inside its
            // transaction, sized so that the writers are busy about three quarters of the time.
            // Faults then mostly land mid-transaction, and writers finish out of step.
            let writers = 2.0 * instances as f64;
            let mean_seconds = 0.75 * writers / rate.max(1.0);
            client
                .batch_execute(&format!(
                    "CREATE FUNCTION chaos_slow_disk() RETURNS trigger LANGUAGE plpgsql AS $$
                     BEGIN PERFORM pg_sleep(random() * {}); RETURN NULL; END $$;
                     CREATE TRIGGER chaos_slow_disk AFTER INSERT ON history_events
                     FOR EACH ROW EXECUTE FUNCTION chaos_slow_disk();",
                    2.0 * mean_seconds
                ))
                .await
                .unwrap();
        });

        // The broker is the development kit's; the service under test may be a mutant build.
        let mut broker = Command::new(history_devkit::workspace_binary("history-dev"))
            .args([
                "dev-kafka",
                "--brokers",
                "3",
                "--partitions",
                &PARTITIONS.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(File::create(dir.join("dev-kafka.log")).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(broker.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let brokers = first.strip_prefix("bootstrap.servers=").unwrap().to_owned();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                assert!(line.starts_with("ok "), "dev-kafka refused a fault: {line}");
            }
        });
        let broker_control = Mutex::new(broker.stdin.take().unwrap());
        let (commits, commit_feed) = channel();
        Chaos {
            seed,
            binary,
            dir,
            postgres,
            database_url,
            broker,
            broker_control,
            brokers,
            instances: (0..instances)
                .map(|_| Instance {
                    child: None,
                    port: free_port(),
                })
                .collect(),
            commits,
            commit_feed: Some(commit_feed),
            rebalances: Arc::new(AtomicUsize::new(0)),
            assignments_lost: Arc::new(AtomicUsize::new(0)),
            figures: Figures::default(),
            runtime,
        }
    }

    /// Starts (or restarts) instance `n`, its log going to a file and through the commit feed.
    pub fn start_instance(&mut self, n: usize) {
        if self.instances[n].child.is_some() {
            return;
        }
        self.figures.starts += 1;
        let port = self.instances[n].port;
        let mut child = Command::new(&self.binary)
            .arg("run")
            .envs([
                ("HISTORY__DATABASE__URL", self.database_url.clone()),
                ("HISTORY__DATABASE__CONNECT_TIMEOUT_MS", "1000".into()),
                ("HISTORY__KAFKA__BROKERS", self.brokers.clone()),
                ("HISTORY__KAFKA__GROUP_ID", GROUP.into()),
                ("HISTORY__KAFKA__TOPICS", TOPIC.into()),
                ("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "3000".into()),
                ("HISTORY__KAFKA__FETCH_WAIT_MAX_MS", "20".into()),
                ("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "100".into()),
                ("HISTORY__PIPELINE__RETRY_INITIAL_MS", "50".into()),
                ("HISTORY__PIPELINE__RETRY_MAX_MS", "1000".into()),
                (
                    "HISTORY__PIPELINE__MAX_IN_FLIGHT_PER_PARTITION",
                    "300".into(),
                ),
                ("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "200".into()),
                // Small oversized poison keeps a long run within the broker's retention.
                (
                    "HISTORY__PIPELINE__MAX_PAYLOAD_BYTES",
                    MAX_PAYLOAD.to_string(),
                ),
                ("HISTORY__HTTP__LISTEN", format!("127.0.0.1:{port}")),
                ("HISTORY__LOG__FORMAT", "json".into()),
                (
                    "HISTORY__LOG__FILTER",
                    "info,history_service::commits=debug".into(),
                ),
            ])
            .env_remove("RUST_LOG")
            .env_remove("HISTORY_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("instance-{n}.log")))
            .unwrap();
        let commits = self.commits.clone();
        let rebalances = self.rebalances.clone();
        let assignments_lost = self.assignments_lost.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                match entry["message"].as_str() {
                    Some("offset committed") => {
                        let partition = entry["partition"].as_i64().unwrap() as i32;
                        let offset = entry["offset"].as_i64().unwrap();
                        let at = entry["timestamp"]
                            .as_str()
                            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                            .expect("log lines carry an RFC 3339 timestamp")
                            .to_utc();
                        let _ = commits.send((n, partition, offset, at));
                    }
                    Some("partitions assigned") | Some("partitions revoked") => {
                        rebalances.fetch_add(1, Ordering::Relaxed);
                    }
                    Some("assignment lost: nothing is committed") => {
                        rebalances.fetch_add(1, Ordering::Relaxed);
                        assignments_lost.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        });
        self.instances[n].child = Some(child);
    }

    pub fn kill_instance(&mut self, n: usize) {
        if let Some(mut child) = self.instances[n].child.take() {
            let _ = child.kill(); // SIGKILL: no LeaveGroup, no final commit
            let _ = child.wait();
            self.figures.kills += 1;
        }
    }

    /// SIGTERM to every instance; each must stop by itself, with exit code 0.
    pub fn stop_instances(&mut self) {
        for (n, instance) in self.instances.iter_mut().enumerate() {
            if let Some(child) = &instance.child {
                unsafe {
                    libc::kill(child.id() as i32, libc::SIGTERM);
                }
            }
            if let Some(mut child) = instance.child.take() {
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    if let Some(status) = child.try_wait().unwrap() {
                        if status.code() != Some(0) {
                            self.figures
                                .violations
                                .push(format!("instance {n} exited with {status} on SIGTERM"));
                        }
                        break;
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        self.figures
                            .violations
                            .push(format!("instance {n} did not stop on SIGTERM"));
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    pub fn broker_fault(&mut self, command: &str) {
        let mut control = self.broker_control.lock().unwrap();
        writeln!(control, "{command}").unwrap();
        control.flush().unwrap();
        self.figures.broker_faults += 1;
    }

    pub fn restart_postgres(&mut self) {
        self.postgres.restart().expect("PostgreSQL restarts");
        self.figures.postgres_restarts += 1;
    }

    pub fn terminate_backends(&mut self) {
        let url = self.postgres.url("postgres");
        let ended = self.runtime.block_on(async move {
            let Ok((client, connection)) =
                tokio_postgres::connect(&url, tokio_postgres::NoTls).await
            else {
                return 0;
            };
            tokio::spawn(connection);
            client
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = 'chaos' AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
                .map(|rows| rows.len())
                .unwrap_or(0)
        });
        if ended > 0 {
            self.figures.backend_terminations += 1;
        }
    }

    /// Runs the schedule while `records` are produced, then lets every instance catch up and
    /// stops them; checks everything from outside. Returns the figures.
    pub fn run(
        mut self,
        records: Vec<PlannedRecord>,
        plan: Vec<(Duration, Action)>,
        duration: Duration,
    ) -> Figures {
        for action in &plan {
            eprintln!(
                "  planned at {:>6.2} s: {:?}",
                action.0.as_secs_f64(),
                action.1
            );
        }
        let started = Instant::now();
        for n in 0..self.instances.len() {
            self.start_instance(n);
        }
        let delivered = Arc::new(Mutex::new(Deliveries {
            by_index: vec![None; records.len()],
            by_place: HashMap::new(),
            failed: 0,
        }));
        let producing_done = Arc::new(AtomicBool::new(false));
        let producer = spawn_producer(
            self.brokers.clone(),
            records.clone(),
            delivered.clone(),
            duration.mul_f64(PRODUCTION_SHARE),
            producing_done.clone(),
        );
        let checker = spawn_checker(
            self.commit_feed.take().unwrap(),
            self.database_url.clone(),
            records.clone(),
            delivered.clone(),
        );

        for (when, action) in plan {
            if let Some(wait) = (started + when).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            match action {
                Action::Kill(n) => self.kill_instance(n),
                Action::Start(n) => self.start_instance(n),
                Action::RestartPostgres => self.restart_postgres(),
                Action::TerminateBackends => self.terminate_backends(),
                Action::Broker(command) => self.broker_fault(&command),
            }
        }
        producer.join().expect("the producer delivered everything");
        // Heal whatever is still broken, and make sure every instance runs.
        for id in 1..=3 {
            self.broker_fault(&format!("broker-up {id}"));
        }
        self.figures.broker_faults -= 3;
        for api in ["fetch", "offset-commit", "heartbeat"] {
            self.broker_fault(&format!("clear-errors {api}"));
            self.figures.broker_faults -= 1;
        }
        for n in 0..self.instances.len() {
            self.start_instance(n);
        }

        let ends = wait_until_committed(&self.brokers, Duration::from_secs(180));
        self.figures.final_metrics = (0..self.instances.len()).map(|n| self.metrics(n)).collect();
        self.stop_instances();
        // The last lines of the stopped instances are still being read.
        std::thread::sleep(Duration::from_millis(300));
        let checked = checker.finish();
        self.figures.commits_checked = checked.checked;
        self.figures.commits_covered = checked.covered;
        self.figures.violations.extend(checked.violations);
        self.figures.rebalances = self.rebalances.load(Ordering::Relaxed);
        self.figures.assignments_lost = self.assignments_lost.load(Ordering::Relaxed);
        let by_index = delivered.lock().unwrap().by_index.clone();
        self.final_checks(&records, &by_index, &ends);
        let figures = self.figures.clone();
        eprintln!("{}", figures.render(self.seed, started.elapsed()));
        eprintln!("  logs in {}", self.dir.display());
        let _ = self.broker.kill();
        let _ = self.broker.wait();
        figures
    }

    fn final_checks(
        &mut self,
        records: &[PlannedRecord],
        delivered: &[Option<(i32, i64)>],
        ends: &[i64],
    ) {
        let mut distinct = HashSet::new();
        let mut poison = HashMap::new();
        for (record, place) in records.iter().zip(delivered) {
            match &record.kind {
                RecordKind::Event { event_id } => {
                    distinct.insert(event_id.clone());
                }
                RecordKind::Duplicate { .. } => self.figures.duplicates += 1,
                RecordKind::Poison { reason } => {
                    poison.insert(place.expect("delivered"), *reason);
                }
            }
        }
        self.figures.records = records.len();
        self.figures.distinct_events = distinct.len();
        self.figures.poison = poison.len();
        let url = self.database_url.clone();
        let (history, inbox, orphans, letters) = self.runtime.block_on(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let history: Vec<String> = client
                .query("SELECT event_id FROM history_events", &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            let inbox: Vec<String> = client
                .query("SELECT event_id FROM inbox", &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            let orphans: i64 = client
                .query_one(
                    "SELECT count(*) FROM inbox i WHERE NOT EXISTS \
                     (SELECT 1 FROM history_events h WHERE h.event_id = i.event_id)",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            let letters: Vec<(i32, i64, String)> = client
                .query(
                    "SELECT partition, \"offset\", reason_code FROM dead_letters",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            (history, inbox, orphans, letters)
        });
        let history_set: HashSet<&String> = history.iter().collect();
        self.figures.lost = distinct
            .iter()
            .filter(|id| !history_set.contains(id))
            .count();
        self.figures.doubled = history.len() - history_set.len();
        let strangers = history_set
            .iter()
            .filter(|id| !distinct.contains(**id))
            .count();
        if strangers > 0 {
            self.figures
                .violations
                .push(format!("{strangers} history rows of unknown events"));
        }
        if inbox.len() != distinct.len() {
            self.figures.violations.push(format!(
                "{} inbox markers for {} events",
                inbox.len(),
                distinct.len()
            ));
        }
        if orphans > 0 {
            self.figures
                .violations
                .push(format!("{orphans} inbox markers without a history row"));
        }
        let stored: HashMap<(i32, i64), String> =
            letters.into_iter().map(|(p, o, r)| ((p, o), r)).collect();
        for (place, reason) in &poison {
            match stored.get(place) {
                Some(found) if found == reason => {}
                other => self.figures.violations.push(format!(
                    "poison at {place:?} ({reason}): dead letter {other:?}"
                )),
            }
        }
        if stored.len() != poison.len() {
            self.figures.violations.push(format!(
                "{} dead letters for {} poison records",
                stored.len(),
                poison.len()
            ));
        }
        let inspector = GroupInspector::new(&self.brokers, GROUP).unwrap();
        let committed = inspector
            .committed(TOPIC, PARTITIONS, Duration::from_secs(10))
            .unwrap();
        for (partition, (committed, end)) in committed.iter().zip(ends).enumerate() {
            if *end > 0 && *committed != Some(*end) {
                self.figures.violations.push(format!(
                    "partition {partition}: committed {committed:?}, end {end}"
                ));
            }
        }
    }

    /// Scrapes an instance's metrics.
    pub fn metrics(&self, n: usize) -> String {
        let port = self.instances[n].port;
        history_devkit::probe::get(port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        for instance in &mut self.instances {
            if let Some(mut child) = instance.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = self.broker.kill();
        let _ = self.broker.wait();
    }
}

/// Produces the records in twenty slices spread over `over`, noting where each landed.
fn spawn_producer(
    brokers: String,
    records: Vec<PlannedRecord>,
    delivered: Arc<Mutex<Deliveries>>,
    over: Duration,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let producer: ThreadedProducer<Recorder> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "300000")
            .create_with_context(Recorder(delivered))
            .expect("producer");
        // One record at a time at a steady rate: the writers stay busy for the whole run.
        let started = Instant::now();
        let pace = over.as_secs_f64() / records.len().max(1) as f64;
        for (index, planned) in records.iter().enumerate() {
            let due = started + Duration::from_secs_f64(pace * index as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            workload::send(&producer, TOPIC, planned, index).expect("send");
        }
        producer
            .flush(Duration::from_secs(300))
            .expect("every record delivered");
        let failed = producer.context().0.lock().unwrap().failed;
        assert_eq!(failed, 0, "records the producer could not deliver");
        done.store(true, Ordering::Relaxed);
    })
}

/// Notes where each record landed, as delivery reports arrive.
struct Recorder(Arc<Mutex<Deliveries>>);

impl rdkafka::ClientContext for Recorder {}

impl rdkafka::producer::ProducerContext for Recorder {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, result: &rdkafka::producer::DeliveryResult<'_>, index: Box<usize>) {
        use rdkafka::Message;
        let mut deliveries = self.0.lock().unwrap();
        match result {
            Ok(message) => {
                let place = (message.partition(), message.offset());
                deliveries.by_index[*index] = Some(place);
                deliveries.by_place.insert(place, *index);
            }
            Err(_) => deliveries.failed += 1,
        }
    }
}

/// Checks every commit the instances logged: each record before the committed offset must
/// already be in the database (its event recorded, or its dead letter stored), and a
/// partition's committed position never moves backwards.
struct Checker {
    handle: std::thread::JoinHandle<CheckerReport>,
    stop: Arc<AtomicBool>,
}

struct CheckerReport {
    checked: usize,
    covered: usize,
    violations: Vec<String>,
}

impl Checker {
    fn finish(self) -> CheckerReport {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("checker")
    }
}

fn spawn_checker(
    feed: Receiver<CommitSeen>,
    database_url: String,
    records: Vec<PlannedRecord>,
    delivered: Arc<Mutex<Deliveries>>,
) -> Checker {
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let handle = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut verified = vec![0i64; PARTITIONS as usize];
        let mut checked = 0;
        let mut covered = 0;
        let mut violations = Vec::new();
        // Every commit seen, per partition, to check the order once all are in.
        let mut history: Vec<Vec<(chrono::DateTime<chrono::Utc>, i64, usize)>> =
            vec![Vec::new(); PARTITIONS as usize];
        let mut pending: Vec<CommitSeen> = Vec::new();
        let mut client: Option<tokio_postgres::Client> = None;
        loop {
            match feed.recv_timeout(Duration::from_millis(200)) {
                Ok(commit) => pending.push(commit),
                Err(_) if stopping.load(Ordering::Relaxed) && pending.is_empty() => break,
                Err(_) => {}
            }
            pending.extend(feed.try_iter());
            let mut retry = Vec::new();
            for (instance, partition, offset, at) in pending.drain(..) {
                let from = verified[partition as usize];
                if offset <= from {
                    // Every record below `from` was found durable by an earlier check.
                    covered += 1;
                    history[partition as usize].push((at, offset, instance));
                    continue;
                }
                // The records of this partition between what is verified and the commit.
                let wanted: Vec<(i64, &PlannedRecord)> = {
                    let delivered = delivered.lock().unwrap();
                    (from..offset)
                        .filter_map(|o| {
                            delivered
                                .by_place
                                .get(&(partition, o))
                                .map(|&i| (o, &records[i]))
                        })
                        .collect()
                };
                if (wanted.len() as i64) < offset - from && !stopping.load(Ordering::Relaxed) {
                    // Deliveries not all reported yet: look again shortly.
                    retry.push((instance, partition, offset, at));
                    continue;
                }
                match runtime.block_on(not_durable_at(
                    &mut client,
                    &database_url,
                    partition,
                    &wanted,
                    at,
                )) {
                    Ok(late) => {
                        for (offset_late, durable) in late {
                            violations.push(format!(
                                "instance {instance} committed partition {partition} to {offset} \
                                 at {at} while offset {offset_late} was not recorded (durable: \
                                 {durable:?})"
                            ));
                        }
                        verified[partition as usize] = offset;
                        checked += 1;
                        history[partition as usize].push((at, offset, instance));
                    }
                    // The database is restarting: the rows cannot have gone, check again later.
                    Err(_) => {
                        client = None;
                        retry.push((instance, partition, offset, at));
                    }
                }
            }
            pending = retry;
            if !pending.is_empty() {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        violations.extend(backward_commits(&mut history));
        CheckerReport {
            checked,
            covered,
            violations,
        }
    });
    Checker { handle, stop }
}

/// Commits that moved a partition's position backwards, in the order the broker confirmed
/// them (the instances' commit timestamps).
fn backward_commits(
    history: &mut [Vec<(chrono::DateTime<chrono::Utc>, i64, usize)>],
) -> Vec<String> {
    let mut violations = Vec::new();
    for (partition, commits) in history.iter_mut().enumerate() {
        commits.sort();
        for pair in commits.windows(2) {
            let ((_, before, first), (at, after, second)) = (pair[0], pair[1]);
            if after < before {
                violations.push(format!(
                    "partition {partition}: instance {second} committed {after} at {at}, after \
                     instance {first} had committed {before}: the position moved backwards"
                ));
            }
        }
    }
    violations
}

/// The offsets among `wanted` whose effect was not durable at `committed_at`: missing from the
/// database, or committed there later (by the row's transaction commit timestamp).
async fn not_durable_at(
    connection: &mut Option<tokio_postgres::Client>,
    database_url: &str,
    partition: i32,
    wanted: &[(i64, &PlannedRecord)],
    committed_at: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<(i64, Option<chrono::DateTime<chrono::Utc>>)>, tokio_postgres::Error> {
    if connection.is_none() {
        let (client, driver) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
        tokio::spawn(driver);
        *connection = Some(client);
    }
    let client = connection.as_ref().expect("connected above");
    let mut ids = Vec::new();
    let mut poison = Vec::new();
    for (offset, record) in wanted {
        match &record.kind {
            RecordKind::Event { event_id } | RecordKind::Duplicate { event_id } => {
                ids.push((*offset, event_id.clone()))
            }
            RecordKind::Poison { .. } => poison.push(*offset),
        }
    }
    let id_list: Vec<&str> = ids.iter().map(|(_, id)| id.as_str()).collect();
    let durable: HashMap<String, chrono::DateTime<chrono::Utc>> = client
        .query(
            "SELECT h.event_id, pg_xact_commit_timestamp(h.xmin) FROM history_events h \
             JOIN inbox i USING (event_id) WHERE h.event_id = ANY($1)",
            &[&id_list],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let stored: HashMap<i64, chrono::DateTime<chrono::Utc>> = client
        .query(
            "SELECT \"offset\", pg_xact_commit_timestamp(xmin) FROM dead_letters \
             WHERE topic = $1 AND partition = $2 AND \"offset\" = ANY($3)",
            &[&TOPIC, &partition, &poison],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let late = |at: Option<&chrono::DateTime<chrono::Utc>>| at.is_none_or(|at| *at > committed_at);
    let mut found: Vec<(i64, Option<chrono::DateTime<chrono::Utc>>)> = ids
        .iter()
        .filter(|(_, id)| late(durable.get(id)))
        .map(|(offset, id)| (*offset, durable.get(id).copied()))
        .collect();
    found.extend(
        poison
            .iter()
            .filter(|offset| late(stored.get(offset)))
            .map(|offset| (*offset, stored.get(offset).copied())),
    );
    Ok(found)
}

/// Waits until the group has committed the end of every partition; returns the ends.
fn wait_until_committed(brokers: &str, timeout: Duration) -> Vec<i64> {
    let inspector = GroupInspector::new(brokers, GROUP).unwrap();
    let ends = inspector
        .ends(TOPIC, PARTITIONS, Duration::from_secs(10))
        .unwrap();
    let deadline = Instant::now() + timeout;
    loop {
        let committed = inspector.committed(TOPIC, PARTITIONS, Duration::from_secs(5));
        let expected: Vec<Option<i64>> = ends.iter().map(|&e| (e > 0).then_some(e)).collect();
        if committed.as_ref().ok() == Some(&expected) {
            return ends;
        }
        if Instant::now() > deadline {
            eprintln!("not everything committed in time: {committed:?} vs {ends:?}");
            return ends;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The stream of a run: events with 10% duplicates (some on other partitions) and 1% poison.
pub fn workload(records: usize, seed: u64) -> Vec<PlannedRecord> {
    workload::generate(&WorkloadSpec {
        records,
        duplicates: 0.1,
        poison: 0.01,
        partitions: PARTITIONS,
        id_prefix: format!("chaos-{seed}"),
        tickets: 300,
        max_payload_bytes: MAX_PAYLOAD,
        seed,
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
