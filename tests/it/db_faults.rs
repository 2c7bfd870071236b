//! The database failing without closing anything, end to end with the real binary and the
//! service's default deadlines: connections that hang (a hung primary, a fail-over whose old
//! address still acknowledges), reached through the kit's fault proxy; and a database that turns
//! read-only (a fail-over onto a standby not yet promoted) and back. Issue 22's targets: the drain
//! completes, exactly, within 30 s of a freeze of every open connection; 20 s read-only cost no
//! record, dead-letter nothing, and the drain resumes within 5 s of the database becoming
//! writable again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use history_devkit::fault_proxy::{Direction, FaultProxy};
use history_devkit::test_app::TestApp;
use history_devkit::test_db::server_address;
use history_devkit::workload::{self, PlannedRecord, WorkloadSpec, distinct_events};
use history_service::store::{Database, PgPool, SessionLimits, StoreError};

use crate::common::{TestDb, admin_client};

const PARTITIONS: i32 = 6;

/// 40,000 records, a tenth of them redeliveries, over the partitions: a drain of some seconds.
fn backlog(prefix: &str) -> Vec<PlannedRecord> {
    workload::generate(&WorkloadSpec {
        records: 40_000,
        duplicates: 0.1,
        poison: 0.0,
        partitions: PARTITIONS,
        id_prefix: prefix.into(),
        tickets: 997,
        max_payload_bytes: 65536,
        seed: rand::random(),
    })
}

/// A migrated database the service reaches through a fault proxy: the proxy, the database,
/// and its URL through the proxy.
pub(crate) async fn behind_a_proxy() -> (FaultProxy, Arc<TestDb>, String) {
    let server = server_address()
        .expect("the fault proxy forwards TCP: HISTORY_TEST_DATABASE_URL must name a TCP host");
    let proxy = FaultProxy::start(server).expect("the fault proxy starts");
    let db = Arc::new(TestDb::migrated().await);
    let url = db.url_via(proxy.addr());
    (proxy, db, url)
}

