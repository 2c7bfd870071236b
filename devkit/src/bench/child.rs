//! The service under test: `history-service run` as a child process, configured for a phase.

use std::time::{Duration, Instant};

use secrecy::ExposeSecret;

use super::BenchOptions;
use super::report::Transactions;
use crate::DevError;
use crate::process::{Process, local_listener};
use history_service::config::Settings;
use history_service::metrics::RECORDS_FETCHED_TOTAL;

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

/// Where the service's logs of a run are written, if set: each phase's service to this path
/// with its group appended (`PATH.bench-latency-…`).
pub const SERVICE_LOG_ENV: &str = "HISTORY_BENCH_SERVICE_LOG";

/// A `history-service run` child process serving its endpoints on a socket the benchmark bound,
/// so its /metrics is known from the start.
pub(super) struct ServiceChild {
    process: Process,
    metrics_port: u16,
}

impl ServiceChild {
    pub(super) fn spawn(
        settings: &Settings,
        options: &BenchOptions,
        brokers: &str,
        database: &tokio_postgres::Config,
        group: &str,
        topic: &str,
    ) -> Result<Self, DevError> {
        let cannot_start =
            |err: std::io::Error| DevError::Bench(format!("cannot start the service: {err}"));
        let listener = local_listener().map_err(cannot_start)?;
        let metrics_port = listener.local_addr().map_err(cannot_start)?.port();
        let mut command = Process::command(service_binary()?)
            .arg("run")
            .envs(&service_env(
                settings, options, brokers, database, group, topic,
            ))
            .env_remove("HISTORY_CONFIG");
        // The service's log, for reading what it did in a run (its WARNs, the turns).
        if let Some(path) = std::env::var_os(SERVICE_LOG_ENV) {
            let mut path = path;
            path.push(format!(".{group}"));
            command = command.log_file(path);
        }
        let process = command.hand_over(listener).spawn().map_err(cannot_start)?;
        Ok(ServiceChild {
            process,
            metrics_port,
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.process.id()
    }

    /// When a line containing `needle` was logged, if it was.
    pub(super) fn seen(&self, needle: &str) -> Option<Instant> {
        self.process.seen(needle)
    }

    pub(super) fn exited(&mut self) -> bool {
        self.process.exit_status().is_some()
    }

    pub(super) fn log_tail(&self) -> String {
        self.process.log_tail(20)
    }

    /// The service's /metrics (empty if it does not answer).
    fn metrics(&self) -> String {
        crate::probe::get(self.metrics_port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Records the service has fetched from Kafka so far, by its own count.
    pub(super) fn records_fetched(&self) -> f64 {
        crate::probe::sample(&self.metrics(), RECORDS_FETCHED_TOTAL).unwrap_or(0.0)
    }

    /// The service's own account of its transactions, from its /metrics.
    pub(super) fn transactions(&self) -> Transactions {
        let text = self.metrics();
        let value = |series: &str| crate::probe::sample(&text, series).unwrap_or(0.0);
        let count = value("history_transaction_seconds_count");
        Transactions {
            count: count as u64,
            mean_ms: value("history_transaction_seconds_sum") / count.max(1.0) * 1e3,
            mean_events: value("history_batch_events_sum") / count.max(1.0),
        }
    }

    /// Peak resident set size so far, in MB (VmHWM).
    pub(super) fn peak_rss_mb(&self) -> f64 {
        self.process.peak_rss_mb()
    }

    /// SIGTERM, a graceful stop of at most 30 s, then SIGKILL.
    pub(super) fn stop(mut self) {
        let _ = self.process.stop(Duration::from_secs(30));
    }
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
        ("HISTORY__LOG__FORMAT", "human".to_owned()),
        ("HISTORY__LOG__FILTER", "info".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
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
