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

/// What the next owners of partitions may read again because the group's coordinator refused a
/// commit while the classic group rebalanced (`RebalanceInProgress`, `IllegalGeneration`).
/// librdkafka's mock broker refuses every commit while a member joins, and moves the generation
/// on without waiting for every member (`rd_kafka_mock_cgrp_classic_check_state`); Kafka takes a
/// commit of the current generation until the rebalance completes (`GroupCoordinator`'s
/// `doCommitOffsets`, "During PreparingRebalance phase, we still allow a commit request"). So a
/// test may count as the mock's at most what such a refused commit covered, and nothing else.
///
/// Read from the logs of every member (each run of one apart), taken at debug level under
/// `history_service::commits`. A refused position counts unless the same assignment (the same
/// log, partition and epoch) had a position at least as far confirmed after it; one that counts
/// covers the offsets from the partition's last position confirmed before it (by any member;
/// the log's start if none) up to it, and the resolved offsets above it the commit listed. Any
/// other refusal panics, naming its line.
pub fn covered_by_refused_commits(logs: &[&str]) -> u64 {
    type Assignment = (usize, String, u64, u64);
    let stamp = |text: &str| -> Option<chrono::DateTime<chrono::Utc>> {
        let first = text.split_whitespace().next()?;
        Some(chrono::DateTime::parse_from_rfc3339(first).ok()?.to_utc())
    };
    let mut lines: Vec<(chrono::DateTime<chrono::Utc>, usize, &str)> = logs
        .iter()
        .enumerate()
        .flat_map(|(log, text)| text.lines().map(move |line| (log, line)))
        .filter(|(_, text)| {
            text.contains("offset committed") || text.contains("offset commit refused for")
        })
        .map(|(log, text)| {
            let at =
                stamp(text).unwrap_or_else(|| panic!("a commit line without its time: {text}"));
            (at, log, text)
        })
        .collect();
    lines.sort_by_key(|(at, log, _)| (*at, *log));
    let number = |text: &str, key: &str| {
        logged_number(text, key)
            .unwrap_or_else(|| panic!("a commit line without its {key}: {text}"))
    };
    let topic_of = |text: &str| {
        text.split(" topic=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_default()
            .to_owned()
    };
    let mut confirmed: std::collections::HashMap<(String, u64), u64> = Default::default();
    // Refused positions not yet superseded by their own assignment: offset, and what they cover.
    let mut pending: std::collections::HashMap<Assignment, (u64, u64)> = Default::default();
    for (_, log, text) in lines {
        let partition = (topic_of(text), number(text, "partition"));
        let offset = number(text, "offset");
        let assignment = (log, partition.0.clone(), partition.1, number(text, "epoch"));
        if text.contains("offset committed") {
            let at = confirmed.entry(partition).or_insert(0);
            *at = offset.max(*at);
            if pending
                .get(&assignment)
                .is_some_and(|(refused, _)| offset >= *refused)
            {
                pending.remove(&assignment);
            }
            continue;
        }
        assert!(
            text.contains("code=RebalanceInProgress") || text.contains("code=IllegalGeneration"),
            "a commit refused for another reason than the mock broker's rebalance: {text}"
        );
        let from = confirmed.get(&partition).copied().unwrap_or(0);
        let covers = offset.saturating_sub(from) + logged_number(text, "done").unwrap_or(0);
        let entry = pending.entry(assignment).or_insert((offset, covers));
        if offset >= entry.0 {
            *entry = (offset, covers);
        }
    }
    pending.values().map(|(_, covers)| covers).sum()
}
