//! The binary's commands, run as an operator would run them.

use std::process::{Command, Output};

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
