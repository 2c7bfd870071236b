//! The chaos harness: the real `history-service` binary as child processes (see [`crate::instance`]),
//! `history-dev dev-kafka` as the broker (see [`crate::broker`]), a PostgreSQL cluster of the
//! test's own (restarted at will), a seeded schedule of faults (see [`crate::schedule`]), and
//! checks made from outside (see [`crate::checker`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use history_devkit::fault_proxy::{Direction, FaultProxy, Target};
use history_devkit::group::{GroupInspector, wait_committed};
use history_devkit::postgres::ThrowawayCluster;
use history_devkit::workload::PlannedRecord;

use crate::broker::DevKafka;
use crate::checker::{CommitSeen, check_sent, final_checks, spawn_checker};
use crate::instance::{Instance, LogFeed, Protocol};
use crate::outcomes::{Claims, Count, Lifetime, OutcomeCheck};
use crate::producer::{Deliveries, spawn_producer};
use crate::schedule::{Action, GROUP, PARTITIONS, PRODUCTION_SHARE, TOPIC};

/// How long a freeze that found no connection in its planned time waits for one.
const LATE_FREEZE_WAIT: Duration = Duration::from_secs(60);
/// How long a late freeze holds its connections: past `database.statement_timeout_ms` (10 s by
/// default), as a planned one does, so that the deadline ends the wait.
const FROZEN_PAST_THE_DEADLINE: Duration = Duration::from_secs(11);

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
    /// Times every open database connection was frozen, and how many connections in all.
    pub database_freezes: usize,
    pub database_connections_frozen: usize,
    /// Writes abandoned at their deadline (`history_db_timeouts_total`), every lifetime of
    /// every instance.
    pub database_timeouts: u64,
    pub broker_faults: usize,
    pub rebalances: usize,
    /// Assignments the service reported lost (no clean revoke, nothing committed).
    pub assignments_lost: usize,
    /// Commits checked against the database (every record before them was durable first).
    pub commits_checked: usize,
    /// Commits at or below a position already checked: covered by that check, not checked again.
    pub commits_covered: usize,
    /// Positions the brokers were sent (read off the wire), and of them those checked against
    /// the database ([`crate::checker::check_sent`]).
    pub commits_sent: usize,
    pub commits_sent_checked: usize,
    /// Late copies of earlier commit requests seen on the wire ([`crate::checker::SentCheck`]).
    pub late_copies: Vec<String>,
    pub lost: usize,
    pub doubled: usize,
    pub violations: Vec<String>,
    /// Each instance's /metrics just before the final stop.
    pub final_metrics: Vec<String>,
    pub freezes: usize,
    /// `Applied` outcomes the instances counted, every lifetime of every instance (a stopped
    /// one's from its exit line; a killed one's scraped just before the kill, so what it
    /// applied in its last moments is missing).
    pub applied_outcomes: u64,
    /// `AlreadyApplied` outcomes, likewise.
    pub already_applied_outcomes: u64,
    /// Records acknowledged by the broker but never stored: events without a history row,
    /// poison records without a dead letter.
    pub unseen: usize,
    /// Commits that moved a partition's committed position backwards.
    pub regressions: usize,
    /// Backward commits made while the broker had assigned the partition to two instances at
    /// once (each committing within an assignment its own log held): the broker's doing,
    /// reported apart ([`crate::checker::Backward::double_assigned`]).
    pub double_assigned: Vec<String>,
    /// Backward commits that followed the log back after the committing instance's client
    /// detected a truncation ([`crate::checker::Backward::after_truncation`]).
    pub after_truncation: Vec<String>,
    /// Backward commits of a new assignment starting where a late copy of an earlier request
    /// had set the broker back ([`crate::checker::Backward::after_late_copy`]).
    pub after_late_copy: Vec<String>,
    /// The longest time any partition's committed position stood still while records were
    /// produced to it.
    pub longest_stall: Duration,
    /// Each lifetime's `Applied` outcomes against the inbox markers its transactions inserted.
    pub outcomes: OutcomeCheck,
}

impl Figures {
    /// Records processed again after a fault: `AlreadyApplied` outcomes beyond the duplicates
    /// the workload itself contains.
    pub fn redone(&self) -> i64 {
        self.already_applied_outcomes as i64 - self.duplicates as i64
    }
}