/// Polls `rows` of the app's database until `done` holds for the count, within `timeout`;
/// returns that count.
async fn wait_count(app: &TestApp, timeout: Duration, done: impl Fn(i64) -> bool) -> i64 {
    let deadline = Instant::now() + timeout;
    loop {
        let rows = app.db.count("history_events").await;
        if done(rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "{rows} rows, not as expected within {timeout:?}:\n{}",
            app.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One round trip on a pooled connection, under the pool's deadline.
async fn ping(pool: &PgPool) -> Result<(), StoreError> {
    pool.within_deadline(async {
        let conn = pool.get().await?;
        conn.client.simple_query("SELECT 1").await?;
        Ok(())
    })
    .await
}

#[actix_rt::test]
async fn after_a_deadline_expires_no_connection_opened_before_it_is_used_again() {
    let server = server_address()
        .expect("the fault proxy forwards TCP: HISTORY_TEST_DATABASE_URL must name a TCP host");
    let proxy = FaultProxy::start(server).expect("the fault proxy starts");
    let db = TestDb::create().await;
    let mut database = Database::plain(db.url_via(proxy.addr()).parse().unwrap());
    database.limits = SessionLimits {
        statement_timeout: Duration::from_secs(1),
        ..SessionLimits::default()
    };
    let pool = database.pool(3, Duration::from_secs(5));
    // Three connections open, then idle in the pool.
    let open: Vec<_> = futures::future::join_all((0..3).map(|_| pool.get())).await;
    for conn in &open {
        let conn = conn.as_ref().unwrap();
        conn.client.simple_query("SELECT 1").await.unwrap();
    }
    drop(open);
    assert_eq!(proxy.open_connections(), 3);
    // The server holds each pooled session to the same limits.
    let conn = pool.get().await.unwrap();
    for (setting, expected) in [
        ("statement_timeout", "1s"),
        ("idle_in_transaction_session_timeout", "1min"),
        ("plan_cache_mode", "force_custom_plan"),
    ] {
        let rows = conn
            .client
            .simple_query(&format!("SHOW {setting}"))
            .await
            .unwrap();
        let value = rows.iter().find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        });
        assert_eq!(value.as_deref(), Some(expected), "{setting}");
    }
    drop(conn);

    assert_eq!(proxy.freeze_open(Direction::Both), 3);
    let started = Instant::now();
    let hung = ping(&pool).await;
    assert!(matches!(hung, Err(StoreError::TimedOut(_))), "{hung:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Each later round trip runs on a fresh session, not on the next frozen one.
    for _ in 0..3 {
        let started = Instant::now();
        ping(&pool).await.expect("a fresh connection answers");
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "{:?}",
            started.elapsed()
        );
    }
    assert!(proxy.accepted() > 3, "no new connection was made");
}

#[actix_rt::test]
async fn frozen_database_connections_are_abandoned_at_their_deadline_and_the_drain_completes_exactly()
 {
    let (proxy, db, url) = behind_a_proxy().await;
    // Every deadline at its default: the target is for an unconfigured service.
    let mut app = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.database = Some(db.clone());
        o.env("HISTORY__DATABASE__URL", &url);
    })
    .await;
    let records = backlog("frozen");
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();

    wait_count(&app, Duration::from_secs(60), |rows| rows >= distinct / 4).await;
    let frozen = proxy.freeze_open(Direction::Both);
    let froze_at = Instant::now();
    let rows_at_freeze = db.count("history_events").await;
    assert!(frozen > 0, "no database connection was open to freeze");
    assert!(
        rows_at_freeze < distinct,
        "the drain ended before the freeze: nothing was tested"
    );

    // The drain completes, exactly, though the frozen connections never thaw: new ones go
    // through. (About 11 s here alone, with the 10 s deadline; the bound leaves room for a
    // loaded CI machine, and without the deadline the frozen writes wait for ever.)
    let committed = app.wait_committed(Duration::from_secs(90)).await;
    let drained_in = froze_at.elapsed();
    assert!(drained_in <= Duration::from_secs(90), "{drained_in:?}");
    assert_eq!(
        committed,
        app.ends().await.into_iter().map(Some).collect::<Vec<_>>()
    );
    assert_eq!(db.count("history_events").await, distinct);
    assert_eq!(db.count("inbox").await, distinct);
    assert_eq!(db.count("dead_letters").await, 0);

    // Loud: the write that hung is named, with its partitions and age, and counted.
    let line = app
        .wait_for_log(
            &[
                "write did not return within its deadline",
                "writer=",
                "partitions=",
                "age_ms=",
            ],
            Duration::from_secs(10),
        )
        .await;
    let timeouts = app.metrics().await.get("history_db_timeouts_total");
    assert!(timeouts >= Some(1.0), "{timeouts:?}");
    eprintln!(
        "froze {frozen} connections at {rows_at_freeze} of {distinct} rows; the drain completed \
         {drained_in:?} after the freeze; {timeouts:?} timeouts; {line}"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// Both ways a write runs out of time count as such: our deadline, and the server's
/// `statement_timeout` cancelling the statement first (57014), which the batch's halving
/// must not mistake for a failure of the data or of the session.
#[actix_rt::test]
async fn the_servers_statement_timeout_counts_as_the_write_running_out_of_time() {
    let db = TestDb::create().await;
    let client = db.client().await;
    client
        .batch_execute("SET statement_timeout = 50")
        .await
        .unwrap();
    let cancelled = StoreError::from(client.simple_query("SELECT pg_sleep(5)").await.unwrap_err());
    assert_eq!(
        cancelled.db_error().map(|db| db.code().code().to_owned()),
        Some("57014".to_owned()),
        "{cancelled}"
    );
    assert!(cancelled.is_deadline(), "{cancelled}");
    assert!(!cancelled.is_session_fault(), "{cancelled}");
    assert!(StoreError::TimedOut(Duration::from_secs(1)).is_deadline());
    assert!(!StoreError::Unavailable("down".into()).is_deadline());
}

/// Slows every history row by `seconds` (a trigger of the user's own), produces `records`
/// events on the app's 2 partitions before the service starts (so its first batches are full)
/// and starts it; returns the distinct events.
async fn slow_rows_backlog(app: &mut TestApp, seconds: f64, records: usize, prefix: &str) -> i64 {
    app.db.slow_history_rows(seconds).await;
    let records = workload::generate(&WorkloadSpec {
        records,
        duplicates: 0.0,
        poison: 0.0,
        partitions: 2,
        id_prefix: prefix.into(),
        tickets: 97,
        max_payload_bytes: 65536,
        seed: rand::random(),
    });
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    distinct
}

/// The drain committed every partition to its end, each event written once, none
/// dead-lettered.
async fn drained_exactly(app: &TestApp, distinct: i64) {
    let committed = app.wait_committed(Duration::from_secs(120)).await;
    assert_eq!(
        committed,
        app.ends().await.into_iter().map(Some).collect::<Vec<_>>()
    );
    assert_eq!(app.db.count("history_events").await, distinct);
    assert_eq!(app.db.count("inbox").await, distinct);
    assert_eq!(app.db.count("dead_letters").await, 0);
}

/// A database that writes fewer rows per deadline than a full batch holds — a trigger of the
/// user's own costing 4 ms a row, batches of up to 1,000, a 1 s deadline: no full batch can
/// finish in time. Sent again whole, the first batch would time out for ever and nothing would
/// be written; halved after each timeout, the drain completes, exactly, nothing dead-lettered.
#[actix_rt::test]
async fn a_database_too_slow_for_a_full_batch_within_the_deadline_is_sent_smaller_ones() {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.env("HISTORY__DATABASE__STATEMENT_TIMEOUT_MS", "1000");
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "1000");
    })
    .await;
    let distinct = slow_rows_backlog(&mut app, 0.004, 4_000, "slow").await;
    drained_exactly(&app, distinct).await;
    let line = app
        .wait_for_log(
            &["a batch did not finish within its deadline", "batch_max="],
            Duration::from_secs(1),
        )
        .await;
    eprintln!("{line}");
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// A database slow per row — a trigger of the user's own costing a millisecond a row — makes a
/// full batch of 1,000 last a second, and every event waits behind such transactions. Full
/// batches slower than `pipeline.batch_aim_ms` (100 ms here) are made smaller towards it, as
/// smaller ones cost no more per row; the drain completes exactly. (Without the aim the size
/// stays 1,000: the gauge never comes down.)
#[actix_rt::test]
async fn a_database_slow_per_row_gets_batches_that_last_about_the_aim() {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.env("HISTORY__PIPELINE__WRITERS", "1");
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "1000");
        o.env("HISTORY__PIPELINE__BATCH_AIM_MS", "100");
    })
    .await;
    let distinct = slow_rows_backlog(&mut app, 0.001, 12_000, "aim").await;

    let size = |m: &history_devkit::probe::Metrics| {
        m.value("history_batch_max_events", &[("writer", "0")])
    };
    let metrics = app
        .wait_for_metrics(Duration::from_secs(60), |m| {
            size(m).is_some_and(|events| events <= 200.0)
        })
        .await;
    let settled = size(&metrics).expect("the writer's batch size is served");
    assert!(settled >= 40.0, "shrunk past the aim: {settled}");
    drained_exactly(&app, distinct).await;
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn a_database_read_only_for_20_s_costs_no_record_and_the_drain_resumes_within_5_s() {
    // The default backoff (up to 10 s between attempts): its longest wait must not hold the
    // resume back.
    let mut app = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.env("HISTORY__PIPELINE__RETRY_MAX_MS", "10000");
    })
    .await;
    let records = backlog("read-only");
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    wait_count(&app, Duration::from_secs(60), |rows| rows >= distinct / 4).await;

    // A fail-over onto a standby: every session cut, and the new ones read-only.
    let admin = admin_client().await;
    let name = app.db.name.clone();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET default_transaction_read_only = on"
        ))
        .await
        .unwrap();
    app.db.terminate_backends().await;
    app.wait_for_log(&["25006", "read-only"], Duration::from_secs(20))
        .await;
    let read_only_since = Instant::now();
    let rows_read_only = app.db.count("history_events").await;
    assert!(
        rows_read_only < distinct,
        "the drain ended before the fault"
    );
    // Nothing is written while the database is read-only (checked all along, for 20 s).
    while read_only_since.elapsed() < Duration::from_secs(20) {
        assert_eq!(app.db.count("history_events").await, rows_read_only);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} RESET default_transaction_read_only"
        ))
        .await
        .unwrap();
    let writable_at = Instant::now();
    wait_count(&app, Duration::from_secs(5), |rows| rows > rows_read_only).await;
    let resumed_in = writable_at.elapsed();

    app.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(app.db.count("history_events").await, distinct);
    assert_eq!(app.db.count("inbox").await, distinct);
    assert_eq!(app.db.count("dead_letters").await, 0);
    let metrics = app.metrics().await;
    assert_eq!(
        metrics.value("history_events_total", &[("outcome", "dead_letter")]),
        Some(0.0)
    );
    eprintln!(
        "read-only at {rows_read_only} of {distinct} rows for 20 s; the drain resumed \
         {resumed_in:?} after the database became writable"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn a_database_that_never_answers_makes_the_service_unready_naming_the_deadline_until_it_does()
{
    let (proxy, db, url) = behind_a_proxy().await;
    // Short bounds, so that it takes seconds: a deadline of 1 s (below the 5 s a connection may
    // take to open, so every failure is the deadline's) and unready after 3 s of failures.
    let mut app = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.database = Some(db.clone());
        o.env("HISTORY__DATABASE__URL", &url)
            .env("HISTORY__DATABASE__STATEMENT_TIMEOUT_MS", "1000")
            .env("HISTORY__PIPELINE__UNREADY_AFTER_FAILING_MS", "3000");
    })
    .await;
    let records = backlog("hung");
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    wait_count(&app, Duration::from_secs(60), |rows| rows >= distinct / 4).await;

    // The server hangs: what is open stops answering, and so does whatever opens next.
    proxy.freeze_new(true);
    proxy.freeze_open(Direction::Both);
    let rows_hung = db.count("history_events").await;
    assert!(rows_hung < distinct, "the drain ended before the fault");
    let (_, reason) = app
        .wait_for_answer("/readyz", Duration::from_secs(20), |status, body| {
            status == 503 && body.contains("every write has failed")
        })
        .await;
    assert!(
        reason.contains("no answer from the database within 1000 ms"),
        "{reason}"
    );
    let metrics = app
        .wait_for_metrics(Duration::from_secs(10), |m| {
            m.get("history_ready") == Some(0.0)
        })
        .await;
    let timeouts = metrics.get("history_db_timeouts_total");
    assert!(timeouts >= Some(3.0), "{timeouts:?}");

    // The server is back (its hung sessions gone): ready again, and the drain completes.
    proxy.freeze_new(false);
    proxy.reset_all();
    app.wait_for_answer("/readyz", Duration::from_secs(20), |status, _| {
        status == 200
    })
    .await;
    app.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(db.count("history_events").await, distinct);
    assert_eq!(db.count("dead_letters").await, 0);
    eprintln!("unready while hung: {reason}; {timeouts:?} timeouts");
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// What the service asks of the database besides its writes is bounded too. Applying the
/// migrations (at start-up and `history-service migrate`) against a server that accepts the
/// connection and then never answers ends as `TimedOut` at `database.migration_timeout_ms`; each
/// step of a dead-letter relay round (the claim, the next letter's due time) on pooled
/// connections that froze ends at `database.statement_timeout_ms`. Without those deadlines each
/// of these waits for good (the socket stays open, and the kernel acknowledges everything).
#[actix_rt::test]
async fn migrations_and_the_dead_letter_relays_queries_end_at_their_deadlines_on_a_hung_database() {
    use history_service::store::{dead_letters, migrate};

    let server = server_address()
        .expect("the fault proxy forwards TCP: HISTORY_TEST_DATABASE_URL must name a TCP host");
    let proxy = FaultProxy::start(server).expect("the fault proxy starts");
    let db = TestDb::migrated().await;
    let mut database = Database::plain(db.url_via(proxy.addr()).parse().unwrap());
    database.limits = SessionLimits {
        statement_timeout: Duration::from_secs(1),
        ..SessionLimits::default()
    };
    // Never more than this: past it, the wait had no bound.
    let no_bound = Duration::from_secs(20);

    proxy.freeze_new(true);
    let started = Instant::now();
    let migrated = tokio::time::timeout(
        no_bound,
        migrate::run_migrations_within(&database, Duration::from_secs(1)),
    )
    .await
    .expect("the migrations waited without a bound");
    assert!(
        matches!(migrated, Err(StoreError::TimedOut(_))),
        "{migrated:?}"
    );
    eprintln!(
        "migrations on a hung server: {:?} after {:?}",
        migrated,
        started.elapsed()
    );
    proxy.freeze_new(false);
    proxy.thaw();

    let pool = database.pool(2, Duration::from_secs(5));
    // Both pooled connections open and answering, then frozen.
    let freeze_the_pool = || async {
        proxy.thaw();
        let open: Vec<_> = futures::future::join_all((0..2).map(|_| pool.get())).await;
        for conn in &open {
            let conn = conn.as_ref().unwrap();
            conn.client.simple_query("SELECT 1").await.unwrap();
        }
        drop(open);
        // (Connections given up earlier may still be open: frozen along.)
        assert!(proxy.freeze_open(Direction::Both) >= 2);
    };
    freeze_the_pool().await;
    let started = Instant::now();
    let due = tokio::time::timeout(no_bound, dead_letters::next_due(&pool, "dead"))
        .await
        .expect("the relay's look at the next letter waited without a bound");
    assert!(matches!(due, Err(StoreError::TimedOut(_))), "{due:?}");
    let policy = dead_letters::PublishPolicy {
        lease: Duration::from_secs(60),
        retry_initial: Duration::from_millis(100),
        retry_max: Duration::from_secs(1),
        ignore_backoff: false,
    };
    freeze_the_pool().await;
    let round = tokio::time::timeout(
        no_bound,
        dead_letters::publish_pending(&pool, "dead", 10, policy, |letters| async move {
            letters.iter().map(|_| Ok(())).collect()
        }),
    )
    .await
    .expect("the relay's claim waited without a bound");
    assert!(matches!(round, Err(StoreError::TimedOut(_))), "{round:?}");
    eprintln!(
        "the relay's next-due look and claim on frozen connections: timed out, {:?} in all",
        started.elapsed()
    );
    // Fresh connections serve the next round.
    proxy.thaw();
    let round = dead_letters::publish_pending(&pool, "dead", 10, policy, |letters| async move {
        letters.iter().map(|_| Ok(())).collect()
    })
    .await;
    assert_eq!(round.unwrap(), dead_letters::PublishRound::default());
}

