//! The binary's commands, run as an operator would run them.

use std::process::{Command, Output};
use std::time::Duration;

use history_devkit::process::Process;

use crate::common::TestDb;

fn history_service(db_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_history-service"))
        .args(args)
        .env("HISTORY__DATABASE__URL", db_url)
        .env_remove("HISTORY_CONFIG")
        .output()
        .expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[actix_rt::test]
async fn migrate_then_verify_succeed_on_a_fresh_database() {
    let db = TestDb::create().await;
    let migrated = history_service(&db.url(), &["migrate"]);
    assert!(migrated.status.success(), "{migrated:?}");
    assert!(
        stdout(&migrated).contains("applied V1__"),
        "{}",
        stdout(&migrated)
    );

    let again = history_service(&db.url(), &["migrate"]);
    assert!(
        stdout(&again).contains("schema up to date"),
        "{}",
        stdout(&again)
    );

    let verified = history_service(&db.url(), &["verify"]);
    assert_eq!(verified.status.code(), Some(0), "{verified:?}");
    assert!(stdout(&verified).contains("inbox markers:                  0"));
}

#[actix_rt::test]
async fn migrate_can_create_the_database() {
    let db = TestDb::create().await;
    let missing = format!("{}_created", db.url());
    let output = history_service(&missing, &["migrate", "--create-database"]);
    let cleanup = crate::common::admin_client().await;
    let _ = cleanup
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {}_created WITH (FORCE)",
            db.name
        ))
        .await;
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout(&output).contains("created database"),
        "{}",
        stdout(&output)
    );
}

