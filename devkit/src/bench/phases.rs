//! The throughput phases: the service draining the backlog, the client-side and server-side
//! ceilings of PostgreSQL, and the naive consumer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;

use super::backends::Backends;
use super::child::ServiceChild;
use super::report::{PgCpu, Rate, Transactions};
use super::{BenchOptions, TOPIC};
use crate::DevError;
use crate::cpu::{CpuTally, process_ticks};
use crate::group::GroupInspector;
use crate::workload::PlannedRecord;
use history_service::config::Settings;
use history_service::domain::{HistoryEvent, Outcome, process_history_batch, process_history_once};
use history_service::store::{Database, PgHistoryRepository, migrate};

/// How often the drain looks for the first fetch on /metrics: the first fetch is placed within
/// one such interval of when it happened, so it is short (the end is looked for every 20 ms, a
/// group lookup each time).
const FIRST_FETCH_POLL: Duration = Duration::from_millis(5);

/// What the drain came to.
pub(super) struct Drain {
    pub(super) rate: Rate,
    pub(super) peak_rss_mb: f64,
    pub(super) transactions: Transactions,
    /// CPU of PostgreSQL's backends serving the service's database, first fetch to the end.
    pub(super) pg_cpu: PgCpu,
    /// CPU of the service process, first fetch to the end.
    pub(super) service_cpu: Duration,
}

/// The drain: `history-service run` consumes the backlog of `topic` (`options.events` records)
/// until the group has committed `ends`; timed from its first fetch, by its own count on
/// /metrics.
#[allow(clippy::too_many_arguments)]
pub(super) async fn measure_service(
    settings: &Settings,
    options: &BenchOptions,
    brokers: &str,
    server: &tokio_postgres::Config,
    database: &tokio_postgres::Config,
    topic: &str,
    ends: &[i64],
    run_id: &str,
) -> Result<Drain, DevError> {
    let group = format!("bench-service-{run_id}-{topic}");
    let mut backends = Backends::connect(server, database).await?;
    let mut child = ServiceChild::spawn(settings, options, brokers, database, &group, topic)?;
    let inspector = GroupInspector::new(brokers, &group)?;
    let deadline = Instant::now() + options.timeout;
    let child_pid = child.pid();
    let child_ticks = || process_ticks(child_pid).map(|ticks| (child_pid, ticks));
    let mut peak = 0.0f64;
    // The start-up (migrations, joining the group) is not the drain: the clock and both CPU
    // tallies start at the first fetch, as the service counts it on /metrics.
    let started = loop {
        let asked = Instant::now();
        if child.records_fetched() > 0.0 {
            break asked;
        }
        peak = peak.max(child.peak_rss_mb());
        if child.exited() || Instant::now() > deadline {
            let tail = child.log_tail();
            child.stop();
            return Err(DevError::Bench(format!(
                "the service never fetched a record:\n{tail}"
            )));
        }
        actix_rt::time::sleep(FIRST_FETCH_POLL).await;
    };
    // Backends connected later count whole.
    let mut pg_cpu = CpuTally::start(backends.ticks().await);
    let mut service_cpu = CpuTally::start(child_ticks());
    let finished = loop {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
        peak = peak.max(child.peak_rss_mb());
        pg_cpu.record(backends.ticks().await);
        service_cpu.record(child_ticks());
        if child.exited() || Instant::now() > deadline {
            let tail = child.log_tail();
            child.stop();
            return Err(DevError::Bench(format!(
                "the service did not drain the backlog:\n{tail}"
            )));
        }
        // Checked here, between the samples, rather than by `group::wait_committed`: the drain
        // is timed to this 20 ms loop.
        if matches!(
            inspector.has_committed(topic, ends, Duration::from_secs(2)),
            Ok(true)
        ) {
            break Instant::now();
        }
    };
    peak = peak.max(child.peak_rss_mb());
    let transactions = child.transactions();
    child.stop();
    Ok(Drain {
        rate: Rate {
            events: options.events,
            elapsed: finished - started,
        },
        peak_rss_mb: peak,
        transactions,
        pg_cpu: backends.cpu(&pg_cpu),
        service_cpu: service_cpu.spent(),
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
pub(super) async fn measure_server_ceiling(
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

pub(super) async fn measure_ceiling(
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

pub(super) async fn measure_naive(
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