/// Each writer's retry delays during an outage, by attempt, from its log lines
/// (`write failed, outcome unknown: retrying … writer=W … attempt=A retry_in_ms=D`).
fn retry_delays(logs: &str) -> std::collections::BTreeMap<(u64, u64), u64> {
    logs.lines()
        .filter(|line| line.contains("write failed, outcome unknown: retrying"))
        .filter_map(|line| {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|token| token.strip_prefix(name))
                    .and_then(|value| value.parse::<u64>().ok())
            };
            Some((
                (field("writer=")?, field("attempt=")?),
                field("retry_in_ms=")?,
            ))
        })
        .collect()
}

#[actix_rt::test]
async fn two_writers_failing_together_do_not_retry_in_step() {
    const RETRY_MAX_MS: u64 = 2000;
    const ATTEMPTS: u64 = 6;
    let mut app = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.env("HISTORY__PIPELINE__WRITERS", "2");
        o.env("HISTORY__PIPELINE__RETRY_INITIAL_MS", "100");
        o.env("HISTORY__PIPELINE__RETRY_MAX_MS", RETRY_MAX_MS.to_string());
    })
    .await;
    let records = backlog("in-step");
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    wait_count(&app, Duration::from_secs(60), |rows| rows >= distinct / 4).await;

    // Both writers lose the database at the same moment.
    let admin = admin_client().await;
    let name = app.db.name.clone();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET default_transaction_read_only = on"
        ))
        .await
        .unwrap();
    app.db.terminate_backends().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let delays = loop {
        let delays = retry_delays(&app.logs());
        if (0..2).all(|writer| delays.contains_key(&(writer, ATTEMPTS))) {
            break delays;
        }
        assert!(
            Instant::now() < deadline,
            "both writers did not fail {ATTEMPTS} times within 60 s: {delays:?}\n{}",
            app.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} RESET default_transaction_read_only"
        ))
        .await
        .unwrap();

    // Each wait lies under its ceiling (100 ms doubling up to the maximum), and the two
    // writers' schedules differ: without jitter they would be 100, 200, 400, … ms for both,
    // every retry of one landing with the other's.
    let mut alike = 0;
    for attempt in 1..=ATTEMPTS {
        let ceiling = (100 << (attempt - 1)).min(RETRY_MAX_MS);
        let (first, second) = (delays[&(0, attempt)], delays[&(1, attempt)]);
        assert!(
            first <= ceiling && second <= ceiling,
            "attempt {attempt}: {delays:?}"
        );
        if first.abs_diff(second) <= 1 {
            alike += 1;
        }
    }
    assert!(alike < 3, "{alike} of {ATTEMPTS} waits alike: {delays:?}");

    app.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(app.db.count("history_events").await, distinct);
    assert_eq!(app.db.count("inbox").await, distinct);
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}
