//! Partitions take turns: with every partition backlogged and a database slower than the
//! backlog, the rows written come from every partition side by side, not one partition's fetched
//! run after another's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use history_devkit::test_app::TestApp;
use history_devkit::workload::PlannedRecord;

use crate::common::events_in_each;

const PARTITIONS: i32 = 4;
const EACH: usize = 3_000;

/// Events `fair-{partition}-{n}` for every partition, produced before the service starts: a
/// librdkafka producer puts each partition's run into batches of thousands of records, and a
/// fetch response carries a partition's first batch whole.
fn backlog() -> Vec<PlannedRecord> {
    events_in_each(PARTITIONS, 0, EACH, "fair")
}

/// Rows written so far, per partition.
async fn rows_per_partition(app: &TestApp) -> BTreeMap<i32, i64> {
    let rows = app
        .db
        .client()
        .await
        .query(
            "SELECT split_part(event_id, '-', 2)::int, count(*) FROM history_events \
             GROUP BY 1",
            &[],
        )
        .await
        .unwrap();
    let mut counts: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    for row in rows {
        counts.insert(row.get(0), row.get(1));
    }
    counts
}

/// Waits until the service says whether its partitions take turns, and requires that they do.
async fn assert_partitions_take_turns(app: &TestApp) {
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.get("history_partitions_in_turn").is_some()
    })
    .await;
    assert_eq!(
        app.metrics().await.get("history_partitions_in_turn"),
        Some(1.0),
        "four partitions under the default budget take turns"
    );
}

/// Taken from one consumer queue, in the order librdkafka fetched them, the first rows were
/// all one partition's (its first batch, thousands of records, ahead of everyone else's); each
/// partition's records now come from a queue of its own, one partition's after another's.
#[actix_rt::test]
async fn backlogged_partitions_are_written_side_by_side_under_a_slow_database() {
    let mut app = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "10");
        o.env("HISTORY__PIPELINE__MAX_IN_FLIGHT", "80");
    })
    .await;
    app.produce(&backlog()).await;
    app.db.slow_each_write(0.02).await;
    app.start();
    assert_partitions_take_turns(&app).await;

    // The first rows: far fewer than one partition's backlog.
    const FIRST: i64 = 400;
    let deadline = Instant::now() + Duration::from_secs(120);
    let counts = loop {
        let counts = rows_per_partition(&app).await;
        if counts.values().sum::<i64>() >= FIRST {
            break counts;
        }
        assert!(
            Instant::now() < deadline,
            "{counts:?} after 120 s:\n{}",
            app.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    };
    let written: i64 = counts.values().sum();
    let fair = written / PARTITIONS as i64;
    assert!(
        counts.values().all(|&rows| rows >= fair / 2),
        "every partition has at least half its share of the first {written} rows: {counts:?}"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// Rebalance callbacks run only where the consumer queue is polled. While partitions take turns
/// from queues of their own, those queues may never run dry in a backlog behind a database
/// slower than the broker: the consumer queue is polled once a turn all the same, so a member
/// that joins gets its partitions within seconds, not when the first member's backlog is done.
/// (The embedded broker's partition queues do run dry now and then — it fetches in small
/// steps — so here the join is served without that poll as well: this test keeps the join
/// working while partitions take turns, not the poll itself.)
#[actix_rt::test]
async fn a_member_joining_while_partitions_take_turns_is_served_before_the_backlog_ends() {
    const EACH: usize = 7_500;
    let total = PARTITIONS as i64 * EACH as i64;
    let mut first = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "10");
        o.env("HISTORY__PIPELINE__MAX_IN_FLIGHT", "200");
    })
    .await;
    first
        .produce(&events_in_each(PARTITIONS, 0, EACH, "join"))
        .await;
    // A few hundred events a second: the backlog lasts over a minute.
    first.db.slow_each_write(0.05).await;
    first.start();
    assert_partitions_take_turns(&first).await;
    first.wait_rows(100, Duration::from_secs(60)).await;

    let mut second = TestApp::spawn(|o| {
        o.share(&first);
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(45);
    // Assignments that gave the member partitions (a cooperative rebalance also assigns none).
    let assignments = |logs: String| {
        logs.lines()
            .filter(|line| line.contains("partitions assigned") && line.contains("partitions=[\""))
            .count()
    };
    while assignments(second.logs()) == 0 {
        assert!(
            Instant::now() < deadline,
            "the second member got no partition in 45 s while the first drained its \
             backlog:\n--- first ---\n{}\n--- second ---\n{}",
            first.logs(),
            second.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = first.db.count("history_events").await;
    assert!(
        rows < total,
        "the backlog ran out before the second member got partitions: the test proves nothing"
    );
    assert_eq!(second.stop(), Some(0), "{}", second.logs());
    // The first member's final commit is made once it holds every partition again: a commit
    // in the middle of the group's rebalance is refused.
    let deadline = Instant::now() + Duration::from_secs(45);
    while assignments(first.logs()) < 2 {
        assert!(
            Instant::now() < deadline,
            "the first member did not take its partitions back:\n{}",
            first.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(first.stop(), Some(0), "{}", first.logs());
}
