//! One `history-service run` instance of a run: started on a listening socket handed over to it,
//! its JSON log appended to a file and read for the commits and rebalances it reports.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

use history_devkit::process::{Process, StillRunning, local_listener};

use crate::checker::{CommitSeen, Owned, Truncated};
use crate::outcomes::Claims;
use crate::schedule::{GROUP, MAX_PAYLOAD, TOPIC};

/// Each instance's writers (`pipeline.writers`) and the most events in a batch of theirs
/// (`pipeline.batch_max_events`).
const WRITERS: u64 = 2;
const BATCH_MAX_EVENTS: u64 = 200;

/// The most events a killed instance may have applied after its last scrape: each writer's
/// transaction under way then, and the next one it may have sent before the kill
/// ([`crate::outcomes`]).
pub const IN_FLIGHT_AT_KILL: u64 = 2 * WRITERS * BATCH_MAX_EVENTS;

/// The consumer-group protocol the instances speak (`kafka.group_protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Classic,
    /// KIP-848: the broker assigns and owns the session timeout.
    Consumer,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Classic => "classic",
            Protocol::Consumer => "consumer",
        }
    }

    /// How long a member that stopped heartbeating keeps its partitions: short, so a crashed
    /// or frozen member's partitions move soon (`kafka.session_timeout_ms` under classic; the
    /// embedded broker's setting under consumer).
    pub fn session_timeout(self) -> Duration {
        match self {
            Protocol::Classic => Duration::from_secs(3),
            Protocol::Consumer => {
                Duration::from_millis(history_devkit::broker::CONSUMER_SESSION_TIMEOUT_MS as u64)
            }
        }
    }
}

/// What the instances' logs report, gathered from all of them.
#[derive(Clone)]
pub struct LogFeed {
    pub commits: Sender<CommitSeen>,
    pub rebalances: Arc<AtomicUsize>,
    pub assignments_lost: Arc<AtomicUsize>,
    /// Every assignment each instance's log reports, from its start to its end.
    pub owned: Arc<std::sync::Mutex<Vec<Owned>>>,
    /// The partitions the instances' clients reset after detecting a log truncation.
    pub truncated: Arc<std::sync::Mutex<Vec<Truncated>>>,
    /// The instance each member id the group coordinator gave belongs to (from the member id
    /// its assignment lines carry).
    pub members: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    /// Each lifetime's count of its outcomes, from its exit line, by lifetime.
    pub exits: Arc<std::sync::Mutex<std::collections::HashMap<String, Claims>>>,
}

/// The partition numbers and epochs of a rebalance line (`partitions=["t[4]", …]`,
/// `epochs=[3, …]`, in the same order).
fn assignments_of(entry: &serde_json::Value) -> Vec<(i32, u64)> {
    let partitions = entry["partitions"]
        .as_str()
        .unwrap_or_default()
        .split('[')
        .filter_map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        });
    let epochs = entry["epochs"]
        .as_str()
        .unwrap_or_default()
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .filter_map(|epoch| epoch.trim().parse().ok());
    partitions.zip(epochs).collect()
}

/// The partition of a librdkafka line about `TOPIC` (`… tickets.status.v1 [2]: offset reset …`).
fn truncated_partition(message: &str) -> Option<i32> {
    let rest = &message[message.find(&format!("{TOPIC} ["))? + TOPIC.len() + 2..];
    rest.split(']').next()?.parse().ok()
}

impl LogFeed {
    /// Ends instance `n`'s assignments that a released or lost line names.
    fn release(&self, n: usize, entry: &serde_json::Value, at: chrono::DateTime<chrono::Utc>) {
        let ended = assignments_of(entry);
        for assignment in self.owned.lock().unwrap().iter_mut() {
            if assignment.0 == n
                && assignment.4.is_none()
                && ended.contains(&(assignment.1, assignment.2))
            {
                assignment.4 = Some(at);
            }
        }
    }

