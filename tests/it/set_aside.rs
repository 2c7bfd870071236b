//! End to end: an event the database rejects, set aside by the operator while two replicas
//! run — the database is the channel, so it does not matter which replica holds it. It becomes
//! a dead letter with its own bytes, its partition moves on, and nothing else is touched.

use std::time::{Duration, Instant};

use history_devkit::test_app::TestApp;
use history_devkit::workload::RecordKind;

use crate::stuck_events::{planned, reject_ticket_poison};

const PARTITIONS: i32 = 2;
const PER_PARTITION: usize = 40;
const STUCK_PARTITION: i32 = 1;

/// Runs `history-service dead-letters set-aside …` against `app`'s deployment; the exit code
/// and what it printed.
fn set_aside(app: &TestApp, topic: &str, partition: i32, offset: i64) -> (Option<i32>, String) {
    let (partition, offset) = (partition.to_string(), offset.to_string());
    crate::common::run_service_command(
        app,
        &[
            "dead-letters",
            "set-aside",
            "--topic",
            topic,
            "--partition",
            &partition,
            "--offset",
            &offset,
            "--reason",
            "ticket-poison is a test ticket",
            "--wait",
            "60",
        ],
    )
}

#[actix_rt::test]
async fn a_stuck_event_set_aside_by_the_operator_becomes_a_dead_letter_and_its_partition_moves_on()
{
    let mut first = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.env("HISTORY__PIPELINE__RETRY_MAX_MS", "500");
    })
    .await;
    reject_ticket_poison(&first, true).await;
    let mut records = Vec::new();
    for n in 0..PER_PARTITION {
        for partition in 0..PARTITIONS {
            records.push(planned(
                &format!("good-{partition}-{n}"),
                &format!("ticket-{n}"),
                partition,
            ));
            if partition == STUCK_PARTITION && n == PER_PARTITION / 2 {
                records.push(planned("the-poison", "ticket-poison", partition));
            }
        }
    }
    let delivered = first.produce(&records).await;
    let (poison, poison_bytes) = delivered
        .iter()
        .zip(&records)
        .find(
            |(_, r)| matches!(&r.kind, RecordKind::Event { event_id } if event_id == "the-poison"),
        )
        .map(|(d, r)| (*d, r.payload.clone().unwrap()))
        .unwrap();
    let topic = first.settings().kafka.topics[0].clone();
    first.start();
    let mut second = TestApp::spawn(|o| {
        o.share(&first);
    })
    .await;

    // A replica reports the stuck event where the command finds it.
    let client = first.db.client().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let reporter: String = loop {
        let row = client
            .query_opt(
                "SELECT replica FROM stuck_events WHERE partition = $1 AND \"offset\" = $2",
                &[&STUCK_PARTITION, &poison.offset],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            break row.get(0);
        }
        assert!(
            Instant::now() < deadline,
            "no replica reported the stuck event:\n{}\n{}",
            first.logs(),
            second.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let pids = [first.process().id(), second.process().id()];
    assert!(
        pids.iter()
            .any(|pid| reporter.ends_with(&format!(":{pid}"))),
        "{reporter} is neither replica ({pids:?})"
    );

    // An offset that is not stuck is refused, saying what it is.
    let (code, text) = set_aside(&first, &topic, 0, 0);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("is not stuck"), "{text}");

    let (code, text) = set_aside(&first, &topic, STUCK_PARTITION, poison.offset);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("set aside:") && text.contains(&format!("stored by replica {reporter}")),
        "{text}"
    );

    // Its partition reaches its end; every other event is recorded, the poison is a letter.
    first.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(
        first.db.count("history_events").await,
        (PER_PARTITION * PARTITIONS as usize) as i64
    );
    let letters = client
        .query(
            "SELECT partition, \"offset\", payload, reason_code, reason FROM dead_letters",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(
        (
            letter.get::<_, i32>(0),
            letter.get::<_, i64>(1),
            letter.get::<_, Vec<u8>>(2),
            letter.get::<_, String>(3)
        ),
        (
            STUCK_PARTITION,
            poison.offset,
            poison_bytes,
            "set_aside".to_owned()
        )
    );
    let reason: String = letter.get(4);
    assert!(
        reason.contains("set aside by")
            && reason.contains("ticket-poison is a test ticket")
            && reason.contains("23514"),
        "{reason}"
    );

    // Asking again changes nothing and says so.
    let (code, text) = set_aside(&first, &topic, STUCK_PARTITION, poison.offset);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("was set aside already"), "{text}");

    assert_eq!(second.stop(), Some(0), "{}", second.logs());
    assert_eq!(first.stop(), Some(0), "{}", first.logs());
    let logs = format!("{}\n{}", first.logs(), second.logs());
    assert!(logs.contains("stuck event set aside on request"), "{logs}");
}
