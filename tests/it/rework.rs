//! Rework bounded by the commit interval: each commit lists, in its metadata, the offsets above
//! its position that are done, and the partition's next owner skips them. The real binary, the
//! embedded broker, PostgreSQL; a record the database rejects keeps its partition's position at
//! it while everything after it is written.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use history_devkit::process::Signal;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{Delivered, PlannedRecord, RecordKind};
use history_service::offsets::DoneOffsets;

use crate::common::{covered_by_refused_commits, stopped_field, unique_events};

const ROWS_TIMEOUT: Duration = Duration::from_secs(120);
const SKIPPED: &str = "history_records_skipped_as_done_total";
const EVENTS: &str = "history_events_total";

fn event_id(record: &PlannedRecord) -> &str {
    match &record.kind {
        RecordKind::Event { event_id } => event_id,
        other => panic!("not a first delivery: {other:?}"),
    }
}

/// Makes the database reject `record`'s event (a constraint it breaks): its writer sets it
/// aside and retries it alone, and its partition's position stays at it while every record
/// after it is written.
async fn reject(app: &TestApp, record: &PlannedRecord) {
    app.db
        .client()
        .await
        .batch_execute(&format!(
            "ALTER TABLE history_events ADD CONSTRAINT held CHECK (event_id <> '{}')",
            event_id(record)
        ))
        .await
        .unwrap();
}

/// The database takes the rejected event again.
async fn accept_again(app: &TestApp) {
    app.db
        .client()
        .await
        .batch_execute("ALTER TABLE history_events DROP CONSTRAINT held")
        .await
        .unwrap();
}

/// The record produced at `offset` of `partition`.
fn at(delivered: &[Delivered], partition: i32, offset: i64) -> &Delivered {
    delivered
        .iter()
        .find(|d| d.partition == partition && d.offset == offset)
        .expect("the partition has the record")
}

/// A counter the test needs, summed over its labels: it must be exported.
fn counter(metrics: &history_devkit::probe::Metrics, name: &str, outcome: Option<&str>) -> f64 {
    let samples: Vec<_> = metrics
        .samples()
        .iter()
        .filter(|sample| sample.name == name)
        .filter(|sample| outcome.is_none_or(|outcome| sample.label("outcome") == Some(outcome)))
        .collect();
    assert!(
        !samples.is_empty(),
        "{name} {outcome:?} is not exported:\n{}",
        metrics.text()
    );
    samples.iter().map(|sample| sample.value).sum()
}

/// What the group's committed positions cover: offsets below the position, and those listed
/// as done in its metadata.
struct Covered(BTreeMap<i32, (i64, DoneOffsets)>);

impl Covered {
    async fn read(app: &TestApp) -> Covered {
        let mut covered = BTreeMap::new();
        for (partition, committed) in app.committed_with_metadata().await.into_iter().enumerate() {
            if let Some((position, metadata)) = committed {
                let listed = DoneOffsets::decode(position, metadata.as_bytes())
                    .unwrap_or_else(|err| panic!("{metadata:?} is not ours: {err}"))
                    .unwrap_or_default();
                covered.insert(partition as i32, (position, listed));
            }
        }
        Covered(covered)
    }

    fn below(&self, partition: i32, offset: i64) -> bool {
        self.0
            .get(&partition)
            .is_some_and(|(position, _)| offset < *position)
    }

    fn listed(&self, partition: i32, offset: i64) -> bool {
        self.0
            .get(&partition)
            .is_some_and(|(position, listed)| offset >= *position && listed.contains(offset))
    }
}

/// The offsets whose events have a history row, by partition.
async fn written(
    app: &TestApp,
    records: &[PlannedRecord],
    delivered: &[Delivered],
) -> HashSet<(i32, i64)> {
    let rows: HashSet<String> = app
        .db
        .client()
        .await
        .query("SELECT event_id FROM history_events", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.get(0))
        .collect();
    delivered
        .iter()
        .filter(|d| rows.contains(event_id(&records[d.index])))
        .map(|d| (d.partition, d.offset))
        .collect()
}

