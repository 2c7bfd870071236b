//! Stops that end, end to end with the real binary: whatever the broker or the database does,
//! a SIGTERM ends the process within `pipeline.shutdown_timeout_ms` + 5 s (issue 22's target),
//! with exit 3 when work is left; a second SIGTERM ends it at once. Every step of the stop
//! finishes by itself: the stop's last-resort cut ("the stop's deadline passed") never fires.

use std::time::{Duration, Instant};

use history_devkit::fault_proxy::Direction;
use history_devkit::process::Signal;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, WorkloadSpec, distinct_events};

const PARTITIONS: i32 = 3;

/// The stop's deadline in these tests.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(4);

/// Issue 22's bound on a stop.
const STOP_BOUND: Duration = Duration::from_secs(4 + 5);

fn backlog(prefix: &str, records: usize) -> Vec<PlannedRecord> {
    workload::generate(&WorkloadSpec {
        records,
        duplicates: 0.0,
        poison: 0.0,
        partitions: PARTITIONS,
        id_prefix: prefix.into(),
        tickets: 97,
        max_payload_bytes: 4096,
        seed: rand::random(),
    })
}

/// Settings shared by the tests: the stop's deadline, Kafka's default session timeout (what a
/// close against a dead broker waits for), and no periodic commit, so that the final commit
/// has positions to commit.
fn stop_settings(o: &mut history_devkit::test_app::Options) {
    o.partitions = PARTITIONS;
    o.env(
        "HISTORY__PIPELINE__SHUTDOWN_TIMEOUT_MS",
        SHUTDOWN_TIMEOUT.as_millis().to_string(),
    )
    .env("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "10000")
    .env("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "600000");
}

/// Sends `signal` and waits for the exit; returns the exit code and how long it took.
fn stop_timed(
    app: &mut TestApp,
    signal: Signal,
    sent_at: Option<Instant>,
) -> (Option<i32>, Duration) {
    let process = app.process();
    let sent_at = sent_at.unwrap_or_else(|| {
        process.signal(signal);
        Instant::now()
    });
    let status = match process.wait_exit(Duration::from_secs(120)) {
        Ok(status) => status,
        Err(err) => panic!("{err}; its log:\n{}", process.logs()),
    };
    (status.code(), sent_at.elapsed())
}

/// The last line of the log, which says how the stop ended.
fn stopped_line(log: &str) -> &str {
    log.lines()
        .rev()
        .find(|line| line.contains("history-service stopped"))
        .unwrap_or_else(|| panic!("no line says the service stopped:\n{log}"))
}

fn assert_orderly(log: &str) {
    assert!(
        !log.contains("the stop's deadline passed"),
        "a step of the stop overran its deadline and was cut short:\n{log}"
    );
}

#[actix_rt::test]
async fn a_stop_with_the_broker_already_dead_ends_within_its_deadline() {
    use history_service::domain::DecodeError;
    use history_service::store::dead_letters::{self, DeadLetter, DeadLetterRow};

    const DLQ: &str = "history.dlq";
    let mut app = TestApp::spawn(|o| {
        stop_settings(o);
        o.env("HISTORY__DEAD_LETTER__TOPIC", DLQ);
    })
    .await;
    app.broker().create_topic(DLQ, 1).unwrap();
    let records = backlog("dead-before", 600);
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.wait_rows(distinct, Duration::from_secs(60)).await;

    app.broker().cluster().broker_down(1).unwrap();
    // A dead letter the relay is publishing when the stop begins: its delivery waits on the
    // dead broker (up to 30 s), and the stop must not wait for it.
    let letter = DeadLetter::new(&DecodeError::NullPayload, None, None, None);
    let row = DeadLetterRow {
        topic: "elsewhere",
        partition: 0,
        offset: 0,
        letter: &letter,
    };
    let pool = app.db.pool(1);
    dead_letters::insert(&pool, std::slice::from_ref(&row))
        .await
        .unwrap();
    dead_letters::request_publication(&pool, std::slice::from_ref(&row), DLQ)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while app
        .db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM dead_letters WHERE publish_claimed_until > now()",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the relay took nothing:\n{}",
            app.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, took) = stop_timed(&mut app, Signal::SIGTERM, None);
    let log = app.logs();
    eprintln!("broker dead before the stop: exit {code:?} after {took:?}");
    assert!(took <= STOP_BOUND, "the stop took {took:?}:\n{log}");
    // The final positions could not be confirmed: not clean.
    assert_eq!(code, Some(3), "{log}");
    let stopped = stopped_line(&log);
    assert!(stopped.contains("uncommitted_partitions="), "{stopped}");
    assert_orderly(&log);
}

#[actix_rt::test]
async fn a_stop_during_which_the_broker_dies_ends_within_its_deadline() {
    let (proxy, db, url) = crate::db_faults::behind_a_proxy().await;
    let mut app = TestApp::prepare(|o| {
        stop_settings(o);
        o.database = Some(db.clone());
        o.env("HISTORY__DATABASE__URL", &url);
    })
    .await;
    let records = backlog("dead-during", 20_000);
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    app.wait_rows(distinct / 10, Duration::from_secs(60)).await;

    // The database hangs (what is open and what opens next): the drain lasts its deadline.
    proxy.freeze_new(true);
    proxy.freeze_open(Direction::Both);
    assert!(
        db.count("history_events").await < distinct,
        "the drain ended first"
    );
    app.process().signal(Signal::SIGTERM);
    let sent_at = Instant::now();
    app.wait_for_log(&["draining in-flight records"], Duration::from_secs(5))
        .await;
    // The broker dies while the stop waits for the database.
    app.broker().cluster().broker_down(1).unwrap();
    let (code, took) = stop_timed(&mut app, Signal::SIGTERM, Some(sent_at));
    let log = app.logs();
    eprintln!("broker dead during the stop: exit {code:?} after {took:?}");
    assert!(took <= STOP_BOUND, "the stop took {took:?}:\n{log}");
    assert_eq!(code, Some(3), "{log}");
    let stopped = stopped_line(&log);
    assert!(!stopped.contains(" left=0"), "{stopped}");
    assert_orderly(&log);
}

#[actix_rt::test]
async fn a_second_sigterm_ends_a_stop_held_up_by_a_stuck_database_at_once() {
    let (proxy, db, url) = crate::db_faults::behind_a_proxy().await;
    // A long deadline, which the second signal must not wait for.
    let mut app = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.database = Some(db.clone());
        o.env("HISTORY__DATABASE__URL", &url)
            .env("HISTORY__PIPELINE__SHUTDOWN_TIMEOUT_MS", "30000")
            .env("HISTORY__DATABASE__STATEMENT_TIMEOUT_MS", "60000");
    })
    .await;
    let records = backlog("second-signal", 20_000);
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    app.wait_rows(distinct / 10, Duration::from_secs(60)).await;

    proxy.freeze_new(true);
    proxy.freeze_open(Direction::Both);
    assert!(
        db.count("history_events").await < distinct,
        "the drain ended first"
    );
    app.process().signal(Signal::SIGTERM);
    app.wait_for_log(&["draining in-flight records"], Duration::from_secs(5))
        .await;
    let (code, took) = stop_timed(&mut app, Signal::SIGTERM, None);
    let log = app.logs();
    eprintln!("second SIGTERM: exit {code:?} after {took:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}:\n{log}");
    assert_eq!(code, Some(3), "{log}");
    assert!(log.contains("second signal: stopping now"), "{log}");
    let stopped = stopped_line(&log);
    assert!(stopped.contains("interrupted=true"), "{stopped}");
    assert!(!stopped.contains(" left=0"), "{stopped}");
}
