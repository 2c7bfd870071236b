//! `history-dev bench --fairness`: how the real service shares a slow database between
//! partitions that are all backlogged, and how long a quiet partition's new event waits
//! meanwhile — the two figures of the fairness issue:
//!
//! - **shares**: with every partition but one backlogged and the database slowed to about a
//!   tenth of its speed, each backlogged partition's rows in every 5 s window (sliding by the
//!   0.5 s of the sampling), divided by its fair share of that window (the window's rows over
//!   the partitions still backlogged at its end). The target: at least half, always.
//! - **quiet latency**: the one partition without a backlog gets an event every 250 ms while the
//!   others drain; produce → row committed, seen through a NOTIFY at commit. The target:
//!   p99 within 1 s.
//!
//! The database is slowed honestly, inside PostgreSQL: a statement-level trigger on
//! `history_events` sleeps `rows × delay` for every insert statement, the delay calibrated from
//! the service's own unslowed drain (measured first, on a topic and a database of their own) so
//! that the writers' transactions take about ten times as long. Per statement, not per row:
//! `pg_sleep` waits whole milliseconds at least, and the delay per row is a fraction of one.
//! The same trigger counts the rows of each partition into a side table: rows become visible
//! there exactly when the batch commits, and sampling it reads a few hundred small rows instead
//! of counting the history table. The schema has no partition column, so the partition is
//! carried in the benchmark's event ids (`fair-<run>-p<partition>-<n>`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::child::ServiceChild;
use super::{BenchDatabases, BenchOptions, phases};
use crate::DevError;
use crate::broker::EmbeddedBroker;
use crate::group::GroupInspector;
use crate::workload::{self, PlannedRecord, RecordKind};
use history_service::config::Settings;
use history_service::store::{Database, StoreError, migrate, verify};

/// The backlog `--fairness` produces unless `--events` says otherwise: 20,000 records on each
/// of 23 backlogged partitions, which last 42 s at a tenth of 110,000 events/s (the fastest
/// unslowed drain seen on the 2-core machine; 90 s at a tenth of 50,000).
pub const DEFAULT_EVENTS: usize = 460_000;

/// Records per backlogged partition at most. A backlog record takes about 175 bytes of the
/// embedded broker's log (a 152-byte payload, its key, the record's framing), which keeps
/// 5 MiB per partition: 25,000 are 4.1 MiB. Placed by partition, not by key, so there is no
/// spread to leave room for (unlike [`super::shapes::RECORDS_PER_PARTITION`]); the watermarks
/// are checked after producing all the same.
const RECORDS_PER_PARTITION: usize = 25_000;

/// How much slower than its measured speed the database is made.
const SLOWDOWN: f64 = 10.0;

/// Records of the unslowed calibration drain: a couple of seconds of draining, long enough
/// for the start of the drain not to weigh much.
const CALIBRATION_EVENTS: usize = 100_000;

const SAMPLE_EVERY: Duration = Duration::from_millis(500);
const WINDOW: Duration = Duration::from_secs(5);
/// A window ends at the first sample no earlier than [`WINDOW`] less this after its start:
/// samples are due every 0.5 s, and one read a few milliseconds early must not stretch the
/// window to 5.5 s.
const WINDOW_SLACK: Duration = Duration::from_millis(100);
const QUIET_EVERY: Duration = Duration::from_millis(250);

/// The service's start (migrations, joining the group) and its first batch.
const FIRST_ROWS_WITHIN: Duration = Duration::from_secs(60);
/// A slowed database still writes a batch in well under a second; this long without a row of
/// the backlog is a stall, not slowness.
const STALL: Duration = Duration::from_secs(60);
/// The quiet events not yet written when the backlog is, written after it.
const QUIET_WITHIN: Duration = Duration::from_secs(60);
/// A sampling read (a few hundred rows of the side table).
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Below this the windows are few and the start of the drain weighs much: said, not refused.
const SHORTEST_USEFUL_DRAIN: Duration = Duration::from_secs(40);

const TOPIC: &str = "bench.fair";
const CALIBRATION_TOPIC: &str = "bench.fair.calibration";
const NOTIFY_CHANNEL: &str = "bench_fair_quiet";

/// Cumulative rows written per partition, read `at` seconds into the phase.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub at: f64,
    pub rows: Vec<u64>,
}