/// The issue's stop: a record held in the database keeps the partition's position at it while
/// everything after it is written; the stop's final commit lists all of that, and the next owner
/// writes the held record alone.
#[actix_rt::test]
async fn a_stop_behind_a_held_record_lists_what_it_wrote_and_the_next_owner_skips_it() {
    let mut first = TestApp::prepare(|o| {
        o.env("HISTORY__PIPELINE__SHUTDOWN_TIMEOUT_MS", "500");
    })
    .await;
    let total = 300;
    let records = unique_events(total, "listed", 5);
    let delivered = first.produce(&records).await;
    let held = *delivered.iter().find(|d| d.offset == 100).unwrap();
    reject(&first, &records[held.index]).await;
    first.start();
    first.wait_rows(total as i64 - 1, ROWS_TIMEOUT).await;
    let code = first.stop_with(Signal::SIGTERM);
    let first_logs = first.logs();
    assert_eq!(code, Some(3), "records are left behind:\n{first_logs}");

    let covered = Covered::read(&first).await;
    let (position, listed) = covered
        .0
        .get(&held.partition)
        .expect("a position committed");
    assert_eq!(*position, held.offset, "{first_logs}");
    for d in delivered.iter().filter(|d| d.offset > held.offset) {
        assert!(
            listed.contains(d.offset),
            "{} not listed: {listed:?}",
            d.offset
        );
    }
    assert!(!listed.contains(held.offset));

    accept_again(&first).await;
    let mut second = TestApp::spawn(|o| {
        o.share(&first);
    })
    .await;
    second.wait_rows(total as i64, ROWS_TIMEOUT).await;
    second.wait_committed(ROWS_TIMEOUT).await;
    let metrics = second.metrics().await;
    assert_eq!(counter(&metrics, SKIPPED, None), (total - 101) as f64);
    assert_eq!(counter(&metrics, EVENTS, Some("applied")), 1.0);
    assert_eq!(
        counter(&metrics, EVENTS, Some("already_applied")),
        0.0,
        "the next owner wrote again what was listed:\n{}",
        second.logs()
    );
    assert_eq!(second.stop(), Some(0));
}