    /// One line of instance `n`'s log, written in its lifetime `lifetime`.
    fn read(&self, n: usize, lifetime: &str, line: &str) {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        let at = || {
            entry["timestamp"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .expect("log lines carry an RFC 3339 timestamp")
                .to_utc()
        };
        match entry["message"].as_str() {
            Some("offset committed") => {
                let partition = entry["partition"].as_i64().unwrap() as i32;
                let offset = entry["offset"].as_i64().unwrap();
                let epoch = entry["epoch"].as_u64().unwrap_or_default();
                // When the commit left, not when its confirmation was logged: lines written by
                // different threads of one instance can come out of the order commits left in.
                let queued_at = entry["queued_at"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.to_utc())
                    .unwrap_or_else(at);
                let _ = self.commits.send((n, partition, offset, queued_at, epoch));
            }
            Some("partitions assigned") => {
                self.rebalances.fetch_add(1, Ordering::Relaxed);
                if let Some(member) = entry["member_id"].as_str().filter(|m| !m.is_empty()) {
                    self.members.lock().unwrap().insert(member.to_owned(), n);
                }
                let mut owned = self.owned.lock().unwrap();
                let at = at();
                for (partition, epoch) in assignments_of(&entry) {
                    owned.push((n, partition, epoch, at, None));
                }
            }
            Some("partitions revoked") => {
                self.rebalances.fetch_add(1, Ordering::Relaxed);
            }
            Some("revoke handled: partitions released") => self.release(n, &entry, at()),
            Some("assignment lost: nothing is committed") => {
                self.rebalances.fetch_add(1, Ordering::Relaxed);
                self.assignments_lost.fetch_add(1, Ordering::Relaxed);
                self.release(n, &entry, at());
            }
            Some(message)
                if message.starts_with("librdkafka:")
                    && message.contains("Partition log truncation detected") =>
            {
                if let Some(partition) = truncated_partition(message) {
                    self.truncated.lock().unwrap().push((n, partition, at()));
                }
            }
            Some(message) if message.starts_with("history-service stopped") => {
                let count = |field: &str| {
                    entry[field].as_u64().unwrap_or_else(|| {
                        panic!("the exit line of {lifetime} has no count {field:?}: {line}")
                    })
                };
                let claims = Claims {
                    applied: count("applied"),
                    already_applied: count("already_applied"),
                    unknown: count("unknown"),
                };
                self.exits
                    .lock()
                    .unwrap()
                    .insert(lifetime.to_owned(), claims);
            }
            // A restarted instance holds nothing of its earlier life.
            Some("history-service starting") => {
                let at = at();
                for assignment in self.owned.lock().unwrap().iter_mut() {
                    if assignment.0 == n && assignment.4.is_none() {
                        assignment.4 = Some(at);
                    }
                }
            }
            _ => {}
        }
    }
}

/// A running instance.
pub struct Instance {
    process: Process,
    /// Where its endpoints (`/metrics`) are served.
    port: u16,
    /// This lifetime's name: its database sessions' `application_name`
    /// ([`crate::outcomes`]).
    pub lifetime: String,
}

impl Instance {
    /// Starts instance `n` of `binary` for its lifetime `lifetime`, which names its database
    /// sessions; its log is appended to `dir/instance-{n}.log` (a restarted instance continues
    /// the file) and read into `feed`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        binary: &Path,
        n: usize,
        lifetime: &str,
        dir: &Path,
        database_url: &str,
        brokers: &str,
        protocol: Protocol,
        feed: LogFeed,
    ) -> Instance {
        let listener = local_listener().unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(dir.join(format!("instance-{n}.log")))
            .unwrap();
        let env: Vec<(String, String)> = [
            (
                "HISTORY__DATABASE__URL",
                format!("{database_url}?application_name={lifetime}"),
            ),
            ("HISTORY__DATABASE__CONNECT_TIMEOUT_MS", "1000".into()),
            ("HISTORY__KAFKA__BROKERS", brokers.to_owned()),
            ("HISTORY__KAFKA__GROUP_ID", GROUP.into()),
            ("HISTORY__KAFKA__TOPICS", TOPIC.into()),
            ("HISTORY__KAFKA__GROUP_PROTOCOL", protocol.name().into()),
            ("HISTORY__KAFKA__FETCH_WAIT_MAX_MS", "20".into()),
            ("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "100".into()),
            ("HISTORY__PIPELINE__RETRY_INITIAL_MS", "50".into()),
            ("HISTORY__PIPELINE__RETRY_MAX_MS", "1000".into()),
            (
                "HISTORY__PIPELINE__MAX_IN_FLIGHT_PER_PARTITION",
                "300".into(),
            ),
            ("HISTORY__PIPELINE__WRITERS", WRITERS.to_string()),
            (
                "HISTORY__PIPELINE__BATCH_MAX_EVENTS",
                BATCH_MAX_EVENTS.to_string(),
            ),
            // Small oversized poison keeps a long run within the broker's retention.
            (
                "HISTORY__PIPELINE__MAX_PAYLOAD_BYTES",
                MAX_PAYLOAD.to_string(),
            ),
            ("HISTORY__LOG__FORMAT", "json".into()),
            (
                "HISTORY__LOG__FILTER",
                "info,history_service::commits=debug".into(),
            ),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .chain(
            // Under `consumer` the broker owns the session timeout (and refuses ours).
            (protocol == Protocol::Classic).then(|| {
                (
                    "HISTORY__KAFKA__SESSION_TIMEOUT_MS".to_owned(),
                    protocol.session_timeout().as_millis().to_string(),
                )
            }),
        )
        .collect();
        let named = lifetime.to_owned();
        let process = Process::command(binary)
            .arg("run")
            .envs(&env)
            .env_remove("RUST_LOG")
            .env_remove("HISTORY_CONFIG")
            .hand_over(listener)
            .on_line(move |line| {
                let _ = writeln!(log, "{line}");
                feed.read(n, &named, line);
            })
            .spawn()
            .unwrap();
        Instance {
            process,
            port,
            lifetime: lifetime.to_owned(),
        }
    }

    /// SIGKILL: no LeaveGroup, no final commit. Returns once every line it wrote was read.
    pub fn kill(mut self) {
        self.process.kill();
    }

    /// SIGSTOP or SIGCONT: a member frozen (a GC pause, a stalled VM) and thawed.
    pub fn signal(&mut self, signal: history_devkit::process::Signal) {
        self.process.signal(signal);
    }

    /// SIGTERM: the graceful stop, waited for by [`Instance::wait_stopped`].
    pub fn terminate(&mut self) {
        self.process.terminate();
    }

    /// Waits for the exit after [`Instance::terminate`]; an instance still running then is
    /// killed. Once it returns, every line the instance wrote was read.
    pub fn wait_stopped(mut self, timeout: Duration) -> Result<ExitStatus, StillRunning> {
        self.process.wait_exit(timeout)
    }

    /// Its /metrics, empty if it does not answer.
    pub fn metrics(&self) -> String {
        history_devkit::probe::get(self.port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }
}