/// The shares of the backlogged partitions over the sliding windows.
#[derive(Debug, Clone, PartialEq)]
pub struct Shares {
    /// Windows measured: those starting at or after the first sample with rows and ending where
    /// at least two partitions were still backlogged (with one, its share is 1 by definition).
    pub windows: usize,
    /// Of those, the windows that ended with every backlogged partition still backlogged.
    pub full_windows: usize,
    /// Windows in which some partition got less than half its fair share.
    pub below_half: usize,
    /// Where the last of them starts, seconds into the phase: whether they were the first
    /// windows only (before the service could know the database is slow) or all along.
    pub last_below_half_at: Option<f64>,
    /// The smallest share of any partition in any window; `None` without a window.
    pub min: Option<MinShare>,
}

/// The smallest share, and where it was.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinShare {
    pub share: f64,
    /// The window's start, seconds into the phase.
    pub at: f64,
    pub partition: usize,
}

impl Shares {
    pub fn below_half_fraction(&self) -> f64 {
        self.below_half as f64 / self.windows.max(1) as f64
    }

    pub fn min_share(&self) -> f64 {
        self.min.map_or(f64::NAN, |min| min.share)
    }
}

/// The first sample with any row of the backlogged partitions.
fn first_rows(samples: &[Sample], backlogged: &[usize]) -> Option<usize> {
    samples
        .iter()
        .position(|s| backlogged.iter().any(|&p| s.rows[p] > 0))
}

/// The first sample a window of `window` seconds starting at sample `start` ends at.
fn window_end(samples: &[Sample], start: usize, window: f64) -> Option<usize> {
    let at = samples[start].at + window - WINDOW_SLACK.as_secs_f64();
    (start + 1..samples.len()).find(|&j| samples[j].at >= at)
}

/// Every backlogged partition's share of every window: its rows in the window over the
/// window's rows divided by the partitions still backlogged (fewer rows written than
/// `totals`) at the window's end. A partition that ran out during a window is left out of that
/// window, rows and all: it was not backlogged. A window with no row written is not a share
/// of anything and is skipped.
pub fn shares(samples: &[Sample], backlogged: &[usize], totals: &[u64], window: f64) -> Shares {
    let mut result = Shares {
        windows: 0,
        full_windows: 0,
        below_half: 0,
        last_below_half_at: None,
        min: None,
    };
    let Some(first) = first_rows(samples, backlogged) else {
        return result;
    };
    for start in first..samples.len() {
        let Some(end) = window_end(samples, start, window) else {
            break;
        };
        let (from, to) = (&samples[start].rows, &samples[end].rows);
        let still: Vec<usize> = backlogged
            .iter()
            .copied()
            .filter(|&p| to[p] < totals[p])
            .collect();
        if still.len() < 2 {
            continue;
        }
        let written: u64 = still.iter().map(|&p| to[p] - from[p]).sum();
        if written == 0 {
            continue;
        }
        let fair = written as f64 / still.len() as f64;
        result.windows += 1;
        if still.len() == backlogged.len() {
            result.full_windows += 1;
        }
        let mut below = false;
        for &p in &still {
            let share = (to[p] - from[p]) as f64 / fair;
            below |= share < 0.5;
            if result.min.is_none_or(|min| share < min.share) {
                result.min = Some(MinShare {
                    share,
                    at: samples[start].at,
                    partition: p,
                });
            }
        }
        if below {
            result.below_half += 1;
            result.last_below_half_at = Some(samples[start].at);
        }
    }
    result
}

/// The backlogged partitions' rows per second, from the first sample with rows to the last.
pub fn drain_rate(samples: &[Sample], backlogged: &[usize]) -> f64 {
    let Some(first) = first_rows(samples, backlogged) else {
        return 0.0;
    };
    let (a, b) = (&samples[first], &samples[samples.len() - 1]);
    let rows = |s: &Sample| backlogged.iter().map(|&p| s.rows[p]).sum::<u64>();
    (rows(b) - rows(a)) as f64 / (b.at - a.at).max(1e-9)
}

/// The samples the per-partition table is cut at, about `step` seconds apart: from the last
/// sample before the first row (so that the table holds every row) to the last sample.
pub fn table_cuts(samples: &[Sample], backlogged: &[usize], step: f64) -> Vec<usize> {
    let Some(first) = first_rows(samples, backlogged) else {
        return Vec::new();
    };
    let mut cuts = vec![first.saturating_sub(1)];
    while let Some(next) = window_end(samples, *cuts.last().unwrap(), step) {
        cuts.push(next);
    }
    let last = samples.len() - 1;
    if *cuts.last().unwrap() != last {
        cuts.push(last);
    }
    cuts
}

