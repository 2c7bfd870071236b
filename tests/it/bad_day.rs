//! An operator's bad day, tried as the operator would, with the binary: secrets in rejected
//! settings, start-up errors, a missing database, writes that all fail.

use std::io::{Read, Write};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use history_devkit::process::local_listener;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, WorkloadSpec, distinct_events};

use crate::common::TestDb;

/// Runs the binary to its end with the given environment (no config file, HTTP off unless
/// set, migrations off unless set); a run still going after 30 s is killed (a start-up error
/// that went unnoticed) and fails the test.
fn run_to_end(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .args(args)
        .env_remove("HISTORY_CONFIG")
        .env("RUST_BACKTRACE", "1")
        .env("HISTORY__HTTP__ENABLED", "false")
        .env("HISTORY__DATABASE__MIGRATE_ON_START", "false")
        .env(
            "HISTORY__DATABASE__URL",
            "postgres://postgres@127.0.0.1:5432/history_bad_day_unused",
        )
        .env("HISTORY__KAFKA__BROKERS", "127.0.0.1:1")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!("still running after 30 s:\n{}", text_of(&output));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text_of(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The run failed with one clean error naming `expected`, no panic, and no `secret` anywhere.
fn assert_clean_failure(output: &Output, expected: &[&str], secret: &str) {
    let text = text_of(output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        !text.contains("panicked"),
        "a panic after the error:\n{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|line| line.starts_with("error: "))
            .count(),
        1,
        "one error line expected:\n{text}"
    );
    for part in expected {
        assert!(text.contains(part), "`{part}` not named in:\n{text}");
    }
    if !secret.is_empty() {
        assert!(!text.contains(secret), "the value leaked:\n{text}");
    }
}

#[test]
fn a_misspelled_kafka_property_fails_naming_the_key_never_the_value() {
    let output = run_to_end(
        &["run"],
        &[("HISTORY__KAFKA__PROPERTIES__SASL_PASWORD", "hunter2-secret")],
    );
    assert_clean_failure(
        &output,
        &["kafka.properties.sasl.pasword", "no such property"],
        "hunter2-secret",
    );
}

#[test]
fn an_invalid_kafka_property_value_fails_naming_the_key_never_the_value() {
    let output = run_to_end(
        &["run"],
        &[(
            "HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL",
            "bogus-s3cr3t",
        )],
    );
    assert_clean_failure(
        &output,
        &["kafka.properties.security.protocol", "rejects its value"],
        "bogus-s3cr3t",
    );
}

#[test]
fn a_bad_property_read_from_a_file_fails_naming_the_key_never_the_value() {
    let path = std::env::temp_dir().join(format!("history-secret-{:x}", rand::random::<u64>()));
    std::fs::write(&path, "file-s3cr3t-value\n").unwrap();
    let path_text = path.display().to_string();
    let output = run_to_end(
        &["run"],
        &[("HISTORY__KAFKA__PROPERTY_FILES__SASL_PASWORD", &path_text)],
    );
    std::fs::remove_file(&path).unwrap();
    assert_clean_failure(
        &output,
        &["kafka.property_files.sasl.pasword"],
        "file-s3cr3t-value",
    );
}

/// A SASL mechanism librdkafka does not have: refused at start-up, before the database or
/// a broker is asked anything, naming the key and the valid mechanisms, never the value.
const MECHANISM: &str = "MECHANISM-s3cr3t";

#[test]
fn an_unknown_sasl_mechanism_is_refused_at_start_up_naming_the_key_never_the_value() {
    let output = run_to_end(
        &["run"],
        &[
            (
                "HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL",
                "sasl_plaintext",
            ),
            ("HISTORY__KAFKA__PROPERTIES__SASL_MECHANISMS", MECHANISM),
        ],
    );
    assert_clean_failure(
        &output,
        &[
            "kafka.properties.sasl.mechanisms",
            "SCRAM-SHA-512, GSSAPI, OAUTHBEARER",
        ],
        MECHANISM,
    );
}

/// Accepted one by one and by the start-up checks, refused when librdkafka creates the client
/// (its TLS context cannot take the certificate). For the consumer, that is after the
/// pipeline's actors started.
const PEM: &str = "PEM-s3cr3t";
const CLIENT_REFUSES: [(&str, &str); 2] = [
    ("HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL", "ssl"),
    ("HISTORY__KAFKA__PROPERTIES__SSL_CA_PEM", PEM),
];

#[test]
fn a_consumer_librdkafka_refuses_fails_cleanly_without_the_value_or_a_panic() {
    let output = run_to_end(&["run"], &CLIENT_REFUSES);
    assert_clean_failure(
        &output,
        &["cannot create the kafka consumer", "ssl.ca.pem"],
        PEM,
    );
}

#[test]
fn a_producer_librdkafka_refuses_fails_cleanly_without_the_value() {
    let mut env = CLIENT_REFUSES.to_vec();
    env.push(("HISTORY__DEAD_LETTER__TOPIC", "history.dlq"));
    let output = run_to_end(&["run"], &env);
    assert_clean_failure(
        &output,
        &["cannot create the kafka producer", "ssl.ca.pem"],
        PEM,
    );
}

#[actix_rt::test]
async fn replaying_with_a_producer_librdkafka_refuses_fails_without_the_value() {
    let db = TestDb::migrated().await;
    let url = db.url();
    let mut env = CLIENT_REFUSES.to_vec();
    env.push(("HISTORY__DATABASE__URL", &url));
    let output = run_to_end(&["dead-letters", "replay", "--all"], &env);
    assert_clean_failure(&output, &["cannot create the kafka producer"], PEM);
}

#[test]
fn a_port_in_use_fails_cleanly_naming_the_cause() {
    let listener = local_listener().unwrap();
    let listen = listener.local_addr().unwrap().to_string();
    let output = run_to_end(
        &["run"],
        &[
            ("HISTORY__HTTP__ENABLED", "true"),
            ("HISTORY__HTTP__LISTEN", &listen),
        ],
    );
    assert_clean_failure(&output, &[&listen, "Address already in use"], "");
}

#[test]
fn nonsense_brokers_fail_at_start_up_naming_the_key() {
    let output = run_to_end(&["run"], &[("HISTORY__KAFKA__BROKERS", "::::,,")]);
    assert_clean_failure(&output, &["kafka.brokers"], "");
}

#[test]
fn a_directory_as_the_config_file_is_named_as_one() {
    let dir = std::env::temp_dir();
    let output = run_to_end(&["--config", dir.to_str().unwrap(), "verify"], &[]);
    assert_clean_failure(&output, &["is a directory"], "");
}

#[test]
fn an_unknown_dead_letter_reason_lists_the_valid_codes() {
    let output = run_to_end(&["dead-letters", "list", "--reason", "nosuch"], &[]);
    let text = text_of(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    for code in ["not_json", "missing_field", "bad_timestamp", "too_large"] {
        assert!(text.contains(code), "{code} not listed:\n{text}");
    }
}

/// One request with any method; returns the status and the raw head and body.
fn request(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, response)
}

/// Waits until the `history_ready` gauge is `value`.
async fn wait_for_gauge(app: &TestApp, value: f64, timeout: Duration) {
    app.wait_for_metrics(timeout, |m| m.get("history_ready") == Some(value))
        .await;
}

/// A database URL on the test server naming a database that does not exist.
fn missing_database() -> String {
    let missing = format!("history_missing_{:x}", rand::random::<u64>());
    format!(
        "{}/{missing}",
        crate::common::base_url().trim_end_matches('/')
    )
}

#[actix_rt::test]
async fn while_the_database_is_missing_healthz_answers_readyz_says_why_and_sigterm_stops_it() {
    let mut app = TestApp::spawn(|o| {
        o.migrate = false;
        o.external_brokers = Some("127.0.0.1:1".into());
        o.env("HISTORY__DATABASE__URL", missing_database());
    })
    .await;
    let port = app.port();

    app.wait_for_answer("/healthz", Duration::from_secs(20), |status, _| {
        status == 200
    })
    .await;
    let (_, reason) = app
        .wait_for_answer("/readyz", Duration::from_secs(20), |status, body| {
            status == 503 && body.contains("3D000")
        })
        .await;
    assert!(reason.contains("starting"), "{reason}");
    assert!(reason.contains("does not exist"), "{reason}");
    assert_eq!(app.metrics().await.get("history_ready"), Some(0.0));
    // The database's own reason is in the log, not just "db error".
    app.wait_for_log(&["3D000", "does not exist"], Duration::from_secs(10))
        .await;

    // Only GET and HEAD, on the three paths.
    let (status, response) = request(port, "POST", "/healthz");
    assert_eq!(status, 405, "{response}");
    assert!(
        response.to_ascii_lowercase().contains("allow: get, head"),
        "{response}"
    );
    let (status, response) = request(port, "HEAD", "/healthz");
    assert_eq!(status, 200, "{response}");
    assert!(response.ends_with("\r\n\r\n"), "no body: {response:?}");
    assert_eq!(request(port, "GET", "/nothing").0, 404);

    let asked = Instant::now();
    assert_eq!(app.stop(), Some(0));
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    let logs = app.logs();
    assert!(!logs.contains("panicked"), "{logs}");
}

#[actix_rt::test]
async fn without_migrations_the_writers_retries_name_the_missing_database() {
    let mut app = TestApp::prepare(|o| {
        o.migrate = false;
        o.env("HISTORY__DATABASE__URL", missing_database())
            .env("HISTORY__DATABASE__MIGRATE_ON_START", "false")
            .env("HISTORY__DATABASE__CONNECT_TIMEOUT_MS", "500");
    })
    .await;
    let records = workload::generate(&WorkloadSpec {
        records: 5,
        duplicates: 0.0,
        poison: 0.0,
        partitions: 1,
        id_prefix: "missing".into(),
        tickets: 2,
        max_payload_bytes: 65536,
        seed: 5,
    });
    app.produce(&records).await;
    app.start();
    app.wait_for_log(
        &["write failed", "3D000", "does not exist"],
        Duration::from_secs(30),
    )
    .await;
}

#[actix_rt::test]
async fn readyz_turns_503_while_every_write_fails_and_back_once_they_succeed() {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 3;
        o.env("HISTORY__PIPELINE__UNREADY_AFTER_FAILING_MS", "1500");
    })
    .await;
    let spec = |records, prefix: &str, seed| WorkloadSpec {
        records,
        duplicates: 0.0,
        poison: 0.0,
        partitions: 3,
        id_prefix: prefix.into(),
        tickets: 20,
        max_payload_bytes: 65536,
        seed,
    };
    let first = workload::generate(&spec(60, "ready-a", 1));
    app.produce(&first).await;
    app.start();
    app.wait_committed(Duration::from_secs(60)).await;
    app.wait_for_answer("/readyz", Duration::from_secs(10), |status, _| {
        status == 200
    })
    .await;
    wait_for_gauge(&app, 1.0, Duration::from_secs(5)).await;

    // Someone adds a constraint no row satisfies: every write fails from now on.
    let admin = app.db.client().await;
    admin
        .batch_execute("ALTER TABLE history_events ADD CONSTRAINT no_rows CHECK (false) NOT VALID")
        .await
        .unwrap();
    let failing_from = Instant::now();
    let second = workload::generate(&spec(30, "ready-b", 2));
    app.produce(&second).await;
    let second_ends = app.ends().await;
    // The gauge follows without anyone asking /readyz.
    wait_for_gauge(&app, 0.0, Duration::from_secs(20)).await;
    assert!(
        failing_from.elapsed() >= Duration::from_millis(1500),
        "unready before the configured time: {:?}",
        failing_from.elapsed()
    );
    let (_, reason) = app.get("/readyz").await;
    assert!(reason.contains("every write has failed"), "{reason}");
    assert!(reason.contains("23514"), "{reason}");
    assert!(reason.contains("no_rows"), "{reason}");
    // Every event is rejected by itself: the log names them (bisected, each retried alone).
    app.wait_for_log(&["23514", "no_rows"], Duration::from_secs(5))
        .await;

    admin
        .batch_execute("ALTER TABLE history_events DROP CONSTRAINT no_rows")
        .await
        .unwrap();
    app.wait_for_answer("/readyz", Duration::from_secs(20), |status, _| {
        status == 200
    })
    .await;
    wait_for_gauge(&app, 1.0, Duration::from_secs(5)).await;
    app.wait_committed_to(&second_ends, Duration::from_secs(60))
        .await;
    assert_eq!(
        app.db.count("history_events").await,
        (distinct_events(&first) + distinct_events(&second)) as i64
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn a_dropped_table_is_reported_with_its_sqlstate_and_message() {
    use history_service::domain::{Outcome, process_history_once};
    use history_service::store::PgHistoryRepository;

    let db = TestDb::migrated().await;
    db.client()
        .await
        .batch_execute("DROP TABLE history_events")
        .await
        .unwrap();
    let repository = PgHistoryRepository::new(db.pool(2));
    let outcome = process_history_once(&repository, &crate::common::seed_900()).await;
    let Outcome::Unknown(err) = outcome else {
        panic!("a write to a dropped table must be Unknown: {outcome:?}")
    };
    let text = err.to_string();
    assert!(text.contains("42P01"), "{text}");
    assert!(
        text.contains("relation \"history_events\" does not exist"),
        "{text}"
    );
}

#[actix_rt::test]
async fn verify_names_the_servers_reason_once() {
    let db = TestDb::migrated().await;
    db.client()
        .await
        .batch_execute("DROP TABLE history_events")
        .await
        .unwrap();
    let url = db.url();
    let output = run_to_end(&["verify"], &[("HISTORY__DATABASE__URL", &url)]);
    let text = text_of(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert_eq!(text.matches("42P01").count(), 1, "{text}");
    assert_eq!(
        text.matches("relation \"history_events\" does not exist")
            .count(),
        1,
        "{text}"
    );
}

/// A new group whose first writes hang (the database waits on a lock) has committed nothing;
/// librdkafka then reports no lag. The dashboard and the lag alerts must still see it: each
/// assigned partition exports its lag (the whole log) and the log start as its position, from
/// the assignment on, not from the first commit.
#[actix_rt::test]
async fn a_new_group_stuck_at_its_first_record_exports_its_lag_and_position() {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.env("HISTORY__KAFKA__STATISTICS_INTERVAL_MS", "200");
    })
    .await;
    let lock = app.db.client().await;
    lock.batch_execute("BEGIN; LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let records = workload::generate(&WorkloadSpec {
        records: 200,
        duplicates: 0.0,
        poison: 0.0,
        partitions: 2,
        id_prefix: "stuck-first".into(),
        tickets: 20,
        max_payload_bytes: 512,
        seed: 7,
    });
    app.produce(&records).await;
    app.start();
    let ends = app.ends().await;
    let series = |family: &str, partition: usize| {
        format!(
            "{family}{{topic=\"{}\",partition=\"{partition}\"}}",
            app.topic
        )
    };
    let metrics = app
        .wait_for_metrics(Duration::from_secs(60), |m| {
            (0..2).all(|p| m.get(&series("history_consumer_lag", p)).is_some())
        })
        .await;
    assert!(app.db.lock_waiters().await >= 1, "no write was waiting");
    for (partition, end) in ends.iter().enumerate() {
        assert_eq!(
            metrics.get(&series("history_consumer_lag", partition)),
            Some(*end as f64),
            "{metrics}"
        );
        assert_eq!(
            metrics.get(&series("history_committed_offset", partition)),
            Some(0.0),
            "{metrics}"
        );
    }
    lock.batch_execute("ROLLBACK").await.unwrap();
    app.wait_committed(Duration::from_secs(60)).await;
    let metrics = app
        .wait_for_metrics(Duration::from_secs(30), |m| {
            (0..2).all(|p| m.get(&series("history_consumer_lag", p)) == Some(0.0))
        })
        .await;
    for (partition, end) in ends.iter().enumerate() {
        assert_eq!(
            metrics.get(&series("history_committed_offset", partition)),
            Some(*end as f64)
        );
    }
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// A classic group switched to `group_protocol = consumer`: the embedded broker, like a Kafka
/// whose group still has members of the other protocol, refuses every commit of the new
/// member as from an unknown member. Refused commits are expected for a moment in every
/// rebalance; refused for longer than any rebalance, they are an ERROR that says what to do,
/// and `/readyz` says so, rather than an INFO line a second.
#[actix_rt::test]
async fn commits_refused_for_good_after_a_protocol_switch_are_an_error_and_make_the_service_unready()
 {
    let mut classic = TestApp::prepare(|o| {
        o.partitions = 1;
        o.protocol("classic");
    })
    .await;
    let records = |prefix: &str| {
        workload::generate(&WorkloadSpec {
            records: 50,
            duplicates: 0.0,
            poison: 0.0,
            partitions: 1,
            id_prefix: prefix.into(),
            tickets: 5,
            max_payload_bytes: 512,
            seed: 3,
        })
    };
    classic.produce(&records("classic")).await;
    classic.start();
    classic.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(classic.stop(), Some(0), "{}", classic.logs());

    let mut app = TestApp::prepare(|o| {
        o.share(&classic);
        o.protocol("consumer");
    })
    .await;
    app.produce(&records("consumer")).await;
    app.start();
    let line = app
        .wait_for_log(
            &[
                "ERROR",
                "every offset commit has been refused for",
                "kafka.group_protocol",
            ],
            Duration::from_secs(90),
        )
        .await;
    assert!(line.contains("UnknownMemberId"), "{line}");
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("every offset commit has been refused"),
        "{body}"
    );
    app.stop();
}
