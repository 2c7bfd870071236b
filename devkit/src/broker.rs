//! The embedded Kafka-protocol broker: librdkafka's mock cluster, a real broker over TCP with
//! consumer groups and offset commits, kept in memory. For local development, the demo, the
//! benchmark and the tests — never for production.

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::fault_proxy::FaultProxy;
use crate::kafka_wire::{OffsetCommit, RequestFrames};

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("embedded broker: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("embedded broker: its fault proxy: {0}")]
    Proxy(#[from] std::io::Error),
}

/// How long the group coordinator waits for more members before the first assignment. Kafka's
/// default is 3 s; locally nobody else is coming, so the group forms at once.
pub const INITIAL_REBALANCE_DELAY_MS: i32 = 200;

/// The `consumer` protocol's (KIP-848) session timeout of the cluster's groups: the broker owns
/// it under that protocol. Kafka's default is 45 s; the tests' classic members use 3 s, and a
/// static member's restart (stop, then start again) must fit within it.
pub const CONSUMER_SESSION_TIMEOUT_MS: i32 = 5000;
/// The heartbeat interval the broker gives `consumer`-protocol members; a member learns of a new
/// assignment at its next heartbeat, so this paces its rebalances. Kafka's default is 5 s.
pub const CONSUMER_HEARTBEAT_INTERVAL_MS: i32 = 500;

/// A running mock cluster. It lives on the thread that made it and stops when dropped.
pub struct EmbeddedBroker {
    /// One fault proxy in front of each broker, in broker-id order, when the cluster was
    /// started behind proxies (dropped before the cluster).
    proxies: Vec<FaultProxy>,
    /// Every OffsetCommit the brokers were sent through their proxies.
    sent: Arc<SentCommits>,
    /// The client that owns the cluster (librdkafka creates it for `test.mock.num.brokers`);
    /// it never produces anything.
    owner: BaseProducer,
    /// Brokers in the cluster.
    brokers: i32,
}

impl EmbeddedBroker {
    /// Starts a cluster of `brokers` brokers.
    pub fn start(brokers: i32) -> Result<Self, BrokerError> {
        let owner: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", brokers.to_string())
            .create()?;
        // SAFETY: the handle belongs to `owner`, which is alive; the calls only set defaults.
        unsafe {
            let cluster = rdkafka_sys::rd_kafka_handle_mock_cluster(owner.client().native_ptr());
            if !cluster.is_null() {
                rdkafka_sys::rd_kafka_mock_group_initial_rebalance_delay_ms(
                    cluster,
                    INITIAL_REBALANCE_DELAY_MS,
                );
                rdkafka_sys::rd_kafka_mock_set_group_consumer_session_timeout_ms(
                    cluster,
                    CONSUMER_SESSION_TIMEOUT_MS,
                );
                rdkafka_sys::rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(
                    cluster,
                    CONSUMER_HEARTBEAT_INTERVAL_MS,
                );
            }
        }
        Ok(EmbeddedBroker {
            proxies: Vec::new(),
            sent: Arc::default(),
            owner,
            brokers,
        })
    }

    /// Starts a cluster whose every broker is reached through a [`FaultProxy`] of its own: the
    /// cluster advertises each proxy's address for its broker (`rd_kafka_mock_broker_set_host_port`)
    /// and [`bootstrap_servers`](Self::bootstrap_servers) names the proxies, so every connection
    /// of every client goes through them — frozen, slowed, reset or refused at will
    /// ([`proxy`](Self::proxy)).
    pub fn start_proxied(brokers: i32) -> Result<Self, BrokerError> {
        let mut broker = Self::start(brokers)?;
        let listeners: Vec<std::net::SocketAddr> = broker
            .cluster()
            .bootstrap_servers()
            .split(',')
            .map(|address| address.parse())
            .collect::<Result<_, _>>()
            .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidData, err))?;
        for (index, listener) in listeners.into_iter().enumerate() {
            let broker_id = index as i32 + 1;
            let sent = broker.sent.clone();
            let proxy = FaultProxy::start_tapped(
                listener,
                Arc::new(move |connection, bytes| sent.read(broker_id, connection, bytes)),
            )?;
            // SAFETY: the cluster belongs to `owner`, which is alive; the host is copied.
            unsafe {
                let cluster =
                    rdkafka_sys::rd_kafka_handle_mock_cluster(broker.owner.client().native_ptr());
                let host = std::ffi::CString::new("127.0.0.1").expect("no NUL");
                rdkafka_sys::rd_kafka_mock_broker_set_host_port(
                    cluster,
                    broker_id,
                    host.as_ptr(),
                    i32::from(proxy.port()),
                );
            }
            broker.proxies.push(proxy);
        }
        Ok(broker)
    }

    /// Every OffsetCommit request the brokers were sent, in the order they were sent it (read
    /// off the wire by the proxies: only a cluster started with
    /// [`start_proxied`](Self::start_proxied) sees them). Whatever a client logged about its
    /// commits, and whether or not the broker applied them, these are what reached it.
    pub fn sent_commits(&self) -> Vec<SentCommit> {
        self.sent_commits_since(0)
    }

    /// [`sent_commits`](Self::sent_commits) from the `first`-th on (counted from 0).
    pub fn sent_commits_since(&self, first: usize) -> Vec<SentCommit> {
        let commits = self.sent.commits.lock().unwrap();
        commits.get(first..).unwrap_or_default().to_vec()
    }

    /// Requests the proxies could not read (none, unless the wire reader is wrong).
    pub fn unreadable_requests(&self) -> Vec<String> {
        self.sent.unreadable.lock().unwrap().clone()
    }

    /// The fault proxy in front of broker `id` (from 1), if the cluster runs behind proxies.
    pub fn proxy(&self, id: i32) -> Option<&FaultProxy> {
        usize::try_from(id - 1)
            .ok()
            .and_then(|index| self.proxies.get(index))
    }

    /// Every broker's fault proxy (none unless started with [`start_proxied`](Self::start_proxied)).
    pub fn proxies(&self) -> &[FaultProxy] {
        &self.proxies
    }

    /// The cluster, for topic creation and fault injection (request errors, brokers down/up).
    pub fn cluster(&self) -> MockCluster<'_, DefaultProducerContext> {
        self.owner
            .client()
            .mock_cluster()
            .expect("the owner client was created with a mock cluster")
    }

    /// Where clients start: the brokers, or their proxies when the cluster runs behind them.
    pub fn bootstrap_servers(&self) -> String {
        if self.proxies.is_empty() {
            return self.cluster().bootstrap_servers();
        }
        self.proxies
            .iter()
            .map(|proxy| proxy.addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Fails the cluster's next requests of kind `api` (Kafka's API key: one that rdkafka's
    /// `RDKafkaApiKey` may not name, such as KIP-848's `ConsumerGroupHeartbeat`, 68) with
    /// `errors`, one each.
    pub fn push_request_errors(&self, api: i16, errors: &[rdkafka::types::RDKafkaRespErr]) {
        // SAFETY: the cluster belongs to `owner`, which is alive; librdkafka copies the array.
        unsafe {
            let cluster =
                rdkafka_sys::rd_kafka_handle_mock_cluster(self.owner.client().native_ptr());
            if !cluster.is_null() {
                rdkafka_sys::rd_kafka_mock_push_request_errors_array(
                    cluster,
                    api,
                    errors.len(),
                    errors.as_ptr(),
                );
            }
        }
    }

    /// Forgets the errors still queued for requests of kind `api`.
    pub fn clear_request_errors(&self, api: i16) {
        // SAFETY: as in `push_request_errors`.
        unsafe {
            let cluster =
                rdkafka_sys::rd_kafka_handle_mock_cluster(self.owner.client().native_ptr());
            if !cluster.is_null() {
                rdkafka_sys::rd_kafka_mock_clear_request_errors(cluster, api);
            }
        }
    }

    /// Brokers in the cluster (their ids are 1 to this).
    pub fn brokers(&self) -> i32 {
        self.brokers
    }

    /// Creates a topic (the mock cluster has no CreateTopics API), replicated on up to three
    /// brokers, partition `p` led by broker `p % brokers + 1` (the mock picks leaders at random
    /// among the replicas).
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), BrokerError> {
        self.cluster()
            .create_topic(topic, partitions, self.brokers.clamp(1, 3))?;
        if self.brokers > 1 {
            for partition in 0..partitions {
                self.set_leader(topic, partition, partition % self.brokers + 1)?;
            }
        }
        Ok(())
    }

    /// Makes broker `broker` (from 1) the leader of a partition: clients learn of it from a
    /// NOT_LEADER_OR_FOLLOWER error or their next metadata refresh, as when Kafka moves one.
    pub fn set_leader(&self, topic: &str, partition: i32, broker: i32) -> Result<(), BrokerError> {
        let topic_name = std::ffi::CString::new(topic).expect("a topic name has no NUL");
        // SAFETY: the cluster belongs to `owner`, which is alive; the name is copied.
        let err = unsafe {
            let cluster =
                rdkafka_sys::rd_kafka_handle_mock_cluster(self.owner.client().native_ptr());
            rdkafka_sys::rd_kafka_mock_partition_set_leader(
                cluster,
                topic_name.as_ptr(),
                partition,
                broker,
            )
        };
        match rdkafka::error::RDKafkaErrorCode::from(err) {
            rdkafka::error::RDKafkaErrorCode::NoError => Ok(()),
            code => Err(BrokerError::Kafka(rdkafka::error::KafkaError::MockCluster(
                code,
            ))),
        }
    }

    /// Makes broker `broker` (from 1) answer its next requests of kind `api` with `errors`, one
    /// each, every answer sent only after its delay: a coordinator that answers a commit late
    /// and then says it is not the coordinator. The broker applies the requests it does not
    /// fail at once, and answers a connection's requests in order, so the answers behind a late
    /// one wait for it.
    pub fn push_late_request_errors(
        &self,
        broker: i32,
        api: i16,
        errors: &[(rdkafka::types::RDKafkaRespErr, std::time::Duration)],
    ) -> Result<(), BrokerError> {
        for &(error, delay) in errors {
            let rtt_ms = i32::try_from(delay.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: the cluster belongs to `owner`, which is alive; the variadic arguments
            // are `cnt` pairs of (rd_kafka_resp_err_t, int32_t), as librdkafka reads them.
            let err = unsafe {
                let cluster =
                    rdkafka_sys::rd_kafka_handle_mock_cluster(self.owner.client().native_ptr());
                rdkafka_sys::rd_kafka_mock_broker_push_request_error_rtts(
                    cluster, broker, api, 1, error, rtt_ms,
                )
            };
            match rdkafka::error::RDKafkaErrorCode::from(err) {
                rdkafka::error::RDKafkaErrorCode::NoError => {}
                code => {
                    return Err(BrokerError::Kafka(rdkafka::error::KafkaError::MockCluster(
                        code,
                    )));
                }
            }
        }
        Ok(())
    }

    /// Makes broker `broker` the coordinator of consumer group `group`: its members find it
    /// from the NOT_COORDINATOR answers of the old one, as when Kafka moves a group's
    /// coordinator with the leadership of its `__consumer_offsets` partition.
    pub fn set_coordinator(&self, group: &str, broker: i32) -> Result<(), BrokerError> {
        self.cluster().coordinator(
            rdkafka::mocking::MockCoordinator::Group(group.to_owned()),
            broker,
        )?;
        Ok(())
    }

    /// Takes broker `broker` out of the cluster for good: its connections are closed, and the
    /// partitions it led are given to the brokers left.
    pub fn decommission(&self, broker: i32) -> Result<(), BrokerError> {
        // SAFETY: the cluster belongs to `owner`, which is alive.
        let err = unsafe {
            let cluster =
                rdkafka_sys::rd_kafka_handle_mock_cluster(self.owner.client().native_ptr());
            rdkafka_sys::rd_kafka_mock_broker_decommission(cluster, broker)
        };
        match rdkafka::error::RDKafkaErrorCode::from(err) {
            rdkafka::error::RDKafkaErrorCode::NoError => Ok(()),
            code => Err(BrokerError::Kafka(rdkafka::error::KafkaError::MockCluster(
                code,
            ))),
        }
    }
}

/// One OffsetCommit request a broker was sent.
#[derive(Debug, Clone)]
pub struct SentCommit {
    /// When the proxy forwarded its last byte.
    pub at: std::time::Instant,
    /// The same moment by the wall clock (to set beside a log's or a database's timestamps).
    pub wall: chrono::DateTime<chrono::Utc>,
    /// The broker it went to (from 1).
    pub broker: i32,
    pub commit: OffsetCommit,
}

/// The proxies' reading of the requests: each connection's bytes cut into requests, the
/// OffsetCommits kept.
#[derive(Default)]
struct SentCommits {
    frames: Mutex<HashMap<(i32, u64), RequestFrames>>,
    commits: Mutex<Vec<SentCommit>>,
    unreadable: Mutex<Vec<String>>,
}

impl SentCommits {
    fn read(&self, broker: i32, connection: u64, bytes: &[u8]) {
        let requests = self
            .frames
            .lock()
            .unwrap()
            .entry((broker, connection))
            .or_default()
            .push(bytes);
        for request in requests {
            match OffsetCommit::parse(&request) {
                Ok(Some(commit)) => self.commits.lock().unwrap().push(SentCommit {
                    at: std::time::Instant::now(),
                    wall: chrono::Utc::now(),
                    broker,
                    commit,
                }),
                Ok(None) => {}
                Err(err) => self
                    .unreadable
                    .lock()
                    .unwrap()
                    .push(format!("broker {broker}, connection {connection}: {err}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    use super::*;

    const GROUP: &str = "members-that-come-back";
    const JOIN_GROUP: i16 = 11;
    const HEARTBEAT: i16 = 12;
    const UNKNOWN_MEMBER_ID: i16 = 25;
    /// The mock holds a rebalance a second less than this for members to join: the test's
    /// steps between the second member's two joins fit in it many times over.
    const SESSION_TIMEOUT_MS: i32 = 6_000;
    /// How long any one answer may take: a bound, not a pace.
    const PATIENCE: Duration = Duration::from_secs(20);

    fn string(out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(&(text.len() as i16).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }

    /// A request of header version 1 (non-flexible), size first.
    fn request(api_key: i16, api_version: i16, correlation_id: i32, body: &[u8]) -> Vec<u8> {
        let mut frame = Vec::new();
        frame.extend_from_slice(&api_key.to_be_bytes());
        frame.extend_from_slice(&api_version.to_be_bytes());
        frame.extend_from_slice(&correlation_id.to_be_bytes());
        string(&mut frame, "broker-test");
        frame.extend_from_slice(body);
        let mut sized = (frame.len() as i32).to_be_bytes().to_vec();
        sized.extend(frame);
        sized
    }

    /// JoinGroup v1 for `member`, one protocol with empty metadata.
    fn join_group(member: &str, correlation_id: i32) -> Vec<u8> {
        let mut body = Vec::new();
        string(&mut body, GROUP);
        body.extend_from_slice(&SESSION_TIMEOUT_MS.to_be_bytes());
        body.extend_from_slice(&SESSION_TIMEOUT_MS.to_be_bytes());
        string(&mut body, member);
        string(&mut body, "consumer");
        body.extend_from_slice(&1i32.to_be_bytes());
        string(&mut body, "range");
        body.extend_from_slice(&0i32.to_be_bytes());
        request(JOIN_GROUP, 1, correlation_id, &body)
    }

    /// Heartbeat v0 of `member` in generation 1.
    fn heartbeat(member: &str, correlation_id: i32) -> Vec<u8> {
        let mut body = Vec::new();
        string(&mut body, GROUP);
        body.extend_from_slice(&1i32.to_be_bytes());
        string(&mut body, member);
        request(HEARTBEAT, 0, correlation_id, &body)
    }

    fn connect(broker: &EmbeddedBroker) -> TcpStream {
        let stream = TcpStream::connect(broker.proxy(1).expect("a proxied broker").addr())
            .expect("the proxy accepts");
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream
    }

    /// Sends `frame` and reads the answer's body after its correlation id.
    fn round_trip(stream: &mut TcpStream, frame: &[u8]) -> Vec<u8> {
        stream.write_all(frame).expect("the request is sent");
        read_answer(stream)
    }

    fn read_answer(stream: &mut TcpStream) -> Vec<u8> {
        let mut size = [0u8; 4];
        stream
            .read_exact(&mut size)
            .expect("an answer within the patience");
        let mut answer = vec![0u8; i32::from_be_bytes(size) as usize];
        stream.read_exact(&mut answer).expect("the whole answer");
        answer.split_off(4)
    }

    /// JoinGroup v1's answer: its error code, and the member id it names.
    fn joined(answer: &[u8]) -> (i16, String) {
        let error = i16::from_be_bytes([answer[0], answer[1]]);
        let mut at = 2 + 4; // the error, the generation
        for _ in 0..2 {
            // the protocol's name, the leader's id
            at += 2 + i16::from_be_bytes([answer[at], answer[at + 1]]).max(0) as usize;
        }
        let length = i16::from_be_bytes([answer[at], answer[at + 1]]) as usize;
        let member = String::from_utf8_lossy(&answer[at + 2..at + 2 + length]).into_owned();
        (error, member)
    }

    fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// librdkafka's mock stops reading a member's connection while its JoinGroup waits for the
    /// group, so it would not see a client's FIN there; the member joining again on a new
    /// connection then aborts the broker. Through the proxy the closed connection is reset, the
    /// mock lets the first join go, and the second is the member's.
    #[test]
    fn a_member_that_joins_again_on_a_new_connection_after_closing_its_pending_join_is_let_in() {
        let broker = EmbeddedBroker::start_proxied(1).expect("the cluster starts");
        let mut first = connect(&broker);
        let (error, member) = joined(&round_trip(&mut first, &join_group("first", 1)));
        assert_eq!((error, member.as_str()), (0, "first"));

        // The second member's join waits for the first to join again, which it does not yet.
        let mut pending = connect(&broker);
        pending.write_all(&join_group("second", 1)).unwrap();
        let mut correlation = 1;
        until("the broker holds the second member's join", || {
            correlation += 1;
            let answer = round_trip(&mut first, &heartbeat("second", correlation));
            i16::from_be_bytes([answer[0], answer[1]]) != UNKNOWN_MEMBER_ID
        });

        pending.set_nonblocking(true).unwrap();
        let unanswered = pending.peek(&mut [0u8; 1]);
        assert!(
            matches!(&unanswered, Err(err) if err.kind() == std::io::ErrorKind::WouldBlock),
            "the join was to be pending when its client closes it: {unanswered:?}"
        );
        drop(pending);
        until("the proxy closed the connection its client closed", || {
            broker.proxy(1).unwrap().open_connections() == 1
        });

        // Without the reset the mock aborts here, its first join's answer still held.
        let mut again = connect(&broker);
        let (error, member) = joined(&round_trip(&mut again, &join_group("second", 2)));
        assert_eq!((error, member.as_str()), (0, "second"));
    }
}
