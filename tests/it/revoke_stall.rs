//! A revoke stalls nothing else. While librdkafka runs a rebalance callback it pauses every
//! partition of the member, kept ones too, so a revoke that waits stalls the whole instance:
//! the revoke waits only for records that are moving, never for an event the database rejects
//! (parked by its writer), which it leaves to the partition's next owner at its offset.
//!
//! Each test has a member join mid-backlog while every partition holds an event the database
//! rejects, with the revoke's deadline at a minute: a revoke that waited for the rejected event
//! would hold the newcomer off (and the instance's intake still) for that minute. Each prints a
//! `RESULT` line — the instance's write rate before the revoke, its kept partitions' rate from
//! the revoke until the newcomer has its partitions, the longest time the instance wrote
//! nothing — the figures in docs/reliability.md.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use history_devkit::test_app::TestApp;
use history_devkit::workload::{PlannedRecord, RecordKind, event_payload};

use crate::stuck_events::reject_ticket_poison;

const PARTITIONS: i32 = 6;
/// Enough that the kept partitions still have records to write through a slow join round.
const PER_PARTITION: usize = 12_000;
/// Where in each partition the event the database rejects is.
const POISON_AT: usize = 300;
/// Far beyond how long the newcomer is waited for: a revoke that waits for the rejected event
/// shows as a newcomer that gets nothing.
const REVOKE_TIMEOUT_MS: &str = "60000";
const NEWCOMER_TIMEOUT: Duration = Duration::from_secs(30);

fn planned(event_id: String, ticket_id: &str, partition: i32) -> PlannedRecord {
    PlannedRecord {
        key: ticket_id.as_bytes().to_vec(),
        payload: Some(event_payload(
            &event_id,
            ticket_id,
            "open",
            "closed",
            chrono::Utc::now(),
        )),
        partition: Some(partition),
        kind: RecordKind::Event { event_id },
    }
}

/// Events named `stall-p{partition}-{n}`, so the rows written can be counted per partition,
/// and one event of `ticket-poison` in every partition.
fn backlog() -> Vec<PlannedRecord> {
    let mut records = Vec::new();
    for n in 0..PER_PARTITION {
        for partition in 0..PARTITIONS {
            if n == POISON_AT {
                records.push(planned(
                    format!("poison-p{partition}"),
                    "ticket-poison",
                    partition,
                ));
            }
            let ticket = format!("ticket-{}", n % 997);
            records.push(planned(
                format!("stall-p{partition}-{n}"),
                &ticket,
                partition,
            ));
        }
    }
    records
}

/// Rows written per partition.
async fn rows_per_partition(app: &TestApp) -> BTreeMap<i32, i64> {
    let rows = app
        .db
        .client()
        .await
        .query(
            "SELECT split_part(event_id, '-', 2), count(*) FROM history_events \
             WHERE event_id LIKE 'stall-%' GROUP BY 1",
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|row| {
            let partition: String = row.get(0);
            let count: i64 = row.get(1);
            (partition[1..].parse().unwrap(), count)
        })
        .collect()
}

/// Partition numbers of `topic` named in the first log line containing `marker` that names
/// any (a cooperative rebalance's first round may assign none).
fn partitions_in_first(logs: &str, topic: &str, marker: &str) -> Option<Vec<i32>> {
    logs.lines()
        .filter(|line| line.contains(marker))
        .map(|line| {
            let mut found = Vec::new();
            let mut rest = line;
            while let Some(at) = rest.find(&format!("{topic}[")) {
                rest = &rest[at + topic.len() + 1..];
                let number: String = rest.chars().take_while(char::is_ascii_digit).collect();
                found.extend(number.parse::<i32>().ok());
            }
            found
        })
        .find(|found| !found.is_empty())
}

