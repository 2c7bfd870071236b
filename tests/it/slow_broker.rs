//! A slow broker, end to end: every request answered 200 ms late, then for a while 2 s late —
//! as good as frozen connections, short of the session timeout — while the service drains a
//! backlog. Nothing is lost, and nothing is done twice: a slow broker delays fetches and commits,
//! it moves no partition. The broker's connections frozen for 2 s, through the kit's fault proxy,
//! cost nothing either.

use std::time::Duration;

use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, WorkloadSpec};

const RECORDS: usize = 12_000;

/// A service about to drain a backlog of `RECORDS` unique events on 3 partitions, produced,
/// not started: writes slowed to about 3,000 events/s so that faults land mid-drain, and the
/// default session timeout (with the tests' 3 s, answers 2 s late leave a heartbeat a second of
/// slack, which a loaded machine can eat: the assignment was lost once).
async fn slow_drain(prefix: &str, seed: u64, broker_proxied: bool) -> TestApp {
    let app = TestApp::prepare(|o| {
        o.partitions = 3;
        o.broker_proxied = broker_proxied;
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "100");
        o.env("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "10000");
    })
    .await;
    app.db.slow_each_write(0.05).await;
    let records = workload::generate(&WorkloadSpec {
        records: RECORDS,
        duplicates: 0.0,
        poison: 0.0,
        partitions: 3,
        id_prefix: prefix.into(),
        tickets: 500,
        max_payload_bytes: 65536,
        seed,
    });
    app.produce(&records).await;
    app
}

#[actix_rt::test]
async fn a_broker_answering_late_costs_no_record_and_redoes_none() {
    let mut app = slow_drain("slow-broker", 5, false).await;
    app.start();
    let rtt = |delay: Duration| {
        app.broker()
            .cluster()
            .broker_round_trip_time(1, delay)
            .expect("the mock broker takes a round-trip time")
    };

    app.wait_rows(1_000, Duration::from_secs(60)).await;
    rtt(Duration::from_millis(200));
    app.wait_rows(3_000, Duration::from_secs(60)).await;
    rtt(Duration::from_secs(2));
    // Two seconds of answers two seconds late: a commit, a fetch and a heartbeat at most each.
    let slow_from = app.db.count("history_events").await;
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.get("history_offset_commits_total{reason=\"periodic\",result=\"ok\"}")
            .is_some()
    })
    .await;
    let commits_before = app.metrics().await.sum("history_offset_commits_total");
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.sum("history_offset_commits_total") >= commits_before + 1.0
    })
    .await;
    rtt(Duration::from_millis(200));
    app.wait_rows(slow_from + 1_000, Duration::from_secs(60))
        .await;
    rtt(Duration::ZERO);

    app.wait_committed(Duration::from_secs(120)).await;
    assert_eq!(app.db.count("history_events").await, RECORDS as i64);
    let metrics = app.metrics().await;
    assert_eq!(
        metrics.get("history_events_total{outcome=\"already_applied\"}"),
        Some(0.0),
        "records done twice behind a slow broker:\n{metrics}"
    );
    assert_eq!(
        metrics.get("history_rebalances_total{kind=\"lost\"}"),
        Some(0.0),
        "a slow broker cost the assignment"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// Issue 22's target: 2 s of frozen broker connections cost no record and re-do at most one
/// commit interval. The broker is reached through the kit's fault proxy (the mock cluster
/// advertises the proxy's address); a third into the drain every open connection to it —
/// fetches, heartbeats, commits — is frozen both ways for 2 s (nothing forwarded, the sockets
/// open), then thawed. Default session timeout (10 s): a freeze well short of it moves no
/// partition, and with no partition moved nothing is read twice.
#[actix_rt::test]
async fn two_seconds_of_frozen_broker_connections_cost_no_record_and_redo_none() {
    let mut app = slow_drain("frozen-broker", 6, true).await;
    app.start();
    app.wait_rows(RECORDS as i64 / 3, Duration::from_secs(60))
        .await;
    let proxy = app
        .broker()
        .proxy(1)
        .expect("the broker runs behind a proxy");
    let frozen = proxy.freeze_open(history_devkit::fault_proxy::Direction::Both);
    assert!(frozen >= 1, "no connection to the broker was open");
    let at_freeze = app.db.count("history_events").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = app.db.count("history_events").await - at_freeze;
    proxy.thaw();

    app.wait_committed(Duration::from_secs(120)).await;
    assert_eq!(app.db.count("history_events").await, RECORDS as i64);
    let metrics = app.metrics().await;
    assert_eq!(
        metrics.get("history_events_total{outcome=\"already_applied\"}"),
        Some(0.0),
        "records done twice behind frozen broker connections:\n{metrics}"
    );
    assert_eq!(
        metrics.get("history_rebalances_total{kind=\"lost\"}"),
        Some(0.0),
        "2 s of frozen connections cost the assignment"
    );
    eprintln!(
        "{frozen} broker connections frozen for 2 s; {during} rows written meanwhile (from what \
         was fetched); nothing re-done, nothing lost"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}
