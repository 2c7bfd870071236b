//! Leaders and coordinators that move, as on a cluster being rolled or rebalanced by its
//! operators: partition leaderships moved between brokers mid-drain, the group's coordinator
//! moved, a broker taken down for a while and another decommissioned. The service's librdkafka
//! follows each move (a NOT_LEADER_OR_FOLLOWER or NOT_COORDINATOR answer, a metadata refresh);
//! no partition changes hands, so nothing is lost and nothing is read twice.

use std::time::{Duration, Instant};

use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, WorkloadSpec};

const RECORDS: usize = 12_000;
const PARTITIONS: i32 = 6;
const BROKERS: i32 = 3;

/// A service about to drain `RECORDS` unique events on six partitions led by three brokers,
/// writes slowed so that the moves land mid-drain.
async fn drain_across_brokers(prefix: &str) -> TestApp {
    let app = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.brokers = BROKERS;
        o.broker_proxied = true;
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "100");
        o.env("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "10000");
    })
    .await;
    app.db.slow_each_write(0.02).await;
    let records = workload::generate(&WorkloadSpec {
        records: RECORDS,
        duplicates: 0.0,
        poison: 0.0,
        partitions: PARTITIONS,
        id_prefix: prefix.into(),
        tickets: 500,
        max_payload_bytes: 65536,
        seed: rand::random(),
    });
    app.produce(&records).await;
    app
}

/// Every record written once, none read twice, no assignment lost.
async fn exactly_once(app: &mut TestApp) {
    app.wait_committed(Duration::from_secs(120)).await;
    assert_eq!(app.db.count("history_events").await, RECORDS as i64);
    assert_eq!(app.db.count("dead_letters").await, 0);
    let metrics = app.metrics().await;
    assert_eq!(
        metrics.get("history_events_total{outcome=\"already_applied\"}"),
        Some(0.0),
        "records done twice:\n{metrics}"
    );
    assert_eq!(
        metrics.get("history_rebalances_total{kind=\"lost\"}"),
        Some(0.0),
        "an assignment was lost"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn partition_leaders_moved_mid_drain_cost_no_record_and_redo_none() {
    let mut app = drain_across_brokers("leaders").await;
    app.start();
    let topic = app.topic.clone();
    // Six rounds, one every 1,500 rows written: each moves every partition's leadership on to
    // the next broker.
    for round in 1..=6 {
        app.wait_rows(round * 1_500, Duration::from_secs(60)).await;
        for partition in 0..PARTITIONS {
            let leader = (partition + round as i32) % BROKERS + 1;
            app.broker().set_leader(&topic, partition, leader).unwrap();
        }
    }
    assert!(
        app.db.count("history_events").await < RECORDS as i64,
        "the drain ended before the last move"
    );
    exactly_once(&mut app).await;
}

#[actix_rt::test]
async fn a_coordinator_moved_mid_drain_costs_no_record_and_redoes_none() {
    let mut app = drain_across_brokers("coordinator").await;
    app.start();
    let group = app.group.clone();
    for round in 1..=4 {
        app.wait_rows(round * 2_000, Duration::from_secs(60)).await;
        let commits = app.metrics().await.sum("history_offset_commits_total");
        app.broker()
            .set_coordinator(&group, round as i32 % BROKERS + 1)
            .unwrap();
        // Commits go on with the new coordinator before the next move.
        app.wait_for_metrics(Duration::from_secs(30), |m| {
            m.get("history_offset_commits_total{reason=\"periodic\",result=\"ok\"}")
                .is_some()
                && m.sum("history_offset_commits_total") >= commits + 2.0
        })
        .await;
    }
    exactly_once(&mut app).await;
}

#[actix_rt::test]
async fn a_broker_down_for_a_while_and_another_decommissioned_cost_no_record_and_redo_none() {
    let mut app = drain_across_brokers("decommission").await;
    app.start();
    app.wait_rows(2_000, Duration::from_secs(60)).await;
    // Down as its clients see it: every connection to it reset and new ones refused, through
    // its proxy. (The mock's own broker_down closes the broker's listening socket, and
    // broker_up binds the same port again — which aborted the whole test binary in a CI run,
    // "Failed to create mock broker listener", when another socket had taken the port.)
    let proxy = app
        .broker()
        .proxy(2)
        .expect("the cluster runs behind proxies");
    proxy.refuse_new(true);
    proxy.reset_all();
    let down_at = Instant::now();
    app.wait_rows(4_000, Duration::from_secs(60)).await;
    assert!(down_at.elapsed() < Duration::from_secs(60));
    proxy.refuse_new(false);
    app.wait_rows(6_000, Duration::from_secs(60)).await;
    app.broker().decommission(3).unwrap();
    assert!(
        app.db.count("history_events").await < RECORDS as i64,
        "the drain ended before the decommission"
    );
    exactly_once(&mut app).await;
}
