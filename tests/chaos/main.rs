//! Nothing lost, nothing twice — proven by breaking the service on purpose: the real binary is
//! killed and restarted, PostgreSQL restarted and its sessions cut, the broker's requests failed
//! and a broker taken down, and the invariants are checked from outside.
//!
//! Short mode by default (CI); `scripts/chaos.sh` runs the long mode. HISTORY_CHAOS_SEED
//! replays a run's schedule.

mod broker;
mod checker;
mod harness;
mod instance;
mod outcomes;
mod producer;
mod schedule;

use std::sync::Mutex;
use std::time::Duration;

use harness::{Chaos, Figures};
use history_devkit::probe::Metrics;
use schedule::{Action, Scale};

/// The runs share two cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn assert_clean(figures: &Figures) {
    assert!(
        figures.violations.is_empty(),
        "violations:\n{}",
        figures.violations.join("\n")
    );
    assert_eq!(figures.lost, 0, "events lost");
    assert_eq!(figures.unseen, 0, "records acknowledged and never stored");
    assert_eq!(figures.doubled, 0, "events recorded twice");
    assert_eq!(
        figures.regressions, 0,
        "committed positions moved backwards"
    );
    // Each lifetime against the inbox markers its own transactions inserted (crate::outcomes).
    assert_eq!(
        figures.outcomes.applied_beyond_markers,
        0,
        "Applied outcomes beyond the inbox markers their lifetime inserted:\n{}",
        figures.outcomes.violations.join("\n")
    );
    assert_eq!(
        figures.outcomes.applied_unreported,
        0,
        "inbox markers their lifetime did not report as Applied or unknown:\n{}",
        figures.outcomes.violations.join("\n")
    );
    assert!(
        figures.outcomes.violations.is_empty(),
        "outcomes:\n{}",
        figures.outcomes.violations.join("\n")
    );
    assert!(
        figures.outcomes.at_exit > 0,
        "no lifetime's whole count was read: {:?}",
        figures.outcomes
    );
    assert!(figures.commits_checked > 0, "no commit was observed");
}

/// Records per second while producing.
fn rate(scale: &Scale) -> f64 {
    scale.records as f64
        / scale
            .duration
            .mul_f64(schedule::PRODUCTION_SHARE)
            .as_secs_f64()
}

fn report(name: &str, text: &str) {
    if let Ok(dir) = std::env::var("HISTORY_CHAOS_REPORT_DIR") {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(format!("{dir}/{name}.txt"), text);
    }
}

#[test]
fn kills_database_restarts_and_broker_faults_lose_nothing_and_double_nothing() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let scale = Scale::from_env();
    let seed = schedule::seed();
    let plan = schedule::schedule(seed, scale.duration, 1, 5);
    assert!(
        plan.iter()
            .filter(|(_, a)| matches!(a, Action::Kill(_)))
            .count()
            >= 5
    );
    let records = schedule::workload(scale.records, seed);
    let started = std::time::Instant::now();
    let chaos = Chaos::start(seed, 1, rate(&scale));
    let figures = chaos.run(records, plan, scale.duration);
    report("single-instance", &figures.render(seed, started.elapsed()));
    assert_clean(&figures);
    assert!(figures.kills >= 5, "{figures:?}");
    assert_eq!(figures.postgres_restarts, 1);
    assert!(figures.database_freezes >= 1 && figures.database_connections_frozen > 0);
    assert!(figures.broker_faults >= 4);
    assert!(figures.poison > 0 && figures.duplicates > 0);
}

/// Three instances in a KIP-848 (`consumer` protocol) group; one at a time frozen (SIGSTOP)
/// past its session timeout — or, sometimes, for less — and continued (SIGCONT), several times,
/// seeded; the broker refusing some offset
/// commits and fetches and answering slowly for a while. The frozen member's partitions move to
/// the others and come back: nothing lost, nothing applied twice (the instances' own count of
/// `Applied` outcomes), nothing unseen, no position moving backwards.
#[test]
fn frozen_members_and_a_slow_broker_lose_nothing_and_apply_nothing_twice() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let scale = Scale::from_env();
    let seed = schedule::seed();
    let freezes = (scale.duration.as_secs() / 10).max(3) as usize;
    // Under KIP-848: librdkafka's mock broker aborts (an assertion in its classic group: a
    // member's second JoinGroup while its first is pending) when a member thawed after a long
    // freeze rejoins, which Kafka itself handles.
    let protocol = instance::Protocol::Consumer;
    let plan =
        schedule::frozen_members(seed, scale.duration, 3, freezes, protocol.session_timeout());
    let records = schedule::workload(scale.records, seed.wrapping_add(2));
    let started = std::time::Instant::now();
    let chaos = Chaos::start_with(seed, 3, rate(&scale), protocol);
    let figures = chaos.run(records, plan, scale.duration);
    report("frozen-members", &figures.render(seed, started.elapsed()));
    assert_clean(&figures);
    assert_eq!(figures.freezes, freezes);
    assert!(figures.broker_faults >= 4);
}

#[test]
fn three_instances_share_six_partitions_through_a_kill_and_a_restart() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let scale = Scale::from_env();
    let seed = schedule::seed();
    let plan = vec![
        (scale.duration.mul_f64(0.35), Action::Kill(1)),
        (scale.duration.mul_f64(0.65), Action::Start(1)),
        (scale.duration.mul_f64(0.5), Action::TerminateBackends),
        // Longer than the per-transaction deadline (10 s by default): the writers caught in a
        // frozen transaction give it up and write again on fresh connections.
        (scale.duration.mul_f64(0.1), Action::FreezeDatabase),
        (
            scale.duration.mul_f64(0.1) + Duration::from_secs(13),
            Action::ThawDatabase,
        ),
    ];
    let records = schedule::workload(scale.records, seed.wrapping_add(1));
    let started = std::time::Instant::now();
    let chaos = Chaos::start(seed, 3, rate(&scale));
    let figures = chaos.run(records, plan, scale.duration);
    report("three-instances", &figures.render(seed, started.elapsed()));
    assert_clean(&figures);
    assert_eq!(figures.kills, 1);
    assert!(
        figures.database_connections_frozen > 0 && figures.database_timeouts > 0,
        "the database freeze froze {} connections and ended {} writes by their deadline",
        figures.database_connections_frozen,
        figures.database_timeouts
    );
    // Three joins, then the kill and the return each move partitions: the logs show more
    // assignments and revokes than three first joins, and the metrics count them.
    assert!(
        figures.rebalances > 3,
        "rebalances seen in the logs: {}",
        figures.rebalances
    );
    let counted: f64 = figures
        .final_metrics
        .iter()
        .map(|text| Metrics::parse(text).sum("history_rebalances_total"))
        .sum();
    assert!(counted > 3.0, "rebalances in the metrics: {counted}");
}
