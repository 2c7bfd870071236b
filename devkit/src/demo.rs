//! `history-dev demo`: the whole service on embedded defaults. An embedded broker, the
//! configured PostgreSQL (or a throwaway one), the seed scenario followed by a generated stream
//! with duplicates and a few poison records, the real pipeline, and a report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use secrecy::SecretString;

use super::DevError;
use super::broker::EmbeddedBroker;
use super::group::{self, GroupInspector};
use super::workload::{self, RecordKind, WorkloadSpec};
use history_service::app::{self, RunHandles};
use history_service::config::Settings;
use history_service::metrics::Stats;
use history_service::store::{migrate, verify};

/// What the demo generates.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub records: usize,
    pub partitions: i32,
    pub duplicates: f64,
    pub poison: f64,
    pub topic: String,
    /// Give up if the stream is not fully committed within this long.
    pub timeout: Duration,
}

/// What the demo saw, for its report and for tests.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The topic of this run (the configured name, suffixed with the run).
    pub topic: String,
    pub produced: usize,
    pub expected_events: usize,
    pub expected_duplicates: usize,
    pub expected_poison: usize,
    pub stats: history_service::metrics::StatsSnapshot,
    pub history_rows: i64,
    pub dead_letters: i64,
    pub committed: Vec<Option<i64>>,
    pub ends: Vec<i64>,
    pub elapsed: Duration,
    pub consistent: bool,
}

pub async fn run(settings: &Settings, options: &DemoOptions) -> Result<DemoReport, DevError> {
    // The broker is new each run, its offsets start at 0 again, and the database may be the
    // configured one, kept across runs: a topic named for this run keeps this run's dead
    // letters from landing on the coordinates (topic, partition, offset) of an earlier run's,
    // where they would be conflicts, not new letters.
    let run_id = chrono::Utc::now().format("%Y%m%d%H%M%S").to_string();
    let options = &DemoOptions {
        topic: format!("{}.demo-{run_id}", options.topic),
        ..options.clone()
    };
    let broker = EmbeddedBroker::start(1)?;
    broker.create_topic(&options.topic, options.partitions)?;
    let brokers = broker.bootstrap_servers();
    eprintln!(
        "embedded Kafka broker at {brokers}, topic {} ({} partitions)",
        options.topic, options.partitions
    );

    let database = super::postgres::prepare(&settings.database.postgres_config()?).await?;
    eprintln!(
        "PostgreSQL: {}{}",
        history_service::store::describe_target(&database.config),
        if database.throwaway.is_some() {
            " (throwaway cluster)"
        } else {
            ""
        }
    );

    // Dead letters of this run are told from earlier runs' by the database's own clock.
    let run_started: chrono::DateTime<chrono::Utc> = migrate::connect(&database.config)
        .await?
        .query_one("SELECT now()", &[])
        .await
        .map_err(history_service::store::StoreError::from)?
        .get(0);
    let mut settings = settings.clone();
    if let Some(url) = &database.url_override {
        settings.database.url = SecretString::from(url.clone());
    }
    settings.kafka.brokers = brokers.clone();
    settings.kafka.topics = vec![options.topic.clone()];
    settings.kafka.group_id = "history-demo".to_owned();
    settings.http.listen = "127.0.0.1:0".to_owned();

    // The seed scenario first, then a generated stream whose ids are unique to this run.
    let mut records = workload::seed_records();
    records.extend(workload::generate(&WorkloadSpec {
        records: options.records,
        duplicates: options.duplicates,
        poison: options.poison,
        partitions: options.partitions,
        id_prefix: format!("demo-{run_id}"),
        tickets: 500,
        max_payload_bytes: settings.pipeline.max_payload_bytes,
        seed: rand::random(),
    }));
    let count = |pred: fn(&RecordKind) -> bool| records.iter().filter(|r| pred(&r.kind)).count();
    let expected_events = count(|k| matches!(k, RecordKind::Event { .. }));
    let expected_duplicates = count(|k| matches!(k, RecordKind::Duplicate { .. }));
    let expected_poison = count(|k| matches!(k, RecordKind::Poison { .. }));
    let produce_started = Instant::now();
    let topic = options.topic.clone();
    let produced = {
        let brokers = brokers.clone();
        let records = records.clone();
        tokio::task::spawn_blocking(move || workload::produce(&brokers, &topic, &records))
            .await
            .expect("producer thread")?
    };
    eprintln!(
        "produced {} records ({} events, {} duplicates, {} poison) in {:.1?}",
        produced.len(),
        expected_events,
        expected_duplicates,
        expected_poison,
        produce_started.elapsed()
    );

    let inspector = Arc::new(GroupInspector::new(&brokers, &settings.kafka.group_id)?);
    let ends = inspector.ends(&options.topic, options.partitions, Duration::from_secs(5))?;
    let handles = RunHandles::default();
    let started = Instant::now();
    let done = wait_until_committed(
        inspector.clone(),
        options.topic.clone(),
        ends.clone(),
        handles.clone(),
        produced.len(),
        options.timeout,
    );
    let finished = Arc::new(std::sync::Mutex::new(None));
    let shutdown = {
        let finished = finished.clone();
        async move {
            let outcome = done.await;
            // The final commit was seen now; the stop that follows is not part of the drain.
            *finished.lock().unwrap() = Some((outcome, Instant::now()));
        }
    };
    let report = app::run(&settings, app::Stop::when(shutdown), handles.clone()).await?;
    let (committed, committed_at) = finished
        .lock()
        .unwrap()
        .take()
        .unwrap_or((Err(DevError::Timeout(options.timeout)), Instant::now()));
    let committed = committed?;
    let elapsed = match handles.stats.get().and_then(|s| s.first_fetch.get()) {
        Some(first_fetch) => committed_at.saturating_duration_since(*first_fetch),
        None => committed_at - started,
    };

    let mut client = migrate::connect(&database.config).await?;
    migrate::run_migrations(&mut client).await?;
    let check = verify::verify(&client, 10).await?;
    let dead_letters: i64 = client
        .query_one(
            "SELECT count(*) FROM dead_letters WHERE topic = $1 AND first_seen >= $2",
            &[&options.topic, &run_started],
        )
        .await
        .map_err(history_service::store::StoreError::from)?
        .get(0);
    drop(database);
    Ok(DemoReport {
        topic: options.topic.clone(),
        produced: produced.len(),
        expected_events,
        expected_duplicates,
        expected_poison,
        stats: report.stats,
        history_rows: check.history_rows,
        dead_letters,
        committed,
        ends,
        elapsed,
        consistent: check.is_consistent(),
    })
}