#[actix_rt::test]
async fn verify_exits_1_naming_lost_events_and_orphan_rows() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO inbox VALUES ('event-ok'), ('event-lost-1'), ('event-lost-2');
             INSERT INTO history_events VALUES ('event-ok', 't', 'a', 'b', now());
             ALTER TABLE history_events DROP CONSTRAINT history_events_event_id_fkey;
             INSERT INTO history_events VALUES ('event-orphan', 't', 'a', 'b', now());",
        )
        .await
        .unwrap();
    let output = history_service(&db.url(), &["verify"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let text = stdout(&output);
    for id in ["event-lost-1", "event-lost-2", "event-orphan"] {
        assert!(text.contains(id), "{id} not named in:\n{text}");
    }
    assert!(!text.contains("event-ok"), "{text}");
    assert!(text.contains("markers without a history row:  2"), "{text}");
    assert!(text.contains("history rows without a marker:  1"), "{text}");
}

#[test]
fn verify_exits_2_when_the_database_cannot_be_reached() {
    let output = history_service("postgres://postgres@127.0.0.1:1/none", &["verify"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

#[test]
fn invalid_configuration_fails_at_start_up_naming_the_key_and_hiding_the_password() {
    let output = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .arg("migrate")
        .env(
            "HISTORY__DATABASE__URL",
            "postgres://app:hunter2secret@db:5432/history",
        )
        .env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "0")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("pipeline.batch_max_events"), "{stderr}");
    assert!(!stderr.contains("hunter2secret"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .arg("migrate")
        .env(
            "HISTORY__DATABASE__URL",
            "postgres://app:hunter2secret@db:nope/history",
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("database.url"), "{stderr}");
    assert!(!stderr.contains("hunter2secret"), "{stderr}");
}

/// Settings as a consumer tutorial gives them: each stops `run` before anything is read or
/// written, naming the key and why, and none is applied.
#[test]
fn settings_pasted_from_a_tutorial_stop_the_start_naming_the_key() {
    for (variable, value, named) in [
        (
            "HISTORY__KAFKA__PROPERTIES__ENABLE_AUTO_COMMIT",
            "true",
            "kafka.properties.enable.auto.commit",
        ),
        (
            "HISTORY__KAFKA__PROPERTIES__AUTO_OFFSET_RESET",
            "latest",
            "kafka.properties.auto.offset.reset",
        ),
        (
            "HISTORY__KAFKA__PROPERTIES__ISOLATION_LEVEL",
            "read_uncommitted",
            "kafka.properties.isolation.level",
        ),
        (
            "HISTORY__KAFKA__PROPERTIES__BOOTSTRAP_SERVERS",
            "kafka:9092",
            "kafka.brokers",
        ),
        ("HISTORY__PIPELINE__WRITERS", "4.5", "pipeline.writers"),
        (
            "HISTORY__KAFKA__TOPICS",
            "tickets.status.v1, other topic",
            "kafka.topics",
        ),
        (
            "HISTORY__KAFKA__GROUP_PROTOCOL",
            "kip848",
            "classic, consumer",
        ),
    ] {
        // A setting let through would start the service, which then waits for its database:
        // the deadline ends the test instead.
        let mut service = Process::command(env!("CARGO_BIN_EXE_history-service"))
            .arg("run")
            .env(
                "HISTORY__DATABASE__URL",
                "postgres://postgres@127.0.0.1:1/none",
            )
            .env("HISTORY__KAFKA__BROKERS", "127.0.0.1:1")
            .env(variable, value)
            .spawn()
            .unwrap();
        let status = service.wait_exit(Duration::from_secs(20));
        let stderr = service.logs();
        assert_eq!(
            status.ok().and_then(|status| status.code()),
            Some(2),
            "{variable}: {stderr}"
        );
        assert!(stderr.contains(named), "{variable}: {stderr}");
    }
}

#[test]
fn the_production_binary_has_only_the_operators_commands_and_the_kit_the_developers() {
    assert_eq!(
        commands_of(env!("CARGO_BIN_EXE_history-service").as_ref()),
        ["run", "dead-letters", "migrate", "verify"]
    );
    assert_eq!(
        commands_of(&history_devkit::workspace_binary("history-dev")),
        ["demo", "bench", "dev-kafka"]
    );
}

#[test]
fn every_command_has_help() {
    for (binary, name) in [
        (
            std::path::PathBuf::from(env!("CARGO_BIN_EXE_history-service")),
            "history-service",
        ),
        (
            history_devkit::workspace_binary("history-dev"),
            "history-dev",
        ),
    ] {
        let commands = commands_of(&binary);
        assert!(commands.len() >= 2, "{commands:?}");
        for command in commands {
            let output = Command::new(&binary)
                .args([command.as_str(), "--help"])
                .output()
                .unwrap();
            assert!(output.status.success(), "{command} --help: {output:?}");
            assert!(
                stdout(&output).contains(&format!("Usage: {name}")),
                "{command}"
            );
        }
    }
}

/// The subcommands a binary's top-level help lists.
fn commands_of(binary: &std::path::Path) -> Vec<String> {
    let output = Command::new(binary).arg("--help").output().unwrap();
    let text = stdout(&output);
    text.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// An offset names a record only within a partition, and within a topic: `--offset` alone is
/// refused (it used to select the letter at that offset of every partition), and with letters of
/// two topics at that place the topic is asked for.
#[actix_rt::test]
async fn a_replay_by_offset_needs_the_partition_and_the_topic_when_several_are_stored() {
    let db = TestDb::migrated().await;
    db.client()
        .await
        .batch_execute(
            "INSERT INTO dead_letters (topic, partition, \"offset\", payload, reason_code, reason)
             VALUES ('a', 0, 2, 'x', 'not_json', 'r'), ('b', 0, 2, 'y', 'not_json', 'r'),
                    ('a', 1, 2, 'z', 'not_json', 'r');",
        )
        .await
        .unwrap();
    let replay = |args: &[&str]| {
        let mut all = vec!["dead-letters", "replay", "--dry-run"];
        all.extend_from_slice(args);
        history_service(&db.url(), &all)
    };

    let alone = replay(&["--offset", "2"]);
    assert_eq!(alone.status.code(), Some(2), "{alone:?}");
    let stderr = String::from_utf8_lossy(&alone.stderr);
    assert!(stderr.contains("--partition"), "{stderr}");

    let two_topics = replay(&["--offset", "2", "--partition", "0"]);
    assert_ne!(two_topics.status.code(), Some(0), "{two_topics:?}");
    let stderr = String::from_utf8_lossy(&two_topics.stderr);
    assert!(stderr.contains("several topics (a, b)"), "{stderr}");

    let one = replay(&["--offset", "2", "--partition", "0", "--topic", "a"]);
    assert_eq!(one.status.code(), Some(0), "{one:?}");
    let text = stdout(&one);
    assert!(text.contains("would replay a/0/2"), "{text}");
    assert!(text.contains("would replay 1 dead letters"), "{text}");
}