/// The `q` quantile of sorted values (nearest rank, as the latency phase takes it).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// What the fairness phase found.
#[derive(Debug, Clone)]
pub struct FairnessReport {
    pub partitions: i32,
    pub quiet: usize,
    pub events: usize,
    pub writers: usize,
    pub batch: usize,
    pub unslowed_eps: f64,
    pub calibration_events: usize,
    pub delay_us_per_row: f64,
    pub slowed_eps: f64,
    /// From the first sample with rows to the one that saw the whole backlog written.
    pub drain_seconds: f64,
    pub shares: Shares,
    pub samples: Vec<Sample>,
    /// Produce → row committed of the quiet partition's events sent while the others drained,
    /// sorted, in milliseconds.
    pub quiet_ms: Vec<f64>,
    pub verified: bool,
}

impl FairnessReport {
    fn backlogged(&self) -> Vec<usize> {
        (0..self.partitions as usize)
            .filter(|&p| p != self.quiet)
            .collect()
    }

    pub fn render(&self) -> String {
        let backlogged = self.backlogged();
        let mut out = format!(
            "history-dev bench --fairness: {} partitions ({} backlogged, {} records in all; \
             partition {} quiet), {} writers, batches of {}\n",
            self.partitions,
            backlogged.len(),
            self.events,
            self.quiet,
            self.writers,
            self.batch
        );
        out.push_str(&format!(
            "  unslowed: {:.0} events/s (the service draining {} records); the database slowed \
             {SLOWDOWN:.0}x: a trigger sleeps {:.0} us per row written\n",
            self.unslowed_eps, self.calibration_events, self.delay_us_per_row
        ));
        out.push_str(&format!(
            "  slowed: {:.0} events/s ({:.3} of unslowed); the backlog took {:.1} s from the \
             first rows\n",
            self.slowed_eps,
            self.slowed_eps / self.unslowed_eps.max(1e-9),
            self.drain_seconds
        ));
        let s = &self.shares;
        out.push_str(&format!(
            "  shares over {:.0} s windows (sliding by {:.1} s): {} windows ({} with every \
             partition backlogged), min share {:.2}{}, below half its share in {} ({:.0}%){}\n",
            WINDOW.as_secs_f64(),
            SAMPLE_EVERY.as_secs_f64(),
            s.windows,
            s.full_windows,
            s.min_share(),
            s.min.map_or(String::new(), |min| format!(
                " (partition {}, window from {:.1} s)",
                min.partition, min.at
            )),
            s.below_half,
            s.below_half_fraction() * 100.0,
            s.last_below_half_at
                .map_or(String::new(), |at| format!(", the last from {at:.1} s"))
        ));
        out.push_str(&format!(
            "  quiet partition {}: an event every {} ms, {} sent while the others drained: \
             produce -> row committed p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms\n",
            self.quiet,
            QUIET_EVERY.as_millis(),
            self.quiet_ms.len(),
            self.p50(),
            self.p99(),
            self.max()
        ));
        out.push_str(&format!(
            "  database verified: {}\n",
            if self.verified { "yes" } else { "NO" }
        ));
        out.push_str(&self.table());
        out.push_str(&self.result_line());
        out.push('\n');
        out
    }

    /// Rows written per partition in each 5 s step, the quiet partition marked `q`.
    fn table(&self) -> String {
        let cuts = table_cuts(&self.samples, &self.backlogged(), WINDOW.as_secs_f64());
        if cuts.len() < 2 {
            return String::new();
        }
        let origin = self.samples[cuts[0]].at;
        let mut out = format!(
            "  rows written per partition, per {:.0} s (seconds from the last sample before \
             the first row):\n  partition",
            WINDOW.as_secs_f64()
        );
        for pair in cuts.windows(2) {
            out.push_str(&format!(
                " {:>7}",
                format!(
                    "{:.0}-{:.0}",
                    self.samples[pair[0]].at - origin,
                    self.samples[pair[1]].at - origin
                )
            ));
        }
        out.push('\n');
        for p in 0..self.partitions as usize {
            let name = if p == self.quiet {
                format!("{p}q")
            } else {
                p.to_string()
            };
            out.push_str(&format!("  {name:>9}"));
            for pair in cuts.windows(2) {
                let rows = self.samples[pair[1]].rows[p] - self.samples[pair[0]].rows[p];
                out.push_str(&format!(" {rows:>7}"));
            }
            out.push('\n');
        }
        out
    }

    fn p50(&self) -> f64 {
        quantile(&self.quiet_ms, 0.50)
    }

