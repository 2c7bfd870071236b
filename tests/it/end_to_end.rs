//! End to end: the real service against librdkafka's mock cluster (a Kafka-protocol broker over
//! TCP), real producers, and PostgreSQL. Positions are read by a separate client.

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use history_devkit::broker::EmbeddedBroker;
use history_devkit::group::GroupInspector;
use history_devkit::probe::sample;
use history_devkit::workload::{self, PlannedRecord, WorkloadSpec, distinct_events};

use crate::common::{
    Child, TOPIC, TestDb, free_port, produce, scrape, service_env, test_settings, wait_committed,
};

fn ends_of(delivered: &[workload::Delivered], partitions: i32) -> Vec<i64> {
    (0..partitions)
        .map(|p| {
            delivered
                .iter()
                .filter(|d| d.partition == p)
                .map(|d| d.offset + 1)
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// Good events with 10% duplicates (some on the other partition) over two partitions.
fn events_with_duplicates(
    records: usize,
    prefix: &str,
    tickets: u32,
    seed: u64,
) -> Vec<PlannedRecord> {
    workload::generate(&WorkloadSpec {
        records,
        duplicates: 0.1,
        poison: 0.0,
        partitions: 2,
        id_prefix: prefix.into(),
        tickets,
        max_payload_bytes: 65536,
        seed,
    })
}

/// Waits until the service under test has written `rows` history rows.
async fn wait_rows(db: &TestDb, rows: i64, service: &Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.count("history_events").await < rows {
        assert!(Instant::now() < deadline, "stalled:\n{}", service.logs());
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn the_service_records_the_seed_scenario_and_commits_the_group_to_the_end() {
    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 3).unwrap();
    let brokers = broker.bootstrap_servers();
    let delivered = produce(&brokers, &workload::seed_records()).await;
    assert!(
        delivered
            .iter()
            .all(|d| d.partition == delivered[0].partition),
        "one key, one partition"
    );
    let ends = ends_of(&delivered, 3);

    let settings = test_settings(&db.url(), &brokers, "history-e2e", TOPIC);
    let shutdown = {
        let brokers = brokers.clone();
        let ends = ends.clone();
        async move {
            wait_committed(&brokers, "history-e2e", &ends, Duration::from_secs(30)).await;
        }
    };
    let report = history_service::app::run(&settings, shutdown)
        .await
        .unwrap();

    assert_eq!(db.count("inbox").await, 2);
    assert_eq!(db.count("history_events").await, 2);
    assert_eq!((report.stats.applied, report.stats.already_applied), (2, 1));
    let committed = wait_committed(&brokers, "history-e2e", &ends, Duration::from_secs(5)).await;
    assert_eq!(committed[delivered[0].partition as usize], Some(3));
}

#[actix_rt::test]
async fn a_crash_before_the_offset_commit_rereads_the_records_and_writes_no_duplicate() {
    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 2).unwrap();
    let brokers = broker.bootstrap_servers();
    let records = events_with_duplicates(300, "crash", 20, 11);
    let distinct = distinct_events(&records) as i64;
    let delivered = produce(&brokers, &records).await;
    let ends = ends_of(&delivered, 2);
    let mut env = service_env(&db.url(), &brokers, "history-crash", TOPIC);

    // First run: commits nothing (the periodic commit is an hour away), and is killed once the
    // rows are in the database: a crash after the DB commit, before the offset commit.
    env.push((
        "HISTORY__PIPELINE__COMMIT_INTERVAL_MS".into(),
        "3600000".into(),
    ));
    let mut first = Child::spawn(&["run"], &env);
    wait_rows(&db, distinct, &first).await;
    first.signal(libc::SIGKILL);
    assert_eq!(
        first.wait(Duration::from_secs(10)),
        None,
        "killed by the signal"
    );
    let inspector = GroupInspector::new(&brokers, "history-crash").unwrap();
    assert_eq!(
        inspector
            .committed(TOPIC, 2, Duration::from_secs(5))
            .unwrap(),
        vec![None, None],
        "nothing committed before the crash"
    );

    // Second run: re-reads everything, finds every event already applied.
    env.pop();
    let port = free_port();
    env.push(("HISTORY__HTTP__ENABLED".into(), "true".into()));
    env.push(("HISTORY__HTTP__LISTEN".into(), format!("127.0.0.1:{port}")));
    let mut second = Child::spawn(&["run"], &env);
    wait_committed(&brokers, "history-crash", &ends, Duration::from_secs(60)).await;
    let metrics = scrape(port).await;
    assert_eq!(db.count("history_events").await, distinct);
    assert_eq!(db.count("inbox").await, distinct);
    assert_eq!(
        sample(&metrics, "history_events_total{outcome=\"applied\"}"),
        Some(0.0),
        "nothing newly applied (the counter starts at 0): {metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "history_events_total{outcome=\"already_applied\"}"
        ),
        Some(records.len() as f64)
    );
    second.signal(libc::SIGTERM);
    assert_eq!(
        second.wait(Duration::from_secs(30)),
        Some(0),
        "{}",
        second.logs()
    );
}

#[actix_rt::test]
async fn run_against_dev_kafka_consumes_what_kcat_produced_and_stops_cleanly_on_sigterm() {
    let db = TestDb::migrated().await;
    let mut kafka = Child::spawn_dev(&["dev-kafka", "--partitions", "2"], &[]);
    let mut stdout = BufReader::new(kafka.process.stdout.take().unwrap());
    let mut first_line = String::new();
    stdout.read_line(&mut first_line).unwrap();
    let brokers = first_line
        .trim()
        .strip_prefix("bootstrap.servers=")
        .unwrap_or_else(|| panic!("first line was {first_line:?}"))
        .to_owned();

    let payloads: Vec<String> = workload::seed_records()
        .into_iter()
        .map(|r| String::from_utf8(r.payload.unwrap()).unwrap())
        .chain((0..50).map(|n| {
            String::from_utf8(workload::event_payload(
                &format!("kcat-{n}"),
                &format!("ticket-{}", n % 5),
                "open",
                "closed",
                chrono::Utc::now(),
            ))
            .unwrap()
        }))
        .collect();
    let mut kcat = std::process::Command::new("kcat")
        .args(["-P", "-b", &brokers, "-t", TOPIC, "-K", "|"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("kcat is installed (apt-get install kcat; .ci/run installs it)");
    {
        let stdin = kcat.stdin.as_mut().unwrap();
        for payload in &payloads {
            let key = if payload.contains("ticket-42") {
                "ticket-42"
            } else {
                "k"
            };
            writeln!(stdin, "{key}|{payload}").unwrap();
        }
    }
    assert!(kcat.wait().unwrap().success());

    let inspector = GroupInspector::new(&brokers, "history-kcat").unwrap();
    let ends = inspector.ends(TOPIC, 2, Duration::from_secs(5)).unwrap();
    assert_eq!(ends.iter().sum::<i64>(), payloads.len() as i64);

    let mut service = Child::spawn(
        &["run"],
        &service_env(&db.url(), &brokers, "history-kcat", TOPIC),
    );
    wait_committed(&brokers, "history-kcat", &ends, Duration::from_secs(60)).await;
    assert_eq!(
        db.count("history_events").await,
        52,
        "900, 901 and fifty more"
    );
    service.signal(libc::SIGTERM);
    assert_eq!(
        service.wait(Duration::from_secs(30)),
        Some(0),
        "{}",
        service.logs()
    );
    assert!(
        service.logs().contains("history-service stopped"),
        "{}",
        service.logs()
    );

    kafka.signal(libc::SIGTERM);
    assert_eq!(kafka.wait(Duration::from_secs(10)), Some(0));
}

#[test]
fn the_demo_runs_on_a_fresh_database_and_reports_success() {
    let runtime = actix_rt::System::new();
    let db = runtime.block_on(TestDb::create());
    let output = std::process::Command::new(history_devkit::workspace_binary("history-dev"))
        .args(["demo", "--events", "3000", "--partitions", "2"])
        .env("HISTORY__DATABASE__URL", db.url())
        .env("HISTORY__HTTP__LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("OK: every event recorded once"), "{stdout}");
    assert!(stdout.contains("applied"), "{stdout}");
    assert!(stdout.contains("committed"), "{stdout}");
}

#[test]
fn the_demo_starts_a_throwaway_postgres_when_none_answers() {
    let output = std::process::Command::new(history_devkit::workspace_binary("history-dev"))
        .args(["demo", "--events", "500", "--partitions", "1"])
        .env(
            "HISTORY__DATABASE__URL",
            "postgres://postgres@127.0.0.1:1/history",
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("throwaway cluster"), "{stderr}");
    assert!(stdout.contains("OK: every event recorded once"), "{stdout}");
}

#[actix_rt::test]
async fn a_backlog_far_larger_than_the_window_is_paused_resumed_and_fully_recorded() {
    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 2).unwrap();
    let brokers = broker.bootstrap_servers();
    let records = events_with_duplicates(3000, "backpressure", 50, 5);
    let distinct = distinct_events(&records);
    let delivered = produce(&brokers, &records).await;
    let ends = ends_of(&delivered, 2);

    let mut settings = test_settings(&db.url(), &brokers, "history-backpressure", TOPIC);
    settings.pipeline.max_in_flight_per_partition = 25;
    settings.pipeline.batch_max_events = 10;
    let shutdown = {
        let (brokers, ends) = (brokers.clone(), ends.clone());
        async move {
            wait_committed(
                &brokers,
                "history-backpressure",
                &ends,
                Duration::from_secs(90),
            )
            .await;
        }
    };
    let report = history_service::app::run(&settings, shutdown)
        .await
        .unwrap();
    // librdkafka drops what it prefetched for a paused partition and fetches it again on
    // resume: nothing may be skipped or processed out of its window.
    assert!(
        report.stats.pauses > 0,
        "the window never filled: {:?}",
        report.stats
    );
    assert_eq!(db.count("history_events").await, distinct as i64);
    assert_eq!(
        (report.stats.applied + report.stats.already_applied) as usize,
        3000,
        "every record resolved exactly once: {:?}",
        report.stats
    );
}

#[actix_rt::test]
async fn a_lost_assignment_commits_nothing_and_the_rejoined_member_rereads_without_duplicates() {
    lost_assignment(None).await;
}

#[actix_rt::test]
async fn a_lost_assignment_under_the_eager_protocol_commits_nothing_either() {
    lost_assignment(Some((
        "HISTORY__KAFKA__PROPERTIES__PARTITION_ASSIGNMENT_STRATEGY",
        "range",
    )))
    .await;
}

async fn lost_assignment(property: Option<(&str, &str)>) {
    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 2).unwrap();
    let brokers = broker.bootstrap_servers();
    let records = events_with_duplicates(300, "lost", 20, 17);
    let distinct = distinct_events(&records) as i64;
    let delivered = produce(&brokers, &records).await;
    let ends = ends_of(&delivered, 2);

    let port = free_port();
    let mut env = service_env(&db.url(), &brokers, "history-lost", TOPIC);
    env.extend(property.map(|(k, v)| (k.to_owned(), v.to_owned())));
    env.extend([
        // Only a revoke or the shutdown commits: a commit at the loss would show.
        (
            "HISTORY__PIPELINE__COMMIT_INTERVAL_MS".into(),
            "3600000".into(),
        ),
        ("HISTORY__HTTP__ENABLED".into(), "true".into()),
        ("HISTORY__HTTP__LISTEN".into(), format!("127.0.0.1:{port}")),
    ]);
    let mut service = Child::spawn(&["run"], &env);
    wait_rows(&db, distinct, &service).await;

    // The coordinator forgets the member: its next heartbeat is answered UNKNOWN_MEMBER_ID,
    // and librdkafka declares the assignment lost (no clean revoke), then rejoins.
    "request-errors heartbeat 1 unknown-member"
        .parse::<history_devkit::faults::Fault>()
        .unwrap()
        .apply(&broker)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = scrape(port).await;
        let lost = sample(&metrics, "history_rebalances_total{kind=\"lost\"}");
        let again = sample(
            &metrics,
            "history_events_total{outcome=\"already_applied\"}",
        )
        .unwrap_or(0.0);
        // The first pass finds the duplicates applied; after the loss, every record is read a
        // second time from the group's (empty) position and found applied.
        let duplicates = records.len() as f64 - distinct as f64;
        if lost >= Some(1.0) && again >= duplicates + records.len() as f64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no loss and re-read seen: lost {lost:?}, already_applied {again}\n{}",
            service.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    let inspector = GroupInspector::new(&brokers, "history-lost").unwrap();
    assert_eq!(
        inspector
            .committed(TOPIC, 2, Duration::from_secs(5))
            .unwrap(),
        vec![None, None],
        "nothing was committed for the lost assignment"
    );
    assert!(service.logs().contains("assignment lost"));

    service.signal(libc::SIGTERM);
    assert_eq!(
        service.wait(Duration::from_secs(30)),
        Some(0),
        "{}",
        service.logs()
    );
    wait_committed(&brokers, "history-lost", &ends, Duration::from_secs(5)).await;
    assert_eq!(db.count("history_events").await, distinct);
    assert_eq!(db.count("inbox").await, distinct);
}