/// A crash mid-drain: the next owner writes again exactly what its predecessor wrote after the
/// last commit the broker has — no more, whatever holds the positions back — and that is what
/// the last two commit intervals before the crash wrote at most.
#[actix_rt::test]
async fn a_crash_mid_drain_is_redone_only_past_the_last_commit_interval() {
    let interval = Duration::from_millis(300);
    let mut first = TestApp::prepare(|o| {
        o.partitions = 3;
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "5");
        o.env(
            "HISTORY__PIPELINE__COMMIT_INTERVAL_MS",
            interval.as_millis().to_string(),
        );
    })
    .await;
    let total = 3_000;
    let records = unique_events(total, "crash", 7);
    let delivered = first.produce(&records).await;
    // Partition 0's record at offset 50 is rejected: that partition's position stays at it.
    let held = *at(&delivered, 0, 50);
    reject(&first, &records[held.index]).await;
    first.db.slow_each_write(0.01).await;
    first.start();

    // Rows over time, to know what the last intervals before the crash wrote.
    let mut rows_at: Vec<(Instant, i64)> = Vec::new();
    let deadline = Instant::now() + ROWS_TIMEOUT;
    loop {
        let rows = first.db.count("history_events").await;
        rows_at.push((Instant::now(), rows));
        if rows >= total as i64 / 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{rows} rows:\n{}", first.logs());
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        first.stop_with(Signal::SIGKILL),
        None,
        "killed by the signal"
    );
    let killed_at = Instant::now();
    // A transaction whose COMMIT reached PostgreSQL before the kill still lands: count once no
    // backend of the database is running a statement (one CI run counted a batch too early).
    let settled = Instant::now() + Duration::from_secs(30);
    loop {
        let running: i64 = first
            .db
            .client()
            .await
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND state = 'active' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if running == 0 {
            break;
        }
        assert!(
            Instant::now() < settled,
            "the killed instance's statements never ended"
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    let rows_at_kill = first.db.count("history_events").await;
    let before_two_intervals = rows_at
        .iter()
        .rev()
        .find(|(at, _)| killed_at.duration_since(*at) >= 2 * interval)
        .map_or(0, |(_, rows)| *rows);

    let covered = Covered::read(&first).await;
    let written = written(&first, &records, &delivered).await;
    assert_eq!(written.len() as i64, rows_at_kill);
    let to_redo = written
        .iter()
        .filter(|&&(partition, offset)| {
            !covered.below(partition, offset) && !covered.listed(partition, offset)
        })
        .count();
    let to_skip = delivered
        .iter()
        .filter(|d| covered.listed(d.partition, d.offset))
        .count();
    assert!(
        to_skip > 0,
        "the held partition's commit lists what was written behind the held record"
    );
    assert!(
        to_redo as i64 <= rows_at_kill - before_two_intervals,
        "{to_redo} to redo, but the last two commit intervals wrote {}",
        rows_at_kill - before_two_intervals
    );

    accept_again(&first).await;
    let mut second = TestApp::spawn(|o| {
        o.share(&first);
    })
    .await;
    second.wait_rows(total as i64, ROWS_TIMEOUT).await;
    second.wait_committed(ROWS_TIMEOUT).await;
    let metrics = second.metrics().await;
    let logs = second.logs();
    assert_eq!(
        counter(&metrics, EVENTS, Some("already_applied")),
        to_redo as f64,
        "re-done: what the crashed owner wrote past its last commit\n{logs}"
    );
    assert_eq!(counter(&metrics, SKIPPED, None), to_skip as f64, "{logs}");
    assert_eq!(
        counter(&metrics, EVENTS, Some("applied")),
        (total - written.len()) as f64
    );
    assert_eq!(second.stop(), Some(0));
    eprintln!(
        "crash: {rows_at_kill} written, {to_skip} skipped as done, {to_redo} re-done (the last \
         two {interval:?} intervals wrote {})",
        rows_at_kill - before_two_intervals
    );
}

/// Metadata this version cannot read — another tool's, or a list of ours that a tool moved to
/// another position — is ignored with a WARN: every record above the position is processed.
#[actix_rt::test]
async fn metadata_of_another_tool_or_another_position_is_ignored_and_everything_processed() {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
    })
    .await;
    let records = unique_events(200, "foreign", 9);
    let delivered = app.produce(&records).await;
    let from = 10;
    // Partition 0: another tool's metadata. Partition 1: a list of ours for position 3, which
    // would list every offset up to 1,000 as done, committed at position 10.
    let ours_elsewhere = DoneOffsets::from_runs([history_service::offsets::Run {
        first: 4,
        last: 1_000,
    }])
    .encode(3, 4096)
    .text;
    app.commit_from_outside(&[
        (0, from, r#"{"consumer":"parallel","v":3}"#.to_owned()),
        (1, from, ours_elsewhere),
    ])
    .await;
    app.start();
    let expected = delivered.iter().filter(|d| d.offset >= from).count() as i64;
    app.wait_rows(expected, ROWS_TIMEOUT).await;
    app.wait_committed(ROWS_TIMEOUT).await;
    let metrics = app.metrics().await;
    assert_eq!(counter(&metrics, SKIPPED, None), 0.0);
    assert_eq!(app.db.count("history_events").await, expected);
    let logs = app.logs();
    let warned = logs
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("not a list of done offsets"))
        .count();
    assert_eq!(warned, 2, "{logs}");
    assert!(
        logs.contains("belongs to position 3, not to the committed 10"),
        "{logs}"
    );
}

