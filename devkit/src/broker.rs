//! The embedded Kafka-protocol broker: librdkafka's mock cluster, a real broker over TCP with
//! consumer groups and offset commits, kept in memory. For local development, the demo, the
//! benchmark and the tests — never for production.

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};

use crate::fault_proxy::FaultProxy;

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
    /// The client that owns the cluster (librdkafka creates it for `test.mock.num.brokers`);
    /// it never produces anything.
    owner: BaseProducer,
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
            owner,
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
            let proxy = FaultProxy::start(listener)?;
            // SAFETY: the cluster belongs to `owner`, which is alive; the host is copied.
            unsafe {
                let cluster =
                    rdkafka_sys::rd_kafka_handle_mock_cluster(broker.owner.client().native_ptr());
                let host = std::ffi::CString::new("127.0.0.1").expect("no NUL");
                rdkafka_sys::rd_kafka_mock_broker_set_host_port(
                    cluster,
                    index as i32 + 1,
                    host.as_ptr(),
                    i32::from(proxy.port()),
                );
            }
            broker.proxies.push(proxy);
        }
        Ok(broker)
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

    /// Creates a topic (the mock cluster has no CreateTopics API).
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), BrokerError> {
        self.cluster().create_topic(topic, partitions, 1)?;
        Ok(())
    }
}
