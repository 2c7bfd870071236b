//! The service's own guards on what it commits, against a broker that would take anything: a
//! member of a settled group, whose commits the mock broker accepts whatever partition or
//! offset they name. So whatever is refused here is refused by the service itself — the epoch
//! check, the ledger of confirmed positions per assignment — not by the broker's generation
//! check, which the pipeline tests cannot tell apart from it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use actix::prelude::*;
use history_devkit::broker::EmbeddedBroker;
use history_devkit::group::GroupInspector;
use history_devkit::test_app::TestApp;
use history_service::domain::{CommitPosition, CommitReason, Epoch, TopicPartition};
use history_service::kafka::context::{CommitterLink, RebalanceEvent, SupervisorContext};
use history_service::kafka::messages::{Lost, Revoke};
use history_service::metrics::Stats;
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};

/// Stands in for the OffsetCommitter: a revoke finds nothing in flight and nothing to commit.
struct NothingInFlight;

impl Actor for NothingInFlight {
    type Context = Context<Self>;
}

impl Handler<Revoke> for NothingInFlight {
    type Result = Vec<CommitPosition>;

    fn handle(&mut self, msg: Revoke, _: &mut Context<Self>) -> Vec<CommitPosition> {
        for answer in [msg.early, msg.reply].into_iter().flatten() {
            let _ = answer.try_send(Vec::new());
        }
        Vec::new()
    }
}

impl Handler<Lost> for NothingInFlight {
    type Result = ();

    fn handle(&mut self, _: Lost, _: &mut Context<Self>) {}
}

type GuardedConsumer = StreamConsumer<SupervisorContext>;

/// A test's consumer, closed off the test's thread. Closing serves the final revoke, which
/// waits for the committer actor this thread runs, and librdkafka's close has no deadline of
/// its own (rdkafka's drop polls until the client says it is closed): closed here in a drop,
/// a close the broker holds up would hang the test instead of failing it.
struct TestConsumer(Option<Arc<GuardedConsumer>>);

impl TestConsumer {
    /// Closes the consumer, and fails the test unless it is closed within `within`.
    async fn close(mut self, within: Duration) {
        let consumer = self.0.take().expect("a consumer is closed once");
        let (closed, answer) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            drop(consumer);
            let _ = closed.send(());
        });
        assert!(
            tokio::time::timeout(within, answer).await.is_ok(),
            "the consumer did not close within {within:?}"
        );
    }
}

impl std::ops::Deref for TestConsumer {
    type Target = Arc<GuardedConsumer>;

    fn deref(&self) -> &Arc<GuardedConsumer> {
        self.0.as_ref().expect("not closed yet")
    }
}

impl Drop for TestConsumer {
    /// A test that failed before its close: the consumer closes on a thread left to it, so
    /// that the failure is reported whatever the close does.
    fn drop(&mut self) {
        if let Some(consumer) = self.0.take() {
            std::thread::spawn(move || drop(consumer));
        }
    }
}

/// A consumer with the service's callbacks, subscribed to a one-partition topic of its own,
/// whose revokes and losses go to `committer`, a revoke bounded by `revoke_timeout`.
fn consumer_of<A>(
    broker: &EmbeddedBroker,
    topic: &str,
    group: &str,
    committer: Addr<A>,
    revoke_timeout: Duration,
) -> TestConsumer
where
    A: Actor<Context = Context<A>> + Handler<Revoke> + Handler<Lost>,
{
    broker.create_topic(topic, 1).unwrap();
    let context = SupervisorContext::new(
        CommitterLink {
            revoke: committer.clone().recipient(),
            lost: committer.recipient(),
        },
        revoke_timeout,
        Arc::new(Stats::default()),
        Arc::new(AtomicBool::new(false)),
    );
    let consumer: GuardedConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // Long: a coordinator marked unavailable gets no heartbeat until librdkafka finds it
        // again, which on a loaded machine took past 6 s (the member was expelled and the
        // held-commit test then saw UNKNOWN_MEMBER_ID instead of the order it checks).
        .set("session.timeout.ms", "30000")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .create_with_context(context)
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    TestConsumer(Some(Arc::new(consumer)))
}

/// [`consumer_of`] with a committer that finds nothing in flight.
fn consumer(broker: &EmbeddedBroker, topic: &str, group: &str) -> TestConsumer {
    consumer_of(
        broker,
        topic,
        group,
        NothingInFlight.start(),
        Duration::from_secs(5),
    )
}

