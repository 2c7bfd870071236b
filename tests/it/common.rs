//! Shared helpers of the integration tests: domain fixtures and in-process settings. The
//! throwaway database, the service under test and everything around it are the kit's
//! (`history_devkit::test_db`, `history_devkit::test_app`).

pub use history_devkit::test_db::{TestDb, admin_client, base_url};

/// The number a log line gives for `key` (`… key=123 …`), if any.
pub fn logged_number(line: &str, key: &str) -> Option<u64> {
    let value = line.split(&format!(" {key}=")).nth(1)?;
    value
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// `records` unique events (no duplicates, no poison) spread over the topic's partitions.
pub fn unique_events(
    records: usize,
    prefix: &str,
    seed: u64,
) -> Vec<history_devkit::workload::PlannedRecord> {
    history_devkit::workload::generate(&history_devkit::workload::WorkloadSpec {
        records,
        duplicates: 0.0,
        poison: 0.0,
        partitions: 1,
        id_prefix: prefix.into(),
        tickets: 997,
        max_payload_bytes: 65536,
        seed,
    })
}

/// The `key=value` number of the service's last "history-service stopped" line.
pub fn stopped_field(logs: &str, key: &str) -> Option<u64> {
    let line = logs
        .lines()
        .rev()
        .find(|line| line.contains("history-service stopped"))?;
    logged_number(line, key)
}

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

/// Settings for a service under test, in process, with the kit's test environment.
pub fn test_settings(
    database_url: &str,
    brokers: &str,
    group: &str,
    topic: &str,
) -> history_service::config::Settings {
    let env = history_devkit::test_app::service_env(database_url, brokers, group, topic)
        .into_iter()
        .collect();
    history_service::config::Settings::load_from(None, Some(env)).expect("valid test settings")
}

/// Runs `history-service ARGS` against `app`'s deployment (its environment, no config file);
/// the exit code and what it printed, standard output then standard error.
pub fn run_service_command(
    app: &history_devkit::test_app::TestApp,
    args: &[&str],
) -> (Option<i32>, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_history-service"))
        .args(args)
        .env_remove("HISTORY_CONFIG")
        .envs(app.env().iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("the binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// Events for each of `partitions` partitions, numbered from `from` to `to` in each.
pub fn events_in_each(
    partitions: i32,
    from: usize,
    to: usize,
    prefix: &str,
) -> Vec<history_devkit::workload::PlannedRecord> {
    (0..partitions)
        .flat_map(|partition| {
            (from..to).map(move |n| {
                let id = format!("{prefix}-{partition}-{n}");
                history_devkit::workload::PlannedRecord {
                    key: format!("ticket-{partition}").into_bytes(),
                    payload: Some(history_devkit::workload::event_payload(
                        &id,
                        &format!("ticket-{partition}"),
                        "open",
                        "closed",
                        chrono::Utc::now(),
                    )),
                    partition: Some(partition),
                    kind: history_devkit::workload::RecordKind::Event { event_id: id },
                }
            })
        })
        .collect()
}
