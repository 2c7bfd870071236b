//! Shared helpers of the integration tests: domain fixtures and the old process helpers; the
//! throwaway database is the kit's (`history_devkit::test_db`).

pub use history_devkit::test_db::{TestDb, admin_client, base_url};

pub fn event(
    event_id: &str,
    from: &str,
    to: &str,
    at: &str,
) -> history_service::domain::HistoryEvent {
    history_service::domain::HistoryEvent {
        event_id: event_id.into(),
        ticket_id: "ticket-42".into(),
        from_status: from.into(),
        to_status: to.into(),
        changed_at: chrono::DateTime::parse_from_rfc3339(at).unwrap(),
    }
}

pub fn seed_900() -> history_service::domain::HistoryEvent {
    event(
        "event-ticket-900",
        "open",
        "resolved",
        "2026-10-03T08:00:00Z",
    )
}

pub fn seed_901() -> history_service::domain::HistoryEvent {
    event(
        "event-ticket-901",
        "resolved",
        "closed",
        "2026-10-03T08:01:00Z",
    )
}

/// The environment of a service under test: the defaults, fast timers, no HTTP. Used as is
/// for child processes, and through `Settings::load_from` in process.
pub fn service_env(
    database_url: &str,
    brokers: &str,
    group: &str,
    topic: &str,
) -> Vec<(String, String)> {
    [
        ("HISTORY__DATABASE__URL", database_url),
        ("HISTORY__DATABASE__POOL_SIZE", "8"),
        ("HISTORY__KAFKA__BROKERS", brokers),
        ("HISTORY__KAFKA__GROUP_ID", group),
        ("HISTORY__KAFKA__TOPICS", topic),
        ("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "3000"),
        ("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "100"),
        ("HISTORY__PIPELINE__RETRY_INITIAL_MS", "50"),
        ("HISTORY__PIPELINE__RETRY_MAX_MS", "500"),
        ("HISTORY__PIPELINE__BATCH_LINGER_MS", "2"),
        ("HISTORY__HTTP__ENABLED", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Settings for a service under test, in process.
pub fn test_settings(
    database_url: &str,
    brokers: &str,
    group: &str,
    topic: &str,
) -> history_service::config::Settings {
    let env = service_env(database_url, brokers, group, topic)
        .into_iter()
        .collect();
    history_service::config::Settings::load_from(None, Some(env)).expect("valid test settings")
}

/// A `history-service` child process, killed if still running when dropped. Its stderr goes
/// to a file, shown when a test fails.
pub struct Child {
    pub process: std::process::Child,
    pub log: std::path::PathBuf,
}

impl Child {
    /// `history-service` with these arguments.
    pub fn spawn(args: &[&str], env: &[(String, String)]) -> Child {
        Self::spawn_binary(env!("CARGO_BIN_EXE_history-service").as_ref(), args, env)
    }

    fn spawn_binary(binary: &std::path::Path, args: &[&str], env: &[(String, String)]) -> Child {
        let log =
            std::env::temp_dir().join(format!("history-child-{:016x}.log", rand::random::<u64>()));
        let stderr = std::fs::File::create(&log).unwrap();
        let process = std::process::Command::new(binary)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("HISTORY_CONFIG")
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("the binary starts");
        Child { process, log }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: i32) {
        unsafe {
            libc::kill(self.process.id() as i32, signal);
        }
    }

    /// Waits for the exit, at most `timeout`; returns the exit code (None if killed by signal).
    pub fn wait(&mut self, timeout: std::time::Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "child did not exit within {timeout:?}; its log:\n{}",
                self.logs()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        } else {
            eprintln!(
                "--- log of a history-service child ({}) ---\n{}",
                self.log.display(),
                self.logs()
            );
        }
    }
}

/// A free local TCP port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The topic the end-to-end tests use.
pub const TOPIC: &str = "tickets.status.v1";

/// Produces the records to [`TOPIC`]; returns where each landed.
pub async fn produce(
    brokers: &str,
    records: &[history_devkit::workload::PlannedRecord],
) -> Vec<history_devkit::workload::Delivered> {
    let (brokers, records) = (brokers.to_owned(), records.to_vec());
    tokio::task::spawn_blocking(move || {
        history_devkit::workload::produce(&brokers, TOPIC, &records)
    })
    .await
    .unwrap()
    .unwrap()
}

/// The end offset of each partition of [`TOPIC`], asking the broker.
pub async fn topic_ends(brokers: &str, partitions: i32) -> Vec<i64> {
    let brokers = brokers.to_owned();
    tokio::task::spawn_blocking(move || {
        history_devkit::group::GroupInspector::new(&brokers, "inspector")
            .unwrap()
            .ends(TOPIC, partitions, std::time::Duration::from_secs(5))
            .unwrap()
    })
    .await
    .unwrap()
}

/// Waits until the group's committed offsets equal `ends` (read by a separate client, as an
/// operator would); returns them.
pub async fn wait_committed(
    brokers: &str,
    group: &str,
    ends: &[i64],
    timeout: std::time::Duration,
) -> Vec<Option<i64>> {
    let inspector =
        std::sync::Arc::new(history_devkit::group::GroupInspector::new(brokers, group).unwrap());
    let deadline = std::time::Instant::now() + timeout;
    let partitions = ends.len() as i32;
    let expected: Vec<Option<i64>> = ends.iter().map(|&end| (end > 0).then_some(end)).collect();
    loop {
        let inspector = inspector.clone();
        let committed = tokio::task::spawn_blocking(move || {
            inspector.committed(TOPIC, partitions, std::time::Duration::from_secs(2))
        })
        .await
        .unwrap();
        if committed.as_ref().ok() == Some(&expected) {
            return expected;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "group {group} not committed to {ends:?} within {timeout:?}: {committed:?}"
        );
        actix_rt::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