impl Figures {
    pub fn render(&self, seed: u64, elapsed: Duration) -> String {
        format!(
            "chaos run: seed {seed}, {:.0} s\n  records {}  (distinct events {}, duplicates {}, poison {})\n  \
             kills {}  starts {}  postgres restarts {}  backend terminations {}  database freezes {} ({} connections, {} writes abandoned at their deadline)  broker faults {}\n  \
             freezes {}  rebalances {} (assignments lost {})  commits checked {} (covered by an earlier check {})  \
             positions on the wire {} (checked {}, late copies of earlier requests {})\n  \
             lost {}  doubled (rows) {}  unseen {}  committed-offset regressions {}  violations {}\n  \
             Applied outcomes beyond their lifetime's inbox markers {}  markers their lifetime did not report {}  \
             (lifetimes counted at exit {}, before a kill {}, not counted {}){}\n  re-done {}  longest partition stall {:.1} s  (outcomes: applied {}, already applied {})\n  \
             backward commits while the broker had a partition assigned twice {}{}\n  \
             backward commits after the client reset a partition it found truncated {}{}\n  \
             backward commits of a new assignment where a late copy set the broker back {}{}\n",
            elapsed.as_secs_f64(),
            self.records,
            self.distinct_events,
            self.duplicates,
            self.poison,
            self.kills,
            self.starts,
            self.postgres_restarts,
            self.backend_terminations,
            self.database_freezes,
            self.database_connections_frozen,
            self.database_timeouts,
            self.broker_faults,
            self.freezes,
            self.rebalances,
            self.assignments_lost,
            self.commits_checked,
            self.commits_covered,
            self.commits_sent,
            self.commits_sent_checked,
            self.late_copies.len(),
            self.lost,
            self.doubled,
            self.unseen,
            self.regressions,
            self.violations.len(),
            self.outcomes.applied_beyond_markers,
            self.outcomes.applied_unreported,
            self.outcomes.at_exit,
            self.outcomes.before_kill,
            self.outcomes.missing,
            self.outcomes
                .lifetimes
                .iter()
                .map(|line| format!("\n    {line}"))
                .collect::<String>(),
            self.redone(),
            self.longest_stall.as_secs_f64(),
            self.applied_outcomes,
            self.already_applied_outcomes,
            self.double_assigned.len(),
            self.double_assigned
                .iter()
                .map(|line| format!("\n    {line}"))
                .collect::<String>(),
            self.after_truncation.len(),
            self.after_truncation
                .iter()
                .map(|line| format!("\n    {line}"))
                .collect::<String>(),
            self.after_late_copy.len(),
            self.after_late_copy
                .iter()
                .map(|line| format!("\n    {line}"))
                .collect::<String>(),
        )
    }
}

pub struct Chaos {
    pub seed: u64,
    pub binary: PathBuf,
    pub dir: PathBuf,
    pub postgres: ThrowawayCluster,
    /// The database, directly: for the checker and the set-up.
    pub database_url: String,
    /// In front of the cluster's socket: the instances reach the database through it.
    database_proxy: FaultProxy,
    /// A freeze found no open connection: the next ones to open are frozen.
    database_freeze_pending: bool,
    broker: DevKafka,
    pub brokers: String,
    /// The running instances, by number (`None` while one is down).
    instances: Vec<Option<Instance>>,
    /// How many lifetimes each instance has begun.
    lifetimes_begun: Vec<usize>,
    /// The lifetimes that ended, with their counts of outcomes.
    lifetimes: Vec<Lifetime>,
    feed: LogFeed,
    commit_feed: Option<Receiver<CommitSeen>>,
    pub figures: Figures,
    pub runtime: tokio::runtime::Runtime,
    /// The group protocol the instances speak.
    protocol: Protocol,
}

impl Chaos {
    /// `rate` is the planned production rate, records per second: the slow disk is sized so
    /// that the writers are busy about three quarters of the time.
    pub fn start(seed: u64, instances: usize, rate: f64) -> Chaos {
        Self::start_with(seed, instances, rate, Protocol::Classic)
    }