/// Polls the consumer (which serves its rebalance callbacks) until one assigns the partition;
/// returns its epoch.
async fn assigned(consumer: &GuardedConsumer, tp: &TopicPartition) -> Epoch {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
        for event in consumer.context().take_events() {
            if let RebalanceEvent::Assigned(partitions) = event {
                if let Some((_, epoch)) = partitions.iter().find(|(p, _)| p == tp) {
                    return *epoch;
                }
            }
        }
        assert!(Instant::now() < deadline, "{tp} was never assigned");
    }
}

fn at(tp: &TopicPartition, epoch: Epoch, offset: i64) -> CommitPosition {
    CommitPosition {
        done: Default::default(),
        tp: tp.clone(),
        epoch,
        generation: 0,
        offset,
    }
}

/// Commits on a blocking thread (the commit waits for the broker's verdict), as the commit
/// worker and the revoke do.
async fn commit(
    consumer: &Arc<GuardedConsumer>,
    position: CommitPosition,
) -> history_service::domain::CommitOutcome {
    let consumer = consumer.clone();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(5);
        let (outcome, _) = consumer.context().commit(
            &*consumer,
            std::slice::from_ref(&position),
            CommitReason::Periodic,
            deadline,
        );
        outcome
    })
    .await
    .unwrap()
}

async fn committed(broker: &EmbeddedBroker, group: &str, topic: &str) -> Option<i64> {
    let inspector = GroupInspector::new(&broker.bootstrap_servers(), group).unwrap();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        inspector
            .committed(&topic, 1, Duration::from_secs(5))
            .unwrap()[0]
    })
    .await
    .unwrap()
}

/// A position that does not belong to the partition's current assignment — a periodic commit of
/// an earlier epoch, arriving after the partition was revoked, or lost, and assigned again — is
/// never sent, though the broker would accept it from this member. (Remove the epoch check from
/// the ledger's plan and this fails: the group's position moves to 900.)
#[actix_rt::test]
async fn a_position_of_an_assignment_that_is_over_is_never_sent_though_the_broker_would_take_it() {
    let broker = EmbeddedBroker::start(1).unwrap();
    let (topic, group) = ("tickets.guard.epoch", "guard-epoch");
    let consumer = consumer(&broker, topic, group);
    let tp = TopicPartition::new(topic, 0);
    let epoch = assigned(&consumer, &tp).await;

    let outcome = commit(&consumer, at(&tp, epoch, 5)).await;
    assert!(outcome.is_complete(), "{outcome:?}");
    assert_eq!(committed(&broker, group, topic).await, Some(5));

    for other in [epoch - 1, epoch + 1] {
        let outcome = commit(&consumer, at(&tp, other, 900)).await;
        assert_eq!(outcome.failed, vec![at(&tp, other, 900)], "epoch {other}");
        assert_eq!(
            committed(&broker, group, topic).await,
            Some(5),
            "a position of epoch {other} was sent while epoch {epoch} is current"
        );
    }
    // The broker does take it from this member: sent with the current epoch, it lands.
    assert!(commit(&consumer, at(&tp, epoch, 900)).await.is_complete());
    assert_eq!(committed(&broker, group, topic).await, Some(900));
}

/// What one assignment confirmed says nothing of the next: assigned again, the partition may
/// rightly commit a lower position (the topic was created anew, the group's position reset),
/// and that commit is sent. (Key the ledger by partition alone, kept across assignments as it
/// once was, and this fails: the lower position is taken as covered, the group stays at 700.)
#[actix_rt::test]
async fn a_lower_position_of_a_later_assignment_is_committed() {
    let broker = EmbeddedBroker::start(1).unwrap();
    let (topic, group) = ("tickets.guard.ledger", "guard-ledger");
    let consumer = consumer(&broker, topic, group);
    let tp = TopicPartition::new(topic, 0);
    let first = assigned(&consumer, &tp).await;
    assert!(commit(&consumer, at(&tp, first, 700)).await.is_complete());
    assert_eq!(committed(&broker, group, topic).await, Some(700));

    // Leave the group and join it again: a revoke, then a new assignment with a new epoch.
    consumer.unsubscribe();
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumer.context().epoch_of(&tp).is_some() {
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
        assert!(Instant::now() < deadline, "the partition was never revoked");
    }
    consumer.context().take_events();
    consumer.subscribe(&[topic]).unwrap();
    let second = assigned(&consumer, &tp).await;
    assert!(second > first);

    let outcome = commit(&consumer, at(&tp, second, 40)).await;
    assert_eq!(outcome.confirmed, vec![at(&tp, second, 40)]);
    assert_eq!(committed(&broker, group, topic).await, Some(40));
    // Within one assignment the ledger still never sends a position behind a confirmed one.
    let outcome = commit(&consumer, at(&tp, second, 30)).await;
    assert!(outcome.is_complete());
    assert_eq!(committed(&broker, group, topic).await, Some(40));
}