/// Waits until `app`'s current run has partitions assigned.
async fn wait_assigned(app: &TestApp, rows_left: impl AsyncFn() -> bool) {
    let deadline = Instant::now() + ROWS_TIMEOUT;
    while !app.logs().contains("partitions assigned") {
        assert!(
            rows_left().await,
            "the backlog ran out before every member had partitions"
        );
        assert!(Instant::now() < deadline, "{}", app.logs());
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A rolling restart of three replicas under a backlog, one partition held back by a record the
/// database rejects: each stop's final commit lists what was written behind it, each next owner
/// skips it — nothing is written twice.
#[actix_rt::test]
async fn a_rolling_restart_of_three_replicas_redoes_nothing() {
    rolling_restart("classic").await;
}

/// Under KIP-848 the partition held by the rejected record changes owners several times in a
/// restart: each owner after the first starts at that record, and commits what it does behind
/// it only because the position it inherited may be committed again with a longer list (before
/// that, 625 records re-done here, 2,800 in a CI run).
#[actix_rt::test]
async fn a_rolling_restart_of_three_replicas_redoes_nothing_under_the_consumer_protocol() {
    rolling_restart("consumer").await;
}

async fn rolling_restart(protocol: &str) {
    let mut first = TestApp::prepare(|o| {
        o.partitions = 6;
        o.protocol(protocol);
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "10");
        // Each stop takes its whole deadline under the slow database: kept short.
        o.env("HISTORY__PIPELINE__SHUTDOWN_TIMEOUT_MS", "2000");
        // Every commit's verdict logged: what the mock broker refused is read from them.
        o.env(
            "HISTORY__LOG__FILTER",
            "info,history_service::commits=debug",
        );
    })
    .await;
    let total = 60_000;
    let records = unique_events(total, "rolling", 13);
    let delivered = first.produce(&records).await;
    let held = *at(&delivered, 0, 50);
    reject(&first, &records[held.index]).await;
    first.db.slow_each_write(0.05).await;
    first.start();
    let mut replicas = vec![first];
    for _ in 0..2 {
        let replica = TestApp::spawn(|o| {
            o.share(&replicas[0]);
        })
        .await;
        replicas.push(replica);
    }
    let db = replicas[0].db.clone();
    let rows_left = async || db.count("history_events").await < total as i64 - 1;
    for replica in &replicas {
        wait_assigned(replica, &rows_left).await;
    }

    let mut runs = Vec::new();
    let mut skipped = 0.0;
    for replica in &mut replicas {
        let now = db.count("history_events").await;
        replica.wait_rows(now + 1_000, ROWS_TIMEOUT).await;
        skipped += counter(&replica.metrics().await, SKIPPED, None);
        let code = replica.stop();
        let logs = replica.logs();
        assert!(matches!(code, Some(0 | 3)), "{logs}");
        runs.push(logs);
        replica.start();
        wait_assigned(replica, &rows_left).await;
    }
    assert!(
        rows_left().await,
        "the backlog ran out before the restarts were done"
    );
    accept_again(&replicas[0]).await;
    replicas[0].wait_rows(total as i64, ROWS_TIMEOUT).await;
    replicas[0].wait_committed(ROWS_TIMEOUT).await;
    for replica in &mut replicas {
        skipped += counter(&replica.metrics().await, SKIPPED, None);
        assert_eq!(replica.stop(), Some(0), "{}", replica.logs());
        runs.push(replica.logs());
    }
    let all = runs.join("\n----\n");
    let redone: u64 = runs
        .iter()
        .map(|logs| stopped_field(logs, "already_applied").expect("a stop line"))
        .sum();
    assert_eq!(db.count("history_events").await, total as i64);
    // Nothing is re-done but what a commit the mock broker alone refuses covered (it refuses
    // every commit while a classic group's member joins; none, in most runs). Under the
    // consumer protocol nothing at all.
    let logs: Vec<&str> = runs.iter().map(String::as_str).collect();
    let mocks = match protocol {
        "classic" => covered_by_refused_commits(&logs),
        _ => 0,
    };
    assert!(
        redone <= mocks,
        "{redone} records written twice, {mocks} covered by commits only the mock broker \
         refuses:\n{all}"
    );
    assert!(
        skipped > 0.0,
        "no owner skipped what its predecessor listed:\n{all}"
    );
    eprintln!(
        "rolling restart ({protocol}): {total} events, {skipped} skipped as done, {redone} re-done \
         ({mocks} covered by commits the mock refused)"
    );
}

/// Takes the lists an assignment reads, for a test.
struct Lists(std::sync::mpsc::Sender<history_service::kafka::messages::Inherit>);

impl actix::Actor for Lists {
    type Context = actix::Context<Self>;
}

impl actix::Handler<history_service::kafka::messages::Inherit> for Lists {
    type Result = ();

    fn handle(
        &mut self,
        msg: history_service::kafka::messages::Inherit,
        _: &mut actix::Context<Self>,
    ) {
        let _ = self.0.send(msg);
    }
}

/// The read of the lists at an assignment waits for the coordinator only until its deadline: a
/// cluster that accepts connections and never answers costs the list, not the assignment.
#[actix_rt::test]
async fn reading_the_lists_gives_up_at_its_deadline_when_the_coordinator_never_answers() {
    use actix::Actor;
    use history_service::domain::TopicPartition;
    use history_service::kafka::done_lists::DoneLists;
    use rdkafka::ClientConfig;
    use rdkafka::consumer::BaseConsumer;

    // Connections are accepted (by the kernel) and never answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set(
            "bootstrap.servers",
            silent.local_addr().unwrap().to_string(),
        )
        .set("group.id", "silent")
        .create()
        .unwrap();
    let (sent, _received) = std::sync::mpsc::channel();
    let lists = DoneLists::new(Lists(sent).start().recipient(), 4096);
    let (done, finished) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let partitions = [(TopicPartition::new("t", 0), 1)];
        lists.read(&consumer, &partitions, Duration::from_millis(500));
        let _ = done.send(started.elapsed());
    });
    let took = tokio::task::spawn_blocking(move || finished.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the read returns at its deadline");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// A broker whose `offset.metadata.max.bytes` is below the service's bound refuses the commit
/// (OFFSET_METADATA_TOO_LARGE): the service says so, halves its bound and commits on.
#[actix_rt::test]
async fn metadata_refused_as_too_large_is_cut_and_committed_again() {
    const OFFSET_COMMIT: i16 = 8;
    let mut app = TestApp::prepare(|_| {}).await;
    let total = 300;
    let records = unique_events(total, "too-large", 17);
    let delivered = app.produce(&records).await;
    let held = *delivered.iter().find(|d| d.offset == 100).unwrap();
    reject(&app, &records[held.index]).await;
    app.start();
    app.wait_rows(total as i64 - 1, ROWS_TIMEOUT).await;
    app.broker().push_request_errors(
        OFFSET_COMMIT,
        &[rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE; 3],
    );
    let deadline = Instant::now() + ROWS_TIMEOUT;
    loop {
        let logs = app.logs();
        let refused = logs
            .lines()
            .filter(|line| line.contains("refused an offset commit's metadata as too large"))
            .count();
        let covered = Covered::read(&app).await;
        let all_listed = delivered
            .iter()
            .filter(|d| d.offset > held.offset)
            .all(|d| covered.listed(d.partition, d.offset));
        if refused >= 1 && all_listed {
            assert!(logs.contains("after=2048"), "{logs}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "refused {refused} times:\n{logs}"
        );
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    accept_again(&app).await;
    app.wait_committed(ROWS_TIMEOUT).await;
}