    /// [`Chaos::start`], the instances speaking `protocol`.
    pub fn start_with(seed: u64, instances: usize, rate: f64, protocol: Protocol) -> Chaos {
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
            // Each inbox marker names the lifetime whose transaction inserted it: the instances'
            // sessions carry their lifetime as `application_name` (crate::outcomes).
            client
                .batch_execute(
                    "ALTER TABLE inbox ADD COLUMN applied_by text NOT NULL \
                     DEFAULT current_setting('application_name')",
                )
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

        let database_proxy = FaultProxy::start(Target::Unix(postgres.socket_path()))
            .expect("a fault proxy in front of PostgreSQL");
        let broker = DevKafka::start(&dir);
        let brokers = broker.brokers.clone();
        let (commits, commit_feed) = channel();
        Chaos {
            seed,
            binary,
            dir,
            postgres,
            database_url,
            database_proxy,
            database_freeze_pending: false,
            broker,
            brokers,
            instances: (0..instances).map(|_| None).collect(),
            lifetimes_begun: vec![0; instances],
            lifetimes: Vec::new(),
            feed: LogFeed {
                commits,
                rebalances: Arc::new(AtomicUsize::new(0)),
                assignments_lost: Arc::new(AtomicUsize::new(0)),
                owned: Arc::new(Mutex::new(Vec::new())),
                truncated: Arc::new(Mutex::new(Vec::new())),
                members: Arc::new(Mutex::new(std::collections::HashMap::new())),
                exits: Arc::new(Mutex::new(std::collections::HashMap::new())),
            },
            commit_feed: Some(commit_feed),
            figures: Figures::default(),
            runtime,
            protocol,
        }
    }

    /// Starts (or restarts) instance `n`, its log going to a file and through the commit feed.
    pub fn start_instance(&mut self, n: usize) {
        if self.instances[n].is_some() {
            return;
        }
        self.figures.starts += 1;
        self.lifetimes_begun[n] += 1;
        let lifetime = format!("chaos-{n}-{}", self.lifetimes_begun[n]);
        let through_proxy = format!(
            "postgres://postgres@127.0.0.1:{}/chaos",
            self.database_proxy.port()
        );
        self.instances[n] = Some(Instance::start(
            &self.binary,
            n,
            &lifetime,
            &self.dir,
            &through_proxy,
            &self.brokers,
            self.protocol,
            self.feed.clone(),
        ));
    }

    pub fn kill_instance(&mut self, n: usize) {
        if let Some(instance) = self.instances[n].take() {
            let scraped = instance.metrics();
            let count = if scraped.is_empty() {
                // It did not answer (still starting): what it did is in the database only.
                Count::Missing
            } else {
                let metrics = history_devkit::probe::Metrics::parse(&scraped);
                self.count_timeouts(&metrics);
                Count::BeforeKill(scraped_claims(&instance.lifetime, &metrics))
            };
            self.lifetimes.push(Lifetime {
                name: instance.lifetime.clone(),
                count,
            });
            instance.kill();
            self.figures.kills += 1;
        }
    }

    /// Adds a lifetime's writes abandoned at their deadline, from its /metrics.
    fn count_timeouts(&mut self, metrics: &history_devkit::probe::Metrics) {
        self.figures.database_timeouts += metrics.sum("history_db_timeouts_total") as u64;
    }

    pub fn signal_instance(&mut self, n: usize, signal: history_devkit::process::Signal) {
        if let Some(instance) = self.instances[n].as_mut() {
            instance.signal(signal);
        }
    }

    /// SIGTERM to every instance; each must stop by itself, with exit code 0.
    pub fn stop_instances(&mut self) {
        for instance in self.instances.iter_mut().flatten() {
            instance.terminate();
        }
        for (n, slot) in self.instances.iter_mut().enumerate() {
            let Some(instance) = slot.take() else {
                continue;
            };
            let lifetime = instance.lifetime.clone();
            let stopped = instance.wait_stopped(Duration::from_secs(60));
            // Every line it wrote has been read: its exit line, if it wrote one.
            let exit = self.feed.exits.lock().unwrap().get(&lifetime).copied();
            if exit.is_none() && matches!(&stopped, Ok(status) if status.code() == Some(0)) {
                self.figures
                    .violations
                    .push(format!("{lifetime} stopped without its exit line's counts"));
            }
            self.lifetimes.push(Lifetime {
                name: lifetime,
                count: exit.map_or(Count::Missing, Count::AtExit),
            });
            match stopped {
                Ok(status) if status.code() == Some(0) => {}
                Ok(status) => self
                    .figures
                    .violations
                    .push(format!("instance {n} exited with {status} on SIGTERM")),
                Err(_) => self
                    .figures
                    .violations
                    .push(format!("instance {n} did not stop on SIGTERM")),
            }
        }
    }

    pub fn broker_fault(&mut self, command: &str) {
        self.broker.fault(command);
        self.figures.broker_faults += 1;
    }

    pub fn restart_postgres(&mut self) {
        self.postgres.restart().expect("PostgreSQL restarts");
        self.figures.postgres_restarts += 1;
    }