/// Stands in for an OffsetCommitter that is busy: held until told to go, its mailbox filled
/// beyond its bound meanwhile; it counts the revokes it gets.
struct Busy {
    revokes: Arc<std::sync::atomic::AtomicUsize>,
}

impl Actor for Busy {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
struct HoldUntil(std::sync::mpsc::Receiver<()>);

impl Handler<HoldUntil> for Busy {
    type Result = ();

    fn handle(&mut self, msg: HoldUntil, _: &mut Context<Self>) {
        let _ = msg.0.recv();
    }
}

impl Handler<Revoke> for Busy {
    type Result = Vec<CommitPosition>;

    fn handle(&mut self, _: Revoke, _: &mut Context<Self>) -> Vec<CommitPosition> {
        self.revokes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Vec::new()
    }
}

impl Handler<Lost> for Busy {
    type Result = ();

    fn handle(&mut self, _: Lost, _: &mut Context<Self>) {}
}

/// A revoke is never lost to a full mailbox: the committer is held for two whole revokes with
/// its mailbox past its bound, so both are sent while it is full, and both arrive once the
/// committer goes on. (Send them with `try_send` and this fails: the second is dropped.)
#[actix_rt::test]
async fn a_revoke_is_not_lost_to_a_full_committer_mailbox() {
    let broker = EmbeddedBroker::start(1).unwrap();
    let (topic, group) = ("tickets.guard.mailbox", "guard-mailbox");
    let revokes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let arbiter = Arbiter::new();
    let busy = {
        let revokes = revokes.clone();
        Busy::start_in_arbiter(&arbiter.handle(), move |_| Busy { revokes })
    };
    let consumer = consumer_of(&broker, topic, group, busy.clone(), Duration::from_secs(1));
    let tp = TopicPartition::new(topic, 0);
    assigned(&consumer, &tp).await;

    let (go, held) = std::sync::mpsc::channel();
    busy.do_send(HoldUntil(held));
    for _ in 0..100 {
        busy.do_send(Lost {
            partitions: Vec::new(),
        });
    }
    // Two revokes, each inside these polls, each ending at its deadline: nobody answers them.
    // (A bounded send parks its sender on a full mailbox: the first would get through, the
    // second would be refused.)
    let deadline = Instant::now() + Duration::from_secs(60);
    for round in 0..2 {
        if round > 0 {
            consumer.subscribe(&[topic]).unwrap();
            assigned(&consumer, &tp).await;
        }
        consumer.unsubscribe();
        while consumer.context().epoch_of(&tp).is_some() {
            let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
            assert!(Instant::now() < deadline, "the partition was never revoked");
        }
        consumer.context().take_events();
    }
    assert_eq!(revokes.load(std::sync::atomic::Ordering::SeqCst), 0);
    go.send(()).unwrap();
    while revokes.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "{} of the 2 revokes sent to the full mailbox arrived",
            revokes.load(std::sync::atomic::Ordering::SeqCst)
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    arbiter.stop();
}

/// Reads the group's committed position of a one-partition topic from the broker, every few
/// milliseconds, on a thread of its own, until dropped: what the broker holds after every
/// commit it applied, seen from outside the service.
struct CommittedWatch {
    seen: Arc<std::sync::Mutex<Vec<i64>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CommittedWatch {
    fn start(broker: &EmbeddedBroker, group: &str, topic: &str) -> CommittedWatch {
        let inspector = GroupInspector::new(&broker.bootstrap_servers(), group).unwrap();
        let topic = topic.to_owned();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Ok(positions) = inspector.committed(&topic, 1, Duration::from_secs(2)) {
                        if let Some(position) = positions[0] {
                            let mut seen = seen.lock().unwrap();
                            if seen.last() != Some(&position) {
                                seen.push(position);
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        CommittedWatch {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// The committed positions seen so far, each change once.
    fn seen(&self) -> Vec<i64> {
        self.seen.lock().unwrap().clone()
    }

    fn stop(mut self) -> Vec<i64> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        self.seen()
    }
}

impl Drop for CommittedWatch {
    /// A test that failed before its stop: the thread is told to end, not waited for.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Commits on a blocking thread with a deadline of `within`; the outcome and the error.
async fn commit_within(
    consumer: &Arc<GuardedConsumer>,
    position: CommitPosition,
    within: Duration,
) -> (
    history_service::domain::CommitOutcome,
    Option<rdkafka::error::KafkaError>,
) {
    let consumer = consumer.clone();
    tokio::task::spawn_blocking(move || {
        consumer.context().commit(
            &*consumer,
            std::slice::from_ref(&position),
            CommitReason::Periodic,
            Instant::now() + within,
        )
    })
    .await
    .unwrap()
}

/// librdkafka holds a commit the coordinator answered NOT_COORDINATOR or
/// COORDINATOR_NOT_AVAILABLE, and sends it again once the coordinator is found; one answered
/// REQUEST_TIMED_OUT or COORDINATOR_LOAD_IN_PROGRESS it retries after a backoff. Either way it
/// goes out again behind any commit queued meanwhile. Here the coordinator answers the commit
/// of 20 only after 2.5 s (past the commit's 1 s deadline), with `error`; the service commits
/// 30 meanwhile. Sent, 30 would be applied at once and 20 after it, when librdkafka sends it
/// again: the group's position would go 10, 30, 20. The service sends nothing while the
/// commit of 20 has no verdict, so the broker applies 20, then 30. (Queue the later commit
/// without waiting for the earlier verdict — drop the outstanding commit in
/// `SupervisorContext::commit` — and this fails: the broker's position is seen moving back
/// to 20, and the proxy reads the commit of 20 sent after the one of 30.)
async fn a_commit_librdkafka_holds_is_never_overtaken_by_a_later_one(
    error: rdkafka::types::RDKafkaRespErr,
    name: &str,
) {
    const OFFSET_COMMIT: i16 = 8;

    // Behind a proxy, which reads every OffsetCommit the broker is sent.
    let broker = EmbeddedBroker::start_proxied(1).unwrap();
    let (topic, group) = (
        format!("tickets.guard.held.{name}"),
        format!("guard-held-{name}"),
    );
    let (topic, group) = (topic.as_str(), group.as_str());
    let consumer = consumer(&broker, topic, group);
    let tp = TopicPartition::new(topic, 0);
    let epoch = assigned(&consumer, &tp).await;
    assert!(commit(&consumer, at(&tp, epoch, 10)).await.is_complete());
    let watch = CommittedWatch::start(&broker, group, topic);

    broker
        .push_late_request_errors(1, OFFSET_COMMIT, &[(error, Duration::from_millis(2500))])
        .unwrap();
    let (outcome, error) =
        commit_within(&consumer, at(&tp, epoch, 20), Duration::from_secs(1)).await;
    assert_eq!(outcome.failed, vec![at(&tp, epoch, 20)], "{error:?}");

    // The next commits, until one is confirmed: the first ones wait for the verdict of 20.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (outcome, error) =
            commit_within(&consumer, at(&tp, epoch, 30), Duration::from_secs(1)).await;
        if outcome.is_complete() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "30 never committed: {error:?}; the broker's positions: {:?}",
            watch.seen()
        );
    }
    let until = Instant::now() + Duration::from_secs(10);
    while watch.seen().last() != Some(&30) {
        assert!(Instant::now() < until, "{:?}", watch.seen());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What librdkafka still held would land by now (it resends a held commit within a second
    // of finding the coordinator): watch a little longer for a late one moving back.
    let quiet = Instant::now() + Duration::from_secs(3);
    while Instant::now() < quiet {
        assert_eq!(watch.seen().last(), Some(&30), "{:?}", watch.seen());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = watch.stop();
    assert!(
        seen.windows(2).all(|pair| pair[0] <= pair[1]),
        "the group's position moved back: {seen:?}"
    );
    assert_eq!(seen.first(), Some(&10), "{seen:?}");

    // What the broker was sent, request by request (librdkafka's resends included), whether
    // or not it applied them: never a position below one sent before.
    assert_eq!(broker.unreadable_requests(), Vec::<String>::new());
    let sent: Vec<i64> = broker
        .sent_commits()
        .into_iter()
        .filter(|sent| sent.commit.group_id == group)
        .flat_map(|sent| sent.commit.partitions)
        .map(|position| position.offset)
        .collect();
    assert!(
        sent.windows(2).all(|pair| pair[0] <= pair[1]),
        "a commit went out below an earlier one: {sent:?}"
    );
    for offset in [10, 20, 30] {
        assert!(sent.contains(&offset), "{offset} was never sent: {sent:?}");
    }
    consumer.close(Duration::from_secs(20)).await;
}

#[actix_rt::test]
async fn a_commit_held_after_not_coordinator_is_never_overtaken() {
    a_commit_librdkafka_holds_is_never_overtaken_by_a_later_one(
        rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
        "not-coordinator",
    )
    .await;
}

/// (librdkafka keeps this case in order by itself — the coordinator is marked dead, so the
/// later commit is held behind the earlier one — and without the service's guard it passes
/// too; it stands for the order that must stay.)
#[actix_rt::test]
async fn a_commit_held_after_coordinator_not_available_is_never_overtaken() {
    a_commit_librdkafka_holds_is_never_overtaken_by_a_later_one(
        rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
        "not-available",
    )
    .await;
}

#[actix_rt::test]
async fn a_commit_retried_after_request_timed_out_is_never_overtaken() {
    a_commit_librdkafka_holds_is_never_overtaken_by_a_later_one(
        rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        "timed-out",
    )
    .await;
}

#[actix_rt::test]
async fn a_commit_retried_after_coordinator_load_in_progress_is_never_overtaken() {
    a_commit_librdkafka_holds_is_never_overtaken_by_a_later_one(
        rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
        "loading",
    )
    .await;
}

/// Sends `commit` to the broker listening at `address` and answers each partition's error code.
fn send_commit(
    address: &str,
    commit: &history_devkit::kafka_wire::OffsetCommit,
) -> Vec<(String, i32, i16)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(&commit.encode(1)).unwrap();
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).unwrap();
    let mut response = vec![0u8; u32::from_be_bytes(size) as usize];
    stream.read_exact(&mut response).unwrap();
    history_devkit::kafka_wire::offset_commit_response(&response, commit.version).unwrap()
}

/// The service's own re-assertion, through the real ledger and broker: another member commits
/// a lower position for a partition the service holds (as a broker that assigned it twice lets
/// that member do: here its commit is the service's last one, read off the wire, with the
/// offset lowered to 0, which the broker applies). The partition is idle and the service's
/// ledger holds its position as confirmed; only the re-assertion, every tenth commit tick,
/// commits it again. Without it the position stays at 0 until new records arrive.
async fn a_position_lowered_by_another_member_is_reasserted(protocol: &str) {
    let mut app = TestApp::spawn(|o| {
        o.protocol(protocol);
        o.broker_proxied = true;
        o.env("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "50");
    })
    .await;
    let records = history_devkit::workload::generate(&history_devkit::workload::WorkloadSpec {
        records: 200,
        duplicates: 0.0,
        poison: 0.0,
        partitions: 2,
        id_prefix: "reassert".into(),
        tickets: 20,
        max_payload_bytes: 65536,
        seed: 3,
    });
    app.produce(&records).await;
    let ends = app.wait_committed(Duration::from_secs(30)).await;
    assert!(ends[0].unwrap_or(0) > 0, "{ends:?}");

    let broker = app.broker();
    let last = broker
        .sent_commits()
        .into_iter()
        .rev()
        .find(|sent| {
            sent.commit.group_id == app.group
                && sent
                    .commit
                    .partitions
                    .iter()
                    .any(|p| p.partition == 0 && Some(p.offset) == ends[0])
        })
        .expect("the service's commit of partition 0 was read off the wire");
    let mut lowered = last.commit.clone();
    lowered.partitions = vec![history_devkit::kafka_wire::CommittedPartition {
        topic: app.topic.clone(),
        partition: 0,
        offset: 0,
        metadata: None,
    }];
    // Straight to the broker the service committed to, not through its proxy.
    let listeners = broker.cluster().bootstrap_servers();
    let listener = listeners
        .split(',')
        .nth(last.broker as usize - 1)
        .unwrap()
        .to_owned();
    let codes = send_commit(&listener, &lowered);
    assert_eq!(
        codes,
        vec![(app.topic.clone(), 0, 0)],
        "the lower commit was refused"
    );

    // Re-asserted within ten ticks of 50 ms; allowed far more.
    let back = app.wait_committed(Duration::from_secs(10)).await;
    assert_eq!(back, ends);
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn a_position_lowered_by_another_member_is_reasserted_under_the_classic_protocol() {
    a_position_lowered_by_another_member_is_reasserted("classic").await;
}

#[actix_rt::test]
async fn a_position_lowered_by_another_member_is_reasserted_under_the_consumer_protocol() {
    a_position_lowered_by_another_member_is_reasserted("consumer").await;
}