/// The rows of `partitions` written between two samples, per second.
fn rate(
    samples: &[(Instant, BTreeMap<i32, i64>)],
    from: Instant,
    to: Instant,
    partitions: &[i32],
) -> f64 {
    let at = |when: Instant| {
        samples
            .iter()
            .min_by_key(|(t, _)| if *t > when { *t - when } else { when - *t })
            .expect("samples")
    };
    let ((t0, first), (t1, last)) = (at(from), at(to));
    let rows: i64 = partitions
        .iter()
        .map(|p| last.get(p).copied().unwrap_or(0) - first.get(p).copied().unwrap_or(0))
        .sum();
    rows as f64 / (*t1 - *t0).as_secs_f64()
}

/// The longest time between `from` and `to` in which the partitions `ours` names at each
/// moment wrote no row (to the samples' resolution, about 100 ms).
fn longest_stall<'p>(
    samples: &[(Instant, BTreeMap<i32, i64>)],
    from: Instant,
    to: Instant,
    ours: impl Fn(Instant) -> &'p [i32],
) -> Duration {
    let rows = |sample: &BTreeMap<i32, i64>, partitions: &[i32]| -> i64 {
        partitions
            .iter()
            .map(|p| sample.get(p).copied().unwrap_or(0))
            .sum()
    };
    let within: Vec<_> = samples
        .iter()
        .filter(|(t, _)| *t >= from && *t <= to)
        .collect();
    let mut longest = Duration::ZERO;
    let mut since = None;
    for pair in within.windows(2) {
        let ((t0, a), (t1, b)) = (pair[0], pair[1]);
        let partitions = ours(*t1);
        if rows(b, partitions) == rows(a, partitions) {
            let start = *since.get_or_insert(*t0);
            longest = longest.max(*t1 - start);
        } else {
            since = None;
        }
    }
    longest
}

#[actix_rt::test]
async fn a_revoke_under_classic_waits_for_no_rejected_event_and_the_kept_partitions_flow() {
    revoke_with_a_rejected_event("classic").await;
}

#[actix_rt::test]
async fn a_revoke_under_consumer_waits_for_no_rejected_event_and_the_kept_partitions_flow() {
    revoke_with_a_rejected_event("consumer").await;
}