    fn p99(&self) -> f64 {
        quantile(&self.quiet_ms, 0.99)
    }

    fn max(&self) -> f64 {
        *self.quiet_ms.last().unwrap_or(&0.0)
    }

    /// The machine-readable summary, the last line of the output.
    pub fn result_line(&self) -> String {
        format!(
            "RESULT phase=fairness partitions={} slowed_eps={:.0} min_share={:.2} \
             windows_below_half={:.2} quiet_p50_ms={:.1} quiet_p99_ms={:.1} quiet_max_ms={:.1} \
             events={} unslowed_eps={:.0} windows={} full_windows={} last_below_half_s={}",
            self.partitions,
            self.slowed_eps,
            self.shares.min_share(),
            self.shares.below_half_fraction(),
            self.p50(),
            self.p99(),
            self.max(),
            self.events,
            self.unslowed_eps,
            self.shares.windows,
            self.shares.full_windows,
            self.shares
                .last_below_half_at
                .map_or("none".to_owned(), |at| format!("{at:.1}"))
        )
    }
}

/// The backlog: `events` records dealt round-robin over the backlogged partitions (each
/// partition set explicitly, each record a distinct event), the partition in every event id.
fn backlog(run_id: &str, events: usize, backlogged: &[usize], prefix: &str) -> Vec<PlannedRecord> {
    (0..events)
        .map(|n| {
            let partition = backlogged[n % backlogged.len()];
            let event_id = format!("{prefix}-{run_id}-p{partition}-{n}");
            let ticket = format!("ticket-{}", n % 10_000);
            let payload = workload::event_payload(
                &event_id,
                &ticket,
                "open",
                "in_progress",
                chrono::Utc::now(),
            );
            PlannedRecord {
                key: ticket.into_bytes(),
                payload: Some(payload),
                partition: Some(partition as i32),
                kind: RecordKind::Event { event_id },
            }
        })
        .collect()
}

/// The benchmark's probe and brake on `history_events`, outside the product's schema: per insert
/// statement, the rows of each partition counted into `bench_fair_rows` (visible when the batch
/// commits), the quiet partition's event ids notified (delivered at commit), and a sleep of
/// `delay_s` per row.
fn probe_sql(delay_s: f64) -> String {
    format!(
        "CREATE TABLE bench_fair_rows (partition int NOT NULL, rows bigint NOT NULL);
         CREATE FUNCTION bench_fair() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO bench_fair_rows (partition, rows)
             SELECT coalesce(substring(event_id FROM '-p([0-9]+)-')::int, -1), count(*)
             FROM new_rows GROUP BY 1;
             PERFORM pg_notify('{NOTIFY_CHANNEL}', event_id) FROM new_rows
             WHERE event_id LIKE '%-live-%';
             PERFORM pg_sleep((SELECT count(*) FROM new_rows) * {delay_s:.9});
             RETURN NULL;
         END $$;
         CREATE TRIGGER bench_fair AFTER INSERT ON history_events
         REFERENCING NEW TABLE AS new_rows
         FOR EACH STATEMENT EXECUTE FUNCTION bench_fair();"
    )
}

/// Cumulative rows per partition, as committed so far.
async fn read_rows(
    client: &tokio_postgres::Client,
    partitions: usize,
) -> Result<Vec<u64>, DevError> {
    let query = client.query(
        "SELECT partition, sum(rows)::bigint FROM bench_fair_rows GROUP BY partition",
        &[],
    );
    let rows = tokio::time::timeout(READ_TIMEOUT, query)
        .await
        .map_err(|_| {
            DevError::Bench(format!(
                "reading the rows written took over {READ_TIMEOUT:?}"
            ))
        })?
        .map_err(StoreError::from)?;
    let mut counts = vec![0u64; partitions];
    for row in rows {
        let (partition, count): (i32, i64) = (row.get(0), row.get(1));
        match counts.get_mut(partition as usize) {
            Some(slot) if partition >= 0 => *slot = count as u64,
            _ => {
                return Err(DevError::Bench(format!(
                    "{count} rows written for partition {partition}: an event id without its \
                     partition"
                )));
            }
        }
    }
    Ok(counts)
}

/// When each quiet event's row was committed, as its NOTIFY arrives.
struct Notifications {
    received: mpsc::UnboundedReceiver<(String, Instant)>,
    committed: HashMap<String, Instant>,
    task: tokio::task::JoinHandle<()>,
    _client: tokio_postgres::Client,
}

