//! Handing partitions over, end to end: the real binary, the embedded broker, PostgreSQL. With a
//! healthy database a graceful stop or a rebalance re-does nothing: every record written is
//! covered by a confirmed commit before its partition changes hands.

use std::time::{Duration, Instant};

use history_devkit::process::Signal;
use history_devkit::test_app::TestApp;
use rand::Rng;

use crate::common::{covered_by_refused_commits, logged_number, stopped_field, unique_events};

/// The group's committed offsets summed over the partitions (none committed counts as 0).
async fn committed_sum(app: &TestApp) -> i64 {
    app.committed()
        .await
        .into_iter()
        .map(|offset| offset.unwrap_or(0))
        .sum()
}

/// How long waiting for rows may take here: the backlogs are large.
const ROWS_TIMEOUT: Duration = Duration::from_secs(120);

/// Sends SIGTERM; returns how long the process took to exit, and its exit code.
fn stop(service: &mut TestApp) -> (Duration, Option<i32>) {
    stop_with(service, Signal::SIGTERM)
}

fn stop_with(service: &mut TestApp, signal: Signal) -> (Duration, Option<i32>) {
    let asked = Instant::now();
    let code = service.stop_with(signal);
    (asked.elapsed(), code)
}

/// Partition numbers named in the log lines containing `marker` (before `until`, if given).
fn partitions_in(logs: &str, topic: &str, marker: &str, until: Option<&str>) -> Vec<i32> {
    let mut found = Vec::new();
    for line in logs.lines() {
        if until.is_some_and(|until| line.contains(until)) {
            break;
        }
        if !line.contains(marker) {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find(&format!("{topic}[")) {
            rest = &rest[at + topic.len() + 1..];
            let number: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(partition) = number.parse() {
                found.push(partition);
            }
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// The consumer property that picks the eager protocol instead of the cooperative default.
const EAGER: (&str, &str) = (
    "HISTORY__KAFKA__PROPERTIES__PARTITION_ASSIGNMENT_STRATEGY",
    "range",
);

#[actix_rt::test]
async fn sigterm_at_random_moments_of_a_backlog_commits_exactly_the_rows_written() {
    stops_commit_exactly_what_was_written(10, None, "classic").await;
}

#[actix_rt::test]
async fn sigterm_under_the_eager_protocol_commits_exactly_the_rows_written() {
    stops_commit_exactly_what_was_written(3, Some(EAGER), "classic").await;
}

#[actix_rt::test]
async fn sigterm_under_the_consumer_group_protocol_commits_exactly_the_rows_written() {
    stops_commit_exactly_what_was_written(5, None, "consumer").await;
}

/// SIGTERM `stops` times at random moments of a backlog of unique events: every stop is clean
/// and quick, and leaves the group's committed offsets equal to the rows written.
async fn stops_commit_exactly_what_was_written(
    stops: usize,
    property: Option<(&str, &str)>,
    protocol: &str,
) {
    let partitions = 12;
    let mut app = TestApp::prepare(|o| {
        o.partitions = partitions;
        o.protocol(protocol);
        if let Some((key, value)) = property {
            o.env(key, value);
        }
        // A small window keeps each stop's drain small, so the backlog lasts for every stop.
        o.env("HISTORY__PIPELINE__MAX_IN_FLIGHT_PER_PARTITION", "100");
    })
    .await;
    let total = 60_000;
    app.produce(&unique_events(total, "stop", 42)).await;
    let mut rng = rand::rng();

    let mut slowest = Duration::ZERO;
    for attempt in 0..stops {
        let before = app.db.count("history_events").await;
        app.start();
        // A random moment well inside the backlog.
        let target = before + rng.random_range(200..2_500);
        app.wait_rows(target, ROWS_TIMEOUT).await;
        // SIGHUP asks for the same graceful stop as SIGTERM.
        let signal = if attempt == 1 {
            Signal::SIGHUP
        } else {
            Signal::SIGTERM
        };
        let (took, code) = stop_with(&mut app, signal);
        let logs = app.logs();
        assert_eq!(code, Some(0), "stop {attempt}: not a clean stop\n{logs}");
        slowest = slowest.max(took);
        assert!(
            took < Duration::from_secs(2),
            "stop {attempt} took {took:?}: it waited out a timeout\n{logs}"
        );
        let rows = app.db.count("history_events").await;
        let committed = committed_sum(&app).await;
        assert_eq!(
            committed, rows,
            "stop {attempt}: offsets committed != rows written\n{logs}"
        );
        assert_eq!(
            stopped_field(&logs, "already_applied"),
            Some(0),
            "stop {attempt}: a record was done twice\n{logs}"
        );
        assert_eq!(stopped_field(&logs, "left"), Some(0), "{logs}");
        assert!(
            rows < total as i64,
            "the backlog ran out before stop {attempt}"
        );
        eprintln!("stop {attempt}: {rows} rows, committed {committed}, took {took:?}");
    }
    eprintln!("{stops} stops, the slowest took {slowest:?}");
}

#[actix_rt::test]
async fn a_member_joining_and_leaving_mid_backlog_redoes_nothing_and_moves_only_what_it_must() {
    let (first_logs, second_logs) = join_and_leave(None, "classic", PERIODIC).await;
    let both = format!("--- first ---\n{first_logs}\n--- second ---\n{second_logs}");
    let redone = stopped_field(&first_logs, "already_applied").expect("a stop line")
        + stopped_field(&second_logs, "already_applied").expect("a stop line");
    // Nothing is re-done but what a commit the mock broker alone refuses covered (none, in most
    // runs); a commit refused for any other reason fails here.
    let mocks = covered_by_refused_commits(&[&first_logs, &second_logs]);
    eprintln!("classic: {redone} records re-done, {mocks} covered by commits the mock refused");
    assert!(
        redone <= mocks,
        "{redone} records done twice, {mocks} covered by commits only the mock broker refuses\n{both}"
    );
    let given_away = partitions_in(
        &first_logs,
        TOPIC,
        "partitions revoked",
        Some("SIGTERM received"),
    );
    let taken = partitions_in(&second_logs, TOPIC, "partitions assigned", None);
    assert!(
        !given_away.is_empty() && given_away.len() < JOIN_PARTITIONS as usize,
        "cooperative: only the partitions that move are revoked, got {given_away:?}"
    );
    assert!(
        given_away.iter().all(|p| taken.contains(p)),
        "revoked {given_away:?}, but the newcomer got {taken:?}"
    );
}

/// Under KIP-848 the broker assigns and each member reconciles on its own heartbeat: the
/// newcomer gets only partitions the first member revoked, and what the first member wrote
/// before handing a partition over is committed, so neither member does a record twice —
/// asserted whatever happened, with no exception for a refused commit (a commit refused for a
/// stale member epoch is tried again while the partition is still ours).
#[actix_rt::test]
async fn a_member_joining_and_leaving_under_the_consumer_protocol_redoes_nothing() {
    // No periodic commit: the revoke's commit alone decides where the newcomer starts, so a
    // revoke that did not commit what was written shows as records done twice.
    let (first_logs, second_logs) = join_and_leave(None, "consumer", HANDOVER_ONLY).await;
    let both = format!("--- first ---\n{first_logs}\n--- second ---\n{second_logs}");
    for (name, logs) in [("first", &first_logs), ("second", &second_logs)] {
        assert_eq!(
            stopped_field(logs, "already_applied"),
            Some(0),
            "the {name} member did records twice\n{both}"
        );
    }
    let given_away = partitions_in(
        &first_logs,
        TOPIC,
        "partitions revoked",
        Some("SIGTERM received"),
    );
    let taken = partitions_in(&second_logs, TOPIC, "partitions assigned", None);
    assert!(
        !given_away.is_empty() && given_away.len() < JOIN_PARTITIONS as usize,
        "incremental: only the partitions that move are revoked, got {given_away:?}\n{both}"
    );
    assert!(
        given_away.iter().all(|p| taken.contains(p)),
        "revoked {given_away:?}, but the newcomer got {taken:?}\n{both}"
    );
    // librdkafka reports KIP-848's rebalances as cooperative, so rdkafka's rebalance handling
    // (which our context keeps) calls incremental_assign / incremental_unassign.
    assert!(
        first_logs
            .lines()
            .filter(|line| line.contains("partitions revoked"))
            .all(|line| line.contains("protocol=\"cooperative\"")),
        "{first_logs}"
    );
    eprintln!(
        "consumer protocol: revoked {given_away:?}, the newcomer got {taken:?}; commits refused \
         and tried again: {}",
        both.matches("offset commit refused").count()
    );
}

/// The eager protocol revokes every partition of every member on each rebalance; what was
/// written is still never lost or doubled, and both stops are clean.
#[actix_rt::test]
async fn a_member_joining_and_leaving_under_the_eager_protocol_loses_and_doubles_nothing() {
    let (first_logs, second_logs, samples) =
        join_and_leave_sampled(Some(EAGER), "classic", PERIODIC).await;
    let both = format!("--- first ---\n{first_logs}\n--- second ---\n{second_logs}");
    // An eager revoke runs once the group has begun to rebalance, and librdkafka's mock broker
    // refuses every commit from then until the rebalance completes (Kafka accepts them): the
    // revoke's commit is refused there, and what the member wrote since its last confirmed
    // commit is read again by the next owner. That — and no more — is what may be re-done.
    let redone = stopped_field(&first_logs, "already_applied").unwrap()
        + stopped_field(&second_logs, "already_applied").unwrap();
    let bounds = uncovered_at_revokes(&first_logs, &samples);
    let bound: i64 = bounds.iter().sum();
    eprintln!(
        "eager: {redone} records re-done; written after the last confirmed commit before each \
         revoke: {bounds:?}"
    );
    assert!(redone as i64 <= bound, "{redone} re-done > {bound}\n{both}");
    let given_away = partitions_in(
        &first_logs,
        TOPIC,
        "partitions revoked",
        Some("SIGTERM received"),
    );
    assert_eq!(
        given_away.len(),
        JOIN_PARTITIONS as usize,
        "eager: a join revokes every partition"
    );
}

const JOIN_PARTITIONS: i32 = 8;
/// The largest batch a writer writes in the join-and-leave tests.
const JOIN_BATCH: i64 = 100;

/// The topic of the join-and-leave tests, named so that their logs can be read afterwards.
const TOPIC: &str = "tickets.status.join";

/// A second member joins mid-backlog and later leaves with SIGTERM; the first finishes the
/// backlog and stops. Checks rows and offsets; returns both members' logs.
/// The test environment's commit interval (100 ms).
const PERIODIC: Option<&str> = None;
/// A commit interval of an hour: only revokes and stops commit.
const HANDOVER_ONLY: Option<&str> = Some("3600000");

/// Rows written, sampled every 50 ms, with the wall-clock time of each sample (the time the
/// service's log lines carry).
type RowSamples = Vec<(chrono::DateTime<chrono::Utc>, i64)>;

async fn join_and_leave(
    property: Option<(&str, &str)>,
    protocol: &str,
    commit_interval_ms: Option<&str>,
) -> (String, String) {
    let (first, second, _) = join_and_leave_sampled(property, protocol, commit_interval_ms).await;
    (first, second)
}

async fn join_and_leave_sampled(
    property: Option<(&str, &str)>,
    protocol: &str,
    commit_interval_ms: Option<&str>,
) -> (String, String, RowSamples) {
    let mut first = TestApp::prepare(|o| {
        o.partitions = JOIN_PARTITIONS;
        o.topic = TOPIC.into();
        o.protocol(protocol);
        o.env(
            "HISTORY__PIPELINE__BATCH_MAX_EVENTS",
            JOIN_BATCH.to_string(),
        );
        // Every confirmed commit logged: where a revoke's next owner starts is read from them.
        o.env(
            "HISTORY__LOG__FILTER",
            "info,history_service::commits=debug",
        );
        if let Some(interval) = commit_interval_ms {
            o.env("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", interval);
        }
        if let Some((key, value)) = property {
            o.env(key, value);
        }
    })
    .await;
    // Enough for the backlog to outlast two rebalances (the mock broker takes seconds each):
    // the writes are slowed to about 4,000 events/s (50 ms per batch of 100), as the service
    // otherwise drains it before the second member is in.
    let total = 120_000;
    first.produce(&unique_events(total, "join", 7)).await;
    first.db.slow_each_write(0.05).await;

    first.start();
    first.wait_rows(2_000, ROWS_TIMEOUT).await;
    // The service starts with none; then sampled from now (the newcomer is not in yet).
    let started = vec![(chrono::DateTime::<chrono::Utc>::MIN_UTC, 0)];
    let samples = std::rc::Rc::new(std::cell::RefCell::new(started));
    let sampling = {
        let (db, samples) = (first.db.clone(), samples.clone());
        actix_rt::spawn(async move {
            let client = db.client().await;
            loop {
                let at = chrono::Utc::now();
                let rows: i64 = client
                    .query_one("SELECT count(*) FROM history_events", &[])
                    .await
                    .unwrap()
                    .get(0);
                samples.borrow_mut().push((at, rows));
                actix_rt::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let mut second = TestApp::spawn(|o| {
        o.share(&first);
    })
    .await;
    // The newcomer got partitions and wrote some of their records.
    let deadline = Instant::now() + Duration::from_secs(60);
    while partitions_in(&second.logs(), TOPIC, "partitions assigned", None).is_empty() {
        assert!(
            first.db.count("history_events").await < total as i64,
            "the backlog ran out before the second member got partitions"
        );
        assert!(Instant::now() < deadline, "{}", second.logs());
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    // Some work after the join; the backlog may end sooner when the first member runs fast.
    let joined_at = first.db.count("history_events").await;
    first
        .wait_rows((joined_at + 3_000).min(total as i64), ROWS_TIMEOUT)
        .await;
    let (_, code) = stop(&mut second);
    let second_logs = second.logs();
    assert_eq!(code, Some(0), "{second_logs}");

    // The first instance takes the partitions back and finishes the backlog.
    first.wait_rows(total as i64, ROWS_TIMEOUT).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while commit_interval_ms.is_none() && committed_sum(&first).await != total as i64 {
        assert!(Instant::now() < deadline, "{}", first.logs());
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, code) = stop(&mut first);
    let first_logs = first.logs();
    assert_eq!(code, Some(0), "{first_logs}");
    assert_eq!(committed_sum(&first).await, total as i64, "{first_logs}");

    assert_eq!(first.db.count("history_events").await, total as i64);
    assert_eq!(first.db.count("inbox").await, total as i64);
    sampling.abort();
    let samples = samples.borrow().clone();
    (first_logs, second_logs, samples)
}

/// The time a log line carries (its first field).
fn logged_at(line: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let stamp = line.split_whitespace().next()?;
    Some(chrono::DateTime::parse_from_rfc3339(stamp).ok()?.into())
}

/// For each revoke of `logs` (before its stop): the rows written from the member's last
/// confirmed commit before the revoke until the revoke was handled, and the writes still under
/// way then — what its next owner may read again if the broker refuses the revoke's commit. A
/// revoke that reaches its deadline sets the records in flight aside, and the batches its
/// writers had begun (one each, `JOIN_BATCH` events at most) land after it: one CI run re-did
/// exactly 200 rows (2 writers × 100) more than the rows counted to the revoke's end. Taken
/// from `samples` widely: the last sample before the one moment (at worst the service's start,
/// with no rows), the first after the other.
fn uncovered_at_revokes(logs: &str, samples: &RowSamples) -> Vec<i64> {
    let writers = logs
        .lines()
        .find(|line| line.contains("history-service starting"))
        .and_then(|line| logged_number(line, "writers"))
        .expect("the start-up line names the writers") as i64;
    let lines: Vec<&str> = logs
        .lines()
        .take_while(|line| !line.contains("SIGTERM received"))
        .collect();
    let mut bounds = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        if !line.contains("partitions revoked") {
            continue;
        }
        let last_ok = lines[..at]
            .iter()
            .rev()
            .find(|line| line.contains("offset committed"))
            .and_then(|line| logged_at(line));
        let handled = lines[at..]
            .iter()
            .find(|line| line.contains("revoke handled"))
            .and_then(|line| logged_at(line));
        let (Some(from), Some(to)) = (last_ok, handled) else {
            panic!("revoke without a commit before it or its end:\n{logs}");
        };
        let before = samples.iter().rev().find(|(t, _)| *t <= from);
        let after = samples.iter().find(|(t, _)| *t >= to);
        let (Some((_, before)), Some((_, after))) = (before, after) else {
            panic!("no sample around the revoke ({from} .. {to})");
        };
        bounds.push(after - before + writers * JOIN_BATCH);
    }
    bounds
}

#[actix_rt::test]
async fn a_stop_that_leaves_records_behind_its_final_commit_exits_3_and_says_how_many() {
    let mut app = TestApp::prepare(|o| {
        o.env("HISTORY__PIPELINE__SHUTDOWN_TIMEOUT_MS", "500");
        // One event per transaction, so the held-up event holds up no other.
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "1");
    })
    .await;
    let records = unique_events(50, "left", 3);
    // Another session holds the first event's inbox marker: its write waits in the database,
    // and every record after it can resolve but not be committed.
    let first_id: String = {
        let payload = records[0].payload.as_deref().unwrap();
        let event: serde_json::Value = serde_json::from_slice(payload).unwrap();
        event["event_id"].as_str().unwrap().to_owned()
    };
    let blocker = app.db.client().await;
    blocker
        .batch_execute(&format!("BEGIN; INSERT INTO inbox VALUES ('{first_id}')"))
        .await
        .unwrap();
    app.produce(&records).await;
    app.start();
    app.wait_rows(10, ROWS_TIMEOUT).await;
    let (_, code) = stop(&mut app);
    let logs = app.logs();
    assert_eq!(code, Some(3), "{logs}");
    let stopped = logs
        .lines()
        .rev()
        .find(|line| line.contains("history-service stopped"))
        .unwrap_or_default();
    assert!(
        stopped.contains("records left behind the final commit"),
        "the last line says records were left: {stopped}"
    );
    assert!(stopped_field(&logs, "unresolved") >= Some(1), "{stopped}");
    assert!(stopped_field(&logs, "left") >= Some(1), "{stopped}");
    assert_eq!(
        committed_sum(&app).await,
        0,
        "nothing is committed past the held-up first record"
    );
    blocker.batch_execute("ROLLBACK").await.unwrap();
}

/// Issue 21's bar: a `consumer`-protocol (KIP-848) group of three instances drains a backlog
/// while members join and leave — B joins, C joins, B leaves, C leaves — with nothing lost,
/// nothing doubled and nothing re-done: every handover's position is committed by the revoke
/// or the stop that hands it over (the periodic commit is an hour away, so only they commit).
#[actix_rt::test]
async fn three_consumer_protocol_members_joining_and_leaving_redo_nothing() {
    let topic = "tickets.status.three";
    let mut first = TestApp::prepare(|o| {
        o.partitions = 12;
        o.topic = topic.into();
        o.protocol("consumer");
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "100");
        o.env("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "3600000");
    })
    .await;
    let total = 150_000;
    first.produce(&unique_events(total, "three", 11)).await;
    first.db.slow_each_write(0.05).await;
    first.start();
    first.wait_rows(2_000, ROWS_TIMEOUT).await;

    let joined =
        |app: &TestApp| !partitions_in(&app.logs(), topic, "partitions assigned", None).is_empty();
    let mut others = Vec::new();
    for name in ["second", "third"] {
        let member = TestApp::spawn(|o| {
            o.share(&first);
        })
        .await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !joined(&member) {
            assert!(
                first.db.count("history_events").await < total as i64,
                "the backlog ran out before the {name} member got partitions"
            );
            assert!(Instant::now() < deadline, "{}", member.logs());
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
        let now = first.db.count("history_events").await;
        first
            .wait_rows((now + 3_000).min(total as i64), ROWS_TIMEOUT)
            .await;
        others.push((name, member));
    }
    let mut logs = Vec::new();
    for (name, mut member) in others {
        let (_, code) = stop(&mut member);
        let member_logs = member.logs();
        assert_eq!(code, Some(0), "{member_logs}");
        logs.push((name, member_logs));
        let now = first.db.count("history_events").await;
        first
            .wait_rows((now + 3_000).min(total as i64), ROWS_TIMEOUT)
            .await;
    }
    assert!(
        first.db.count("history_events").await < total as i64,
        "the backlog ran out before the members had left"
    );
    first.wait_rows(total as i64, ROWS_TIMEOUT).await;
    let (_, code) = stop(&mut first);
    logs.insert(0, ("first", first.logs()));
    let all: String = logs
        .iter()
        .map(|(name, logs)| format!("--- {name} ---\n{logs}\n"))
        .collect();
    assert_eq!(code, Some(0), "{all}");
    assert_eq!(committed_sum(&first).await, total as i64, "{all}");
    assert_eq!(first.db.count("history_events").await, total as i64);
    assert_eq!(first.db.count("inbox").await, total as i64);
    for (name, member_logs) in &logs {
        assert_eq!(
            stopped_field(member_logs, "already_applied"),
            Some(0),
            "the {name} member did records twice\n{all}"
        );
    }
    // Each assignment's check of the database reads partitions to their end: the end is its
    // signal, not an error to log.
    assert!(!all.contains("PartitionEOF"), "{all}");
    let revokes: usize = logs
        .iter()
        .map(|(_, logs)| logs.matches("partitions revoked").count())
        .sum();
    eprintln!("three consumer-protocol members: {total} events, {revokes} revokes, 0 re-done");
}