    /// Freezes every open connection between the instances and PostgreSQL. An instance just
    /// restarted, or still waiting for partitions, may hold none: then the freeze stays
    /// pending, and [`wait_until`](Self::wait_until) freezes the first connections to open
    /// before the thaw, so that a freeze always freezes something.
    pub fn freeze_database(&mut self) {
        self.figures.database_freezes += 1;
        self.database_freeze_pending = true;
        self.try_pending_freeze();
    }

    fn try_pending_freeze(&mut self) {
        if self.database_freeze_pending {
            let frozen = self.database_proxy.freeze_open(Direction::Both);
            self.figures.database_connections_frozen += frozen;
            self.database_freeze_pending = frozen == 0;
        }
    }

    pub fn thaw_database(&mut self) {
        if self.database_freeze_pending {
            self.freeze_late();
        }
        self.database_freeze_pending = false;
        self.database_proxy.thaw();
    }

    /// The planned freeze found no connection open in all its time — the instances were down
    /// or the schedule ran late behind a slow PostgreSQL restart (seen in CI: every action
    /// between a restart and the thaw fired at once). The freeze is not skipped: the first
    /// connections to open are frozen, and held past the per-transaction deadline.
    fn freeze_late(&mut self) {
        eprintln!(
            "  the database freeze found no open connection in its planned time: frozen late"
        );
        let deadline = Instant::now() + LATE_FREEZE_WAIT;
        while self.database_freeze_pending {
            assert!(
                Instant::now() < deadline,
                "no connection to PostgreSQL opened within {LATE_FREEZE_WAIT:?} to freeze"
            );
            for n in 0..self.instances.len() {
                self.start_instance(n);
            }
            self.try_pending_freeze();
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(FROZEN_PAST_THE_DEADLINE);
    }

    /// Sleeps until `when`, meanwhile retrying a pending database freeze.
    fn wait_until(&mut self, when: Instant) {
        while let Some(left) = when.checked_duration_since(Instant::now()) {
            self.try_pending_freeze();
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
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
        let mut plan = plan;
        plan.sort_by_key(|(when, _)| *when);
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
            self.feed.owned.clone(),
            self.feed.truncated.clone(),
        );

        for (when, action) in plan {
            self.wait_until(started + when);
            match action {
                Action::Kill(n) => self.kill_instance(n),
                Action::Start(n) => self.start_instance(n),
                Action::RestartPostgres => self.restart_postgres(),
                Action::TerminateBackends => self.terminate_backends(),
                Action::FreezeDatabase => self.freeze_database(),
                Action::ThawDatabase => self.thaw_database(),
                Action::Broker(command) => self.broker_fault(&command),
                Action::Freeze(n) => {
                    self.signal_instance(n, history_devkit::process::Signal::SIGSTOP);
                    self.figures.freezes += 1;
                }
                Action::Thaw(n) => {
                    self.signal_instance(n, history_devkit::process::Signal::SIGCONT)
                }
            }
        }
        producer.join().expect("the producer delivered everything");
        // Heal whatever is still broken, and make sure every instance runs.
        self.thaw_database();
        for id in 1..=3 {
            self.broker_fault(&format!("broker-up {id}"));
        }
        self.figures.broker_faults -= 3;
        for api in ["fetch", "offset-commit", "heartbeat"] {
            self.broker_fault(&format!("clear-errors {api}"));
            self.figures.broker_faults -= 1;
        }
        for n in 0..self.instances.len() {
            self.signal_instance(n, history_devkit::process::Signal::SIGCONT);
            self.start_instance(n);
        }

        let ends = wait_until_committed(&self.runtime, &self.brokers, Duration::from_secs(180));
        self.figures.final_metrics = (0..self.instances.len()).map(|n| self.metrics(n)).collect();
        for metrics in self.figures.final_metrics.clone() {
            self.count_timeouts(&history_devkit::probe::Metrics::parse(&metrics));
        }
        // Once they are stopped, every line they wrote has been read: the checker has every
        // commit.
        self.stop_instances();
        let mut checked = checker.finish();
        self.figures.commits_checked = checked.checked;
        self.figures.commits_covered = checked.covered;
        self.figures.longest_stall = checked.longest_stall;
        self.figures
            .violations
            .extend(std::mem::take(&mut checked.violations));
        // What the brokers were sent, logged or not.
        let sent = self.broker.sent_commits();
        let on_wire = check_sent(
            &self.runtime,
            &self.database_url,
            &records,
            &delivered.lock().unwrap(),
            &sent,
            &self.feed.owned.lock().unwrap(),
            &self.feed.members.lock().unwrap(),
        );
        self.figures.commits_sent = on_wire.sent;
        self.figures.commits_sent_checked = on_wire.checked;
        for line in &on_wire.late_copies {
            eprintln!("  on the wire: {line}");
        }
        self.figures.late_copies = on_wire.late_copies;
        self.figures.violations.extend(on_wire.violations);
        // Whose each backward commit was, now that the wire's late copies are known.
        let backward = checked.backward(&on_wire.late_copy_positions);
        self.figures.regressions = backward.service.len();
        self.figures.double_assigned = backward.double_assigned;
        self.figures.after_truncation = backward.after_truncation;
        self.figures.after_late_copy = backward.after_late_copy;
        self.figures.violations.extend(backward.service);
        self.figures.rebalances = self.feed.rebalances.load(Ordering::Relaxed);
        self.figures.assignments_lost = self.feed.assignments_lost.load(Ordering::Relaxed);
        let by_index = delivered.lock().unwrap().by_index.clone();
        let found = final_checks(
            &self.runtime,
            &self.database_url,
            &self.brokers,
            &records,
            &by_index,
            &ends,
        );
        self.figures.records = found.records;
        self.figures.distinct_events = found.distinct_events;
        self.figures.duplicates = found.duplicates;
        self.figures.poison = found.poison;
        self.figures.lost = found.lost;
        self.figures.doubled = found.doubled;
        self.figures.unseen = found.unseen;
        self.figures.violations.extend(found.violations);
        let markers = markers_by_lifetime(&self.runtime, &self.database_url);
        self.figures.outcomes = crate::outcomes::check(
            &self.lifetimes,
            &markers,
            crate::instance::IN_FLIGHT_AT_KILL,
        );
        for lifetime in &self.lifetimes {
            if let Count::AtExit(claims) | Count::BeforeKill(claims) = lifetime.count {
                self.figures.applied_outcomes += claims.applied;
                self.figures.already_applied_outcomes += claims.already_applied;
            }
        }
        let figures = self.figures.clone();
        eprintln!("{}", figures.render(self.seed, started.elapsed()));
        eprintln!("  logs in {}", self.dir.display());
        self.broker.kill();
        figures
    }

    /// Scrapes an instance's metrics (empty while it is down).
    pub fn metrics(&self, n: usize) -> String {
        self.instances[n]
            .as_ref()
            .map(Instance::metrics)
            .unwrap_or_default()
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        // The instances go before the cluster and the broker they use.
        for slot in &mut self.instances {
            slot.take();
        }
    }
}

/// A lifetime's count of its outcomes so far, from its /metrics: every class is required (the
/// service registers each at start), so a renamed family fails here instead of counting 0.
fn scraped_claims(lifetime: &str, metrics: &history_devkit::probe::Metrics) -> Claims {
    let outcome = |name: &str| {
        let key = format!("history_events_total{{outcome=\"{name}\"}}");
        metrics
            .get(&key)
            .unwrap_or_else(|| panic!("{lifetime}'s /metrics has no {key}")) as u64
    };
    Claims {
        applied: outcome("applied"),
        already_applied: outcome("already_applied"),
        unknown: outcome("unknown"),
    }
}

/// The inbox markers by the lifetime whose transaction inserted them.
fn markers_by_lifetime(
    runtime: &tokio::runtime::Runtime,
    database_url: &str,
) -> HashMap<String, u64> {
    let url = database_url.to_owned();
    runtime.block_on(async move {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .query(
                "SELECT applied_by, count(*) FROM inbox GROUP BY applied_by",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get::<_, i64>(1) as u64))
            .collect()
    })
}

/// Waits until the group has committed the end of every partition; returns the ends.
fn wait_until_committed(
    runtime: &tokio::runtime::Runtime,
    brokers: &str,
    timeout: Duration,
) -> Vec<i64> {
    let inspector = Arc::new(GroupInspector::new(brokers, GROUP).unwrap());
    let ends = inspector
        .ends(TOPIC, PARTITIONS, Duration::from_secs(10))
        .unwrap();
    // Not there in time is reported with the figures, not a panic: the checker tells what.
    if let Err(late) = runtime.block_on(wait_committed(inspector, TOPIC, &ends, timeout, || {})) {
        eprintln!("not everything committed in time: {late}");
    }
    ends
}