impl Notifications {
    /// LISTENs on a connection of its own; returns once the server has confirmed the LISTEN, so
    /// nothing committed afterwards is missed.
    async fn listen(database: &tokio_postgres::Config) -> Result<Self, DevError> {
        let (client, mut connection) = database
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(StoreError::from)?;
        let (sender, received) = mpsc::unbounded_channel();
        // Polling the connection also carries the client's LISTEN below; a notification is
        // timed here, the moment it is read off the socket.
        let task = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = futures::StreamExt::next(&mut messages).await {
                if let tokio_postgres::AsyncMessage::Notification(note) = message {
                    if sender
                        .send((note.payload().to_owned(), Instant::now()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}"))
            .await
            .map_err(StoreError::from)?;
        Ok(Notifications {
            received,
            committed: HashMap::new(),
            task,
            _client: client,
        })
    }

    /// Takes what has arrived.
    fn collect(&mut self) {
        while let Ok((id, at)) = self.received.try_recv() {
            self.committed.insert(id, at);
        }
    }

    /// Waits until every one of `ids` has arrived, until `deadline`.
    async fn wait_for(&mut self, ids: &[&str], deadline: Instant) -> Result<(), DevError> {
        self.collect();
        loop {
            let missing = ids
                .iter()
                .filter(|id| !self.committed.contains_key(**id))
                .count();
            if missing == 0 {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline.into(), self.received.recv()).await {
                Ok(Some((id, at))) => {
                    self.committed.insert(id, at);
                }
                Ok(None) => {
                    return Err(DevError::Bench(
                        "the notifications' connection closed".into(),
                    ));
                }
                Err(_) => {
                    return Err(DevError::Bench(format!(
                        "{missing} of the quiet partition's {} events were not written within \
                         {QUIET_WITHIN:?} after the backlog",
                        ids.len()
                    )));
                }
            }
        }
    }
}

impl Drop for Notifications {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The quiet partition's producer: an event every [`QUIET_EVERY`] until `stop`; returns each
/// event's id and when it was handed to the producer.
fn produce_quiet(
    brokers: &str,
    partition: i32,
    run_id: &str,
    stop: &AtomicBool,
) -> Result<Vec<(String, Instant)>, DevError> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "0")
        .create()?;
    let started = Instant::now();
    let mut sent = Vec::new();
    for n in 0u32.. {
        // The pace of the load, not a wait for anything.
        let due = started + QUIET_EVERY * n;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let event_id = format!("fair-{run_id}-p{partition}-live-{n}");
        let ticket = format!("ticket-quiet-{}", n % 100);
        let payload =
            workload::event_payload(&event_id, &ticket, "open", "closed", chrono::Utc::now());
        let record = BaseRecord::<[u8], [u8]>::to(TOPIC)
            .key(ticket.as_bytes())
            .payload(&payload)
            .partition(partition);
        let at = Instant::now();
        producer
            .send(record)
            .map_err(|(err, _)| DevError::Kafka(err))?;
        sent.push((event_id, at));
    }
    producer.flush(Duration::from_secs(10))?;
    Ok(sent)
}

/// Produces `records` to `topic` and checks the broker kept every one: returns each
/// partition's end.
async fn produce_all(
    brokers: &str,
    inspector: &GroupInspector,
    topic: &str,
    partitions: i32,
    records: Vec<PlannedRecord>,
    batch_bytes: Option<usize>,
) -> Result<Vec<i64>, DevError> {
    let count = records.len();
    let started = Instant::now();
    let produce = {
        let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
        tokio::task::spawn_blocking(move || {
            let batch = batch_bytes.map(|bytes| bytes.to_string());
            let properties: Vec<(&str, &str)> = batch
                .iter()
                .map(|bytes| ("batch.size", bytes.as_str()))
                .collect();
            workload::produce_with(&brokers, &topic, &records, &properties)
        })
    };
    produce.await.expect("producer thread")?;
    for partition in 0..partitions {
        let (low, _) = inspector.watermarks(topic, partition, Duration::from_secs(5))?;
        if low > 0 {
            return Err(DevError::Bench(format!(
                "{topic}[{partition}] dropped its first {low} records (the embedded broker keeps \
                 5 MiB per partition): use fewer --events or more --partitions"
            )));
        }
    }
    let ends = inspector.ends(topic, partitions, Duration::from_secs(10))?;
    eprintln!(
        "  produced {count} records to {topic} in {:.1?}",
        started.elapsed()
    );
    Ok(ends)
}

pub async fn run(settings: &Settings, options: &BenchOptions) -> Result<FairnessReport, DevError> {
    let partitions = options.partitions;
    if partitions < 3 {
        return Err(DevError::Bench(format!(
            "--fairness needs at least 3 partitions (one quiet, two backlogged to share), not \
             {partitions}"
        )));
    }
    let quiet = partitions as usize - 1;
    let backlogged: Vec<usize> = (0..quiet).collect();
    let per_partition = options.events.div_ceil(backlogged.len());
    if per_partition > RECORDS_PER_PARTITION {
        return Err(DevError::Bench(format!(
            "--events {} is {per_partition} records on each of {} backlogged partitions; the \
             embedded broker keeps about {RECORDS_PER_PARTITION}: use fewer --events or more \
             --partitions",
            options.events,
            backlogged.len()
        )));
    }
    let run_id = format!("{:08x}", rand::random::<u32>());
    let broker = EmbeddedBroker::start(1)?;
    broker.create_topic(CALIBRATION_TOPIC, partitions)?;
    broker.create_topic(TOPIC, partitions)?;
    let brokers = broker.bootstrap_servers();
    let server = crate::postgres::prepare(&settings.database.postgres_config()?).await?;
    let databases = BenchDatabases::new(&server.config, &run_id, options.keep_databases);
    let inspector = GroupInspector::new(&brokers, "bench-fair-inspector")?;
    let result = measure(
        settings,
        options,
        &brokers,
        &server.config,
        &databases,
        &inspector,
        &run_id,
        &backlogged,
        quiet,
    )
    .await;
    databases.drop_all().await;
    drop(server);
    result
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    settings: &Settings,
    options: &BenchOptions,
    brokers: &str,
    server: &tokio_postgres::Config,
    databases: &BenchDatabases,
    inspector: &GroupInspector,
    run_id: &str,
    backlogged: &[usize],
    quiet: usize,
) -> Result<FairnessReport, DevError> {
    let partitions = options.partitions;
    let all: Vec<usize> = (0..partitions as usize).collect();

    // The database's speed, as the service meets it: its own drain with nothing slowed.
    let calibration_events = CALIBRATION_EVENTS.min(options.events.max(1));
    eprintln!("calibration: the service draining {calibration_events} records, unslowed...");
    let ends = produce_all(
        brokers,
        inspector,
        CALIBRATION_TOPIC,
        partitions,
        backlog(run_id, calibration_events, &all, "cal"),
        None,
    )
    .await?;
    let calibration_db = databases.create("fair_calibration").await?;
    let calibration_options = BenchOptions {
        events: calibration_events,
        ..options.clone()
    };
    let drain = phases::measure_service(
        settings,
        &calibration_options,
        brokers,
        server,
        &calibration_db,
        CALIBRATION_TOPIC,
        &ends,
        run_id,
    )
    .await?;
    let unslowed_eps = drain.rate.per_second();
    // A writer spends writers / rate per event; adding (SLOWDOWN - 1) times that as sleep makes
    // each transaction, and so the drain, SLOWDOWN times slower.
    let delay_s = (SLOWDOWN - 1.0) * options.writers.max(1) as f64 / unslowed_eps.max(1.0);
    eprintln!(
        "  {unslowed_eps:.0} events/s: the trigger will sleep {:.0} us per row",
        delay_s * 1e6
    );

    eprintln!(
        "fairness: producing the backlog ({} records over {} partitions; partition {quiet} \
         quiet)...",
        options.events,
        backlogged.len()
    );
    let records = backlog(run_id, options.events, backlogged, "fair");
    let mut totals = vec![0u64; partitions as usize];
    for record in &records {
        totals[record
            .partition
            .expect("backlog records name their partition") as usize] += 1;
    }
    produce_all(
        brokers,
        inspector,
        TOPIC,
        partitions,
        records,
        options.producer_batch_bytes,
    )
    .await?;

    let database = databases.create("fairness").await?;
    let client = Database::plain(database.clone()).connect().await?;
    {
        let mut migrating = Database::plain(database.clone()).connect().await?;
        migrate::run_migrations(&mut migrating).await?;
    }
    client
        .batch_execute(&probe_sql(delay_s))
        .await
        .map_err(StoreError::from)?;
    let mut notifications = Notifications::listen(&database).await?;

    eprintln!("fairness: the service draining the backlog against the slowed database...");
    let group = format!("bench-fair-{run_id}");
    let mut child = ServiceChild::spawn(settings, options, brokers, &database, &group, TOPIC)?;
    let sampled = sample(
        &mut child, &client, options, brokers, run_id, backlogged, &totals, quiet,
    )
    .await;
    let (samples, drained_at, sent) = match sampled {
        Ok(sampled) => sampled,
        Err(err) => {
            child.stop();
            return Err(err);
        }
    };
    let ids: Vec<&str> = sent.iter().map(|(id, _)| id.as_str()).collect();
    let waited = notifications
        .wait_for(&ids, Instant::now() + QUIET_WITHIN)
        .await;
    child.stop();
    waited?;

    let mut quiet_ms: Vec<f64> = sent
        .iter()
        .filter(|(_, at)| *at < drained_at)
        .map(|(id, at)| (notifications.committed[id.as_str()] - *at).as_secs_f64() * 1e3)
        .collect();
    if quiet_ms.is_empty() {
        return Err(DevError::Bench(
            "no quiet event was sent while the backlog drained: use more --events".into(),
        ));
    }
    quiet_ms.sort_by(|a, b| a.total_cmp(b));
    let verified = {
        let report = verify::verify(&client, 5).await?;
        report.is_consistent() && report.history_rows == (options.events + sent.len()) as i64
    };
    let shares = shares(&samples, backlogged, &totals, WINDOW.as_secs_f64());
    if shares.windows == 0 {
        return Err(DevError::Bench(format!(
            "no {WINDOW:?} window with two partitions still backlogged: use more --events"
        )));
    }
    let slowed_eps = drain_rate(&samples, backlogged);
    let first = first_rows(&samples, backlogged).unwrap_or(0);
    let drain_seconds = samples[samples.len() - 1].at - samples[first].at;
    if drain_seconds < SHORTEST_USEFUL_DRAIN.as_secs_f64() {
        eprintln!(
            "  note: the backlog lasted {drain_seconds:.1} s, under {SHORTEST_USEFUL_DRAIN:?}: \
             few windows; more --events (and --partitions) make it longer"
        );
    }
    Ok(FairnessReport {
        partitions,
        quiet,
        events: options.events,
        writers: options.writers,
        batch: options.batch,
        unslowed_eps,
        calibration_events,
        delay_us_per_row: delay_s * 1e6,
        slowed_eps,
        drain_seconds,
        shares,
        samples,
        quiet_ms,
        verified,
    })
}

/// Samples the rows written every [`SAMPLE_EVERY`] until the whole backlog is written, starting
/// the quiet partition's producer at the first rows. Returns the samples, when the backlog was
/// seen written, and the quiet events sent.
#[allow(clippy::too_many_arguments)]
async fn sample(
    child: &mut ServiceChild,
    client: &tokio_postgres::Client,
    options: &BenchOptions,
    brokers: &str,
    run_id: &str,
    backlogged: &[usize],
    totals: &[u64],
    quiet: usize,
) -> Result<(Vec<Sample>, Instant, Vec<(String, Instant)>), DevError> {
    let started = Instant::now();
    let deadline = started + options.timeout;
    let mut ticker = tokio::time::interval(SAMPLE_EVERY);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut samples = Vec::new();
    let mut quiet_producer = None;
    let stop = Arc::new(AtomicBool::new(false));
    let (mut progress_at, mut progress) = (started, 0u64);
    let bench = DevError::Bench;
    let outcome = loop {
        ticker.tick().await;
        let now = Instant::now();
        if child.exited() {
            break Err(bench(format!("the service exited:\n{}", child.log_tail())));
        }
        if now > deadline {
            break Err(bench(format!(
                "the backlog was not written within {:?}:\n{}",
                options.timeout,
                child.log_tail()
            )));
        }
        let rows = match read_rows(client, totals.len()).await {
            Ok(rows) => rows,
            Err(err) => break Err(err),
        };
        let written: u64 = backlogged.iter().map(|&p| rows[p]).sum();
        if written > progress {
            (progress_at, progress) = (now, written);
        } else if progress == 0 && now - started > FIRST_ROWS_WITHIN {
            break Err(bench(format!(
                "the service wrote no row within {FIRST_ROWS_WITHIN:?}:\n{}",
                child.log_tail()
            )));
        } else if progress > 0 && now - progress_at > STALL {
            break Err(bench(format!(
                "no row of the backlog was written for {STALL:?}:\n{}",
                child.log_tail()
            )));
        }
        if written > 0 && quiet_producer.is_none() {
            let (brokers, run_id, stop) = (brokers.to_owned(), run_id.to_owned(), stop.clone());
            quiet_producer = Some(tokio::task::spawn_blocking(move || {
                produce_quiet(&brokers, quiet as i32, &run_id, &stop)
            }));
        }
        let done = backlogged.iter().all(|&p| rows[p] >= totals[p]);
        samples.push(Sample {
            at: (now - started).as_secs_f64(),
            rows,
        });
        if done {
            break Ok(now);
        }
    };
    stop.store(true, Ordering::Relaxed);
    let sent = match quiet_producer {
        Some(producer) => producer.await.expect("quiet producer thread")?,
        None => Vec::new(),
    };
    let drained_at = outcome?;
    Ok((samples, drained_at, sent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(rows: &[[u64; 3]]) -> Vec<Sample> {
        rows.iter()
            .enumerate()
            .map(|(n, r)| Sample {
                at: n as f64 * 0.5,
                rows: r.to_vec(),
            })
            .collect()
    }

    /// Partitions 0 and 1 backlogged (100 records each), 2 quiet; windows of 1 s = two steps.
    const BACKLOGGED: [usize; 2] = [0, 1];
    const TOTALS: [u64; 3] = [100, 100, 0];

    #[test]
    fn even_progress_is_a_share_of_one_in_every_window() {
        let s = samples(&[
            [0, 0, 0],
            [10, 10, 0],
            [20, 20, 1],
            [30, 30, 1],
            [40, 40, 2],
        ]);
        let shares = shares(&s, &BACKLOGGED, &TOTALS, 1.0);
        // Windows start at the first sample with rows (index 1) and need a sample 1 s later.
        assert_eq!(shares.windows, 2);
        assert_eq!(shares.full_windows, 2);
        assert_eq!(shares.below_half, 0);
        assert_eq!(shares.last_below_half_at, None);
        assert!((shares.min_share() - 1.0).abs() < 1e-9);
        assert!((drain_rate(&s, &BACKLOGGED) - 40.0).abs() < 1e-9);
    }

    #[test]
    fn one_partition_at_a_time_is_a_share_of_zero() {
        let s = samples(&[
            [0, 0, 0],
            [20, 0, 0],
            [40, 0, 0],
            [60, 0, 0],
            [60, 20, 0],
            [60, 40, 0],
        ]);
        let shares = shares(&s, &BACKLOGGED, &TOTALS, 1.0);
        // From 0.5 s partition 1 gets nothing, from 1.0 s both get 20, from 1.5 s partition 0
        // gets nothing.
        assert_eq!(shares.windows, 3);
        assert_eq!(shares.below_half, 2);
        assert_eq!(shares.last_below_half_at, Some(1.5));
        assert_eq!(
            shares.min,
            Some(MinShare {
                share: 0.0,
                at: 0.5,
                partition: 1
            })
        );
        assert!((shares.below_half_fraction() - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_partition_that_ran_out_is_not_counted_and_one_left_is_no_window() {
        let totals = [100, 30, 0];
        // Partition 1 runs out at 1.0 s; partition 0 alone afterwards.
        let s = samples(&[
            [0, 0, 0],
            [10, 10, 0],
            [20, 30, 0],
            [40, 30, 0],
            [60, 30, 0],
        ]);
        let shares = shares(&s, &BACKLOGGED, &totals, 1.0);
        assert_eq!(shares.windows, 0);
        assert_eq!(shares.min, None);
    }

    #[test]
    fn a_sample_read_slightly_early_still_ends_the_window() {
        let mut s = samples(&[[0, 0, 0], [10, 10, 0], [20, 20, 0], [30, 30, 0]]);
        s[3].at = 1.45; // 0.95 s after sample 1: within the slack
        assert_eq!(window_end(&s, 1, 1.0), Some(3));
        s[3].at = 1.3; // too early: no sample ends a window from sample 1
        assert_eq!(window_end(&s, 1, 1.0), None);
    }

    #[test]
    fn the_table_is_cut_from_the_last_empty_sample_to_the_end() {
        let s = samples(&[
            [0, 0, 0],
            [0, 0, 0],
            [10, 5, 0],
            [20, 10, 0],
            [30, 20, 0],
            [40, 30, 0],
        ]);
        assert_eq!(table_cuts(&s, &BACKLOGGED, 1.0), vec![1, 3, 5]);
        let s = samples(&[[0, 0, 0], [10, 5, 0], [20, 10, 0], [30, 20, 0]]);
        assert_eq!(table_cuts(&s, &BACKLOGGED, 1.0), vec![0, 2, 3]);
    }
}