/// Completes once the group's committed offsets reach the end of every partition, showing
/// progress meanwhile; or gives up after `timeout`.
async fn wait_until_committed(
    inspector: Arc<GroupInspector>,
    topic: String,
    ends: Vec<i64>,
    handles: RunHandles,
    total: usize,
    timeout: Duration,
) -> Result<Vec<Option<i64>>, DevError> {
    let mut last_progress = Instant::now();
    let committed = group::wait_committed(inspector, &topic, &ends, timeout, || {
        if let Some(stats) = handles.stats.get() {
            if last_progress.elapsed() >= Duration::from_secs(1) {
                progress(stats, total);
                last_progress = Instant::now();
            }
        }
    })
    .await
    .map_err(|_| DevError::Timeout(timeout))?;
    if let Some(stats) = handles.stats.get() {
        progress(stats, total);
    }
    Ok(committed)
}

fn progress(stats: &Stats, total: usize) {
    let s = stats.snapshot();
    eprintln!(
        "  resolved {:>8} / {total}   applied {:>8}   duplicates {:>7}   dead letters {:>5}   retries {:>4}",
        s.resolved(),
        s.applied,
        s.already_applied,
        s.dead_lettered,
        s.retries
    );
}

impl DemoReport {
    /// The report printed at the end of the demo.
    pub fn render(&self) -> String {
        let topic = &self.topic;
        let s = &self.stats;
        let mut out = String::new();
        let rate = self.produced as f64 / self.elapsed.as_secs_f64().max(1e-9);
        out.push_str("history-dev demo report\n");
        out.push_str(&format!(
            "  records produced        {:>10}  ({} events, {} duplicates, {} poison)\n",
            self.produced, self.expected_events, self.expected_duplicates, self.expected_poison
        ));
        out.push_str("  outcomes\n");
        out.push_str(&format!("    applied               {:>10}\n", s.applied));
        out.push_str(&format!(
            "    already_applied       {:>10}\n",
            s.already_applied
        ));
        out.push_str(&format!(
            "    dead_letter           {:>10}\n",
            s.dead_lettered
        ));
        out.push_str(&format!("    unknown (retried)     {:>10}\n", s.unknown));
        out.push_str(&format!(
            "  history rows in database {:>9}  (all runs; inbox and history consistent: {})\n",
            self.history_rows,
            if self.consistent { "yes" } else { "NO" }
        ));
        out.push_str(&format!(
            "  dead letters stored     {:>10}  (by this run, table dead_letters)\n",
            self.dead_letters
        ));
        out.push_str("  committed offsets (group history-demo)\n");
        for (partition, (committed, end)) in self.committed.iter().zip(&self.ends).enumerate() {
            out.push_str(&format!(
                "    {topic}[{partition}]  committed {:>8}  end {:>8}\n",
                committed.map_or("-".to_owned(), |c| c.to_string()),
                end
            ));
        }
        out.push_str(&format!(
            "  throughput              {:>10.0} records/s  ({} records in {:.2?}, first fetch to final commit)\n",
            rate, self.produced, self.elapsed
        ));
        out
    }

    /// Whether the run did what the service promises: every event once, every poison record kept.
    pub fn is_correct(&self) -> bool {
        let s = &self.stats;
        self.consistent
            && s.dead_lettered as usize == self.expected_poison
            && self.dead_letters as usize == self.expected_poison
            && (s.applied + s.already_applied) as usize
                == self.expected_events + self.expected_duplicates
            && self
                .committed
                .iter()
                .zip(&self.ends)
                .all(|(c, e)| *e == 0 || *c == Some(*e))
    }
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            records: 20_000,
            partitions: 3,
            duplicates: 0.1,
            poison: 0.0005,
            topic: "tickets.status.v1".to_owned(),
            timeout: Duration::from_secs(300),
        }
    }
}
