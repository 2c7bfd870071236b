//! The plan of a run: its size, its records, and a seeded schedule of faults.

use std::time::Duration;

use history_devkit::workload::{self, PlannedRecord, WorkloadSpec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub const TOPIC: &str = "tickets.status.v1";
pub const GROUP: &str = "history-chaos";
pub const PARTITIONS: i32 = 6;
/// The share of the run during which records are produced; the rest lets the service catch up.
pub const PRODUCTION_SHARE: f64 = 0.7;
/// The instances' `pipeline.max_payload_bytes`.
pub const MAX_PAYLOAD: usize = 4096;

/// How big a run is: the short mode runs in CI, the long one by `scripts/chaos.sh`.
pub struct Scale {
    pub records: usize,
    pub duration: Duration,
}

impl Scale {
    /// From HISTORY_CHAOS_RECORDS (default 3,000) and HISTORY_CHAOS_SECONDS (default 30).
    pub fn from_env() -> Scale {
        let number = |key: &str, default: u64| {
            std::env::var(key)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        Scale {
            records: number("HISTORY_CHAOS_RECORDS", 3000) as usize,
            duration: Duration::from_secs(number("HISTORY_CHAOS_SECONDS", 30)),
        }
    }
}

/// The seed of a run: HISTORY_CHAOS_SEED replays a run; otherwise a fresh one, printed.
pub fn seed() -> u64 {
    let seed = std::env::var("HISTORY_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("chaos seed: {seed} (HISTORY_CHAOS_SEED={seed} replays this schedule)");
    seed
}

/// Something the schedule does at a moment of the run.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Kill(usize),
    Start(usize),
    RestartPostgres,
    TerminateBackends,
    /// Every open connection between the service and PostgreSQL frozen (nothing forwarded, the
    /// sockets open: a hung primary, a fail-over whose old address still acknowledges); new
    /// connections go through.
    FreezeDatabase,
    /// The frozen connections flow again (what they held is forwarded).
    ThawDatabase,
    /// SIGSTOP: the instance freezes, its sockets open, its heartbeats stopped.
    Freeze(usize),
    /// SIGCONT.
    Thaw(usize),
    /// A line for `dev-kafka`'s fault channel.
    Broker(String),
}

/// Leaderships and the group's coordinator moved between the three brokers now and then, as
/// when operators roll or rebalance a cluster: librdkafka follows each move (a
/// NOT_LEADER_OR_FOLLOWER or NOT_COORDINATOR answer, a metadata refresh).
fn moves(rng: &mut SmallRng, duration: Duration, plan: &mut Vec<(Duration, Action)>) {
    for _ in 0..(3 + duration.as_secs() / 10) {
        let partition = rng.random_range(0..PARTITIONS);
        let leader = rng.random_range(1..=3);
        plan.push((
            duration.mul_f64(rng.random_range(0.05..0.85)),
            Action::Broker(format!("leader {TOPIC} {partition} {leader}")),
        ));
    }
    for _ in 0..(1 + duration.as_secs() / 60) {
        let coordinator = rng.random_range(1..=3);
        plan.push((
            duration.mul_f64(rng.random_range(0.1..0.8)),
            Action::Broker(format!("coordinator {GROUP} {coordinator}")),
        ));
    }
}

/// A seeded schedule of frozen members: `freezes` times one of `instances` is stopped (SIGSTOP)
/// for 1 to 3 session timeouts — or, one time in four, for less than one — then continued;
/// meanwhile the broker refuses some offset commits and fetches, for a while answers 200 ms
/// late, and twice has every connection to it frozen for 2 s (through `dev-kafka`'s proxies:
/// nothing forwarded, the sockets open).
pub fn frozen_members(
    seed: u64,
    duration: Duration,
    instances: usize,
    freezes: usize,
    session_timeout: Duration,
) -> Vec<(Duration, Action)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut plan = Vec::new();
    let slot = duration.mul_f64(0.8) / freezes.max(1) as u32;
    for k in 0..freezes {
        let at = slot * k as u32 + slot.mul_f64(rng.random_range(0.1..0.4));
        let instance = rng.random_range(0..instances);
        let length = if rng.random_bool(0.25) {
            session_timeout.mul_f64(rng.random_range(0.2..0.8))
        } else {
            session_timeout.mul_f64(rng.random_range(1.2..3.0))
        };
        plan.push((at, Action::Freeze(instance)));
        plan.push((at + length, Action::Thaw(instance)));
    }
    let mut at = |from: f64, to: f64| duration.mul_f64(rng.random_range(from..to));
    for (api, error) in [
        ("offset-commit", "coordinator-not-available"),
        ("offset-commit", "request-timed-out"),
        ("fetch", "transport"),
        ("fetch", "not-leader"),
    ] {
        plan.push((
            at(0.05, 0.8),
            Action::Broker(format!("request-errors {api} 2 {error}")),
        ));
    }
    for _ in 0..2 {
        let frozen_at = at(0.1, 0.8);
        plan.push((frozen_at, Action::Broker("freeze-connections both".into())));
        plan.push((
            frozen_at + Duration::from_secs(2),
            Action::Broker("thaw".into()),
        ));
    }
    let slow_from = at(0.2, 0.6);
    let slow_for = duration.mul_f64(0.1);
    for broker in 1..=3 {
        plan.push((slow_from, Action::Broker(format!("rtt {broker} 200"))));
        plan.push((
            slow_from + slow_for,
            Action::Broker(format!("rtt {broker} 0")),
        ));
    }
    moves(&mut rng, duration, &mut plan);
    plan.sort_by_key(|(when, _)| *when);
    plan
}

/// A seeded schedule: the same seed gives the same actions at the same offsets.
pub fn schedule(
    seed: u64,
    duration: Duration,
    instances: usize,
    kills: usize,
) -> Vec<(Duration, Action)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut plan = Vec::new();
    // Kills spread over the first 85% of the run, each followed by a restart 0.3-2 s later.
    let slot = duration.mul_f64(0.85) / kills.max(1) as u32;
    for k in 0..kills {
        let kill_at = slot * k as u32 + slot.mul_f64(rng.random_range(0.2..0.7));
        let instance = k % instances;
        plan.push((kill_at, Action::Kill(instance)));
        let restart_after = Duration::from_millis(rng.random_range(300..2000));
        plan.push((kill_at + restart_after, Action::Start(instance)));
    }
    let mut at = |from: f64, to: f64| duration.mul_f64(rng.random_range(from..to));
    plan.push((at(0.3, 0.6), Action::RestartPostgres));
    // Sessions cut about every three seconds: each may land inside a transaction.
    let terminations = (duration.as_secs() / 3).max(2);
    for _ in 0..terminations {
        plan.push((at(0.05, 0.85), Action::TerminateBackends));
    }
    // Frozen database connections, each longer than the per-transaction deadline
    // (`database.statement_timeout_ms`, 10 s by default) so that the deadline ends the wait.
    for _ in 0..(duration.as_secs() / 60).max(1) {
        let frozen_at = at(0.1, 0.6);
        let frozen_for =
            Duration::from_secs(11) + at(0.0, 1.0).mul_f64(4.0 / duration.as_secs_f64());
        plan.push((frozen_at, Action::FreezeDatabase));
        plan.push((frozen_at + frozen_for, Action::ThawDatabase));
    }
    let down_at = at(0.15, 0.7);
    let up_after = at(0.03, 0.08);
    let broker = 1 + (seed % 3) as i32;
    plan.push((down_at, Action::Broker(format!("broker-down {broker}"))));
    plan.push((
        down_at + up_after,
        Action::Broker(format!("broker-up {broker}")),
    ));
    for (api, error) in [
        ("fetch", "transport"),
        ("offset-commit", "coordinator-not-available"),
        ("heartbeat", "rebalance-in-progress"),
        // The coordinator forgets the member: librdkafka declares the assignment lost.
        ("heartbeat", "unknown-member"),
        ("fetch", "not-leader"),
    ] {
        let count = 1 + (seed as usize + api.len()) % 4;
        plan.push((
            at(0.05, 0.85),
            Action::Broker(format!("request-errors {api} {count} {error}")),
        ));
    }
    moves(&mut rng, duration, &mut plan);
    plan.sort_by_key(|(when, _)| *when);
    plan
}

/// The stream of a run: events with 10% duplicates (some on other partitions) and 1% poison.
pub fn workload(records: usize, seed: u64) -> Vec<PlannedRecord> {
    workload::generate(&WorkloadSpec {
        records,
        duplicates: 0.1,
        poison: 0.01,
        partitions: PARTITIONS,
        id_prefix: format!("chaos-{seed}"),
        tickets: 300,
        max_payload_bytes: MAX_PAYLOAD,
        seed,
    })
}
