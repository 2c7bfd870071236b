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
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.get("history_partitions_in_turn").is_some()
    })
    .await;
    assert_eq!(
        app.metrics().await.get("history_partitions_in_turn"),
        Some(1.0),
        "four partitions under the default budget take turns"
    );

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