async fn revoke_with_a_rejected_event(protocol: &str) {
    let topic = format!("tickets.status.stall-{protocol}");
    let mut first = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.topic = topic.clone();
        o.protocol(protocol);
        o.env("HISTORY__KAFKA__REVOKE_TIMEOUT_MS", REVOKE_TIMEOUT_MS);
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "100");
    })
    .await;
    reject_ticket_poison(&first, true).await;
    // About 6,000 events/s: the backlog outlasts the join by far.
    first.db.slow_each_write(0.05).await;
    let records = backlog();
    first.produce(&records).await;
    first.start();
    first.wait_rows(5_000, Duration::from_secs(120)).await;

    // The rate before the rebalance.
    let mut samples: Vec<(Instant, BTreeMap<i32, i64>)> = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        samples.push((Instant::now(), rows_per_partition(&first).await));
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    let mut second = TestApp::spawn(|o| {
        o.share(&first);
    })
    .await;
    // Sampled until the newcomer has partitions, and two seconds more.
    let joined = Instant::now();
    let mut revoked_at = None;
    let mut assigned_at = None;
    while assigned_at.is_none_or(|at: Instant| at.elapsed() < Duration::from_secs(2)) {
        samples.push((Instant::now(), rows_per_partition(&first).await));
        if revoked_at.is_none() && first.logs().contains("partitions revoked") {
            revoked_at = Some(Instant::now());
        }
        if assigned_at.is_none()
            && partitions_in_first(&second.logs(), &topic, "partitions assigned").is_some()
        {
            assigned_at = Some(Instant::now());
        }
        assert!(
            joined.elapsed() < NEWCOMER_TIMEOUT,
            "the newcomer got no partition in {NEWCOMER_TIMEOUT:?}: the revoke waits for the \
             rejected event\n--- first ---\n{}\n--- second ---\n{}",
            first.logs(),
            second.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    let first_logs = first.logs();
    let revoked = partitions_in_first(&first_logs, &topic, "partitions revoked").unwrap();
    let kept: Vec<i32> = (0..PARTITIONS).filter(|p| !revoked.contains(p)).collect();
    assert!(
        !kept.is_empty() && !revoked.is_empty(),
        "revoked {revoked:?}\n{first_logs}"
    );
    let (revoked_at, assigned_at) = (revoked_at.unwrap(), assigned_at.unwrap());
    // librdkafka hands a backlog over a partition at a time (a fetch response of up to 1 MiB
    // each), so the kept partitions' own rate before the revoke depends on which one was being
    // read: the instance's rate is the baseline, and what the instance keeps must go on at it.
    let all: Vec<i32> = (0..PARTITIONS).collect();
    let before = rate(
        &samples,
        revoked_at - Duration::from_secs(3),
        revoked_at,
        &all,
    );
    // The rebalance: from the revoke until the newcomer has its partitions, at least a second —
    // or until the kept partitions' backlog is written out, if sooner: an instance with
    // nothing left to write is not stalled (on a loaded machine the join round took 6 s and
    // the kept partitions ran dry in 3.5 s of it, which read as a 2.5 s stall).
    let drained_at = samples
        .iter()
        .find(|(t, rows)| {
            *t > revoked_at
                && kept
                    .iter()
                    .all(|p| rows.get(p).copied().unwrap_or(0) == PER_PARTITION as i64)
        })
        .map(|(t, _)| *t);
    let until = assigned_at
        .max(revoked_at + Duration::from_secs(1))
        .min(drained_at.unwrap_or(assigned_at + Duration::from_secs(2)));
    assert!(
        until - revoked_at >= Duration::from_secs(1),
        "the kept partitions {kept:?} wrote out their backlog {:?} after the revoke: too soon to \
         see whether the rebalance stalls them (raise PER_PARTITION)\n{first_logs}",
        until - revoked_at
    );
    let during = rate(&samples, revoked_at, until, &kept);
    // The instance's own writes: every partition before the revoke, the kept ones after it.
    let ours = |t: Instant| if t < revoked_at { &all[..] } else { &kept[..] };
    let stall = longest_stall(&samples, revoked_at - Duration::from_secs(3), until, ours);
    let handled = first_logs
        .lines()
        .find(|line| line.contains("revoke handled"))
        .unwrap_or_default()
        .to_owned();
    let elapsed = handled
        .split("elapsed_ms=")
        .nth(1)
        .unwrap_or_default()
        .trim();
    eprintln!(
        "RESULT protocol={protocol} kept={kept:?} revoked={revoked:?} revoke_ms={elapsed} \
         rows_per_s_before={before:.0} kept_rows_per_s_during={during:.0} during_s={:.1} \
         ratio={:.2} longest_stall_ms={}",
        (until - revoked_at).as_secs_f64(),
        during / before,
        stall.as_millis()
    );
    assert!(
        first_logs.contains("partition revoked with records still in flight"),
        "the rejected event was still unresolved at the revoke\n{first_logs}"
    );
    // The kept partitions flow through the rebalance: written all along, never standing still
    // for long. (A revoke that waited for the rejected event stalled them 1.9 to 4.8 s and
    // wrote them at 0.18 to 0.52 of the rate before, in six runs; with it they run at 0.91 to
    // 1.11 with no stall.)
    assert!(
        during > 0.0,
        "the kept partitions {kept:?} wrote nothing during the rebalance\n{first_logs}"
    );
    assert!(
        stall < Duration::from_millis(1500),
        "the instance wrote nothing for {stall:?} around the revoke\n{first_logs}"
    );
    // And at most a little slower than the whole instance before it (0.89 to 1.05 under two
    // CPU hogs; a revoke waiting for the rejected event showed 0.52 at best).
    assert!(
        during / before >= 0.6,
        "the kept partitions {kept:?} wrote {during:.0} rows/s during the rebalance, {:.2} of \
         the instance's {before:.0} before it\n{first_logs}",
        during / before
    );

    // Let the rejected events through: every event recorded once, and both members stop clean.
    reject_ticket_poison(&first, false).await;
    let total = records.len() as i64;
    first.wait_rows(total, Duration::from_secs(180)).await;
    assert_eq!(first.db.count("inbox").await, total);
    for app in [&mut second, &mut first] {
        app.wait_committed(Duration::from_secs(60)).await;
        assert_eq!(app.stop(), Some(0), "{}", app.logs());
    }
}

/// A revoke whose partitions' writes hang in the database (another session holds their inbox
/// markers) ends at `kafka.revoke_timeout_ms`, 2 s here, plus at most a second, committing what
/// it can: the newcomer gets its partitions, and nothing is lost. Without the deadline the revoke
/// would wait for the held writes for as long as the other session holds them (each attempt
/// ends at `database.statement_timeout_ms` and the next waits again) — the newcomer would get
/// nothing in the 30 s it is waited for.
#[actix_rt::test]
async fn a_revoke_whose_writes_hang_in_the_database_ends_at_its_deadline() {
    const PER: usize = 400;
    let topic = "tickets.status.hang";
    let mut first = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.topic = topic.into();
        o.env("HISTORY__KAFKA__REVOKE_TIMEOUT_MS", "2000");
        // One writer whose first transaction takes the whole backlog: it waits for the other
        // session, and it holds records of every partition, whichever are revoked.
        o.env("HISTORY__PIPELINE__WRITERS", "1");
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "5000");
        o.env("HISTORY__PIPELINE__BATCH_LINGER_MS", "1000");
    })
    .await;
    let mut records = Vec::new();
    for n in 0..PER {
        for partition in 0..PARTITIONS {
            let ticket = format!("ticket-{}", n % 97);
            records.push(planned(
                format!("hang-p{partition}-{n}"),
                &ticket,
                partition,
            ));
        }
    }
    // Every partition has an event whose write waits for the other session.
    let blocker = first.db.client().await;
    let held: Vec<String> = (0..PARTITIONS)
        .map(|p| format!("('hang-p{p}-100')"))
        .collect();
    blocker
        .batch_execute(&format!(
            "BEGIN; INSERT INTO inbox VALUES {}",
            held.join(", ")
        ))
        .await
        .unwrap();
    first.produce(&records).await;
    first.start();
    let deadline = Instant::now() + Duration::from_secs(60);
    while first.db.lock_waiters().await == 0 {
        assert!(
            Instant::now() < deadline,
            "no write waits\n{}",
            first.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }

    let mut second = TestApp::spawn(|o| {
        o.share(&first);
    })
    .await;
    let joined = Instant::now();
    while partitions_in_first(&second.logs(), topic, "partitions assigned").is_none() {
        assert!(
            joined.elapsed() < NEWCOMER_TIMEOUT,
            "the newcomer got no partition in {NEWCOMER_TIMEOUT:?}: the revoke waits for the \
             hung writes\n--- first ---\n{}",
            first.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    let logs = first.logs();
    let handled = logs
        .lines()
        .find(|line| line.contains("revoke handled"))
        .expect("the revoke ended");
    let elapsed: u64 = handled
        .split("elapsed_ms=")
        .nth(1)
        .and_then(|ms| ms.trim().parse().ok())
        .expect("the revoke's duration");
    eprintln!("a revoke held by hung writes (deadline 2000 ms) took {elapsed} ms");
    assert!(
        logs.contains("partition revoked with records still in flight at the deadline"),
        "the revoke had no hung write of its partitions to wait for\n{logs}"
    );
    assert!(
        elapsed <= 3000,
        "the revoke took {elapsed} ms, beyond its bound plus a second\n{logs}"
    );

    blocker.batch_execute("ROLLBACK").await.unwrap();
    let total = records.len() as i64;
    first.wait_rows(total, Duration::from_secs(120)).await;
    for app in [&mut second, &mut first] {
        app.wait_committed(Duration::from_secs(60)).await;
        assert_eq!(app.stop(), Some(0), "{}", app.logs());
    }
    assert_eq!(first.db.count("inbox").await, total);
}
