//! The embedded Kafka-protocol broker: librdkafka's mock cluster, a real broker over TCP with
//! consumer groups and offset commits, kept in memory. For local development, the demo, the
//! benchmark and the tests — never for production.

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, DefaultProducerContext, Producer};

#[derive(Debug, thiserror::Error)]
#[error("embedded broker: {0}")]
pub struct BrokerError(#[from] rdkafka::error::KafkaError);

/// How long the group coordinator waits for more members before the first assignment. Kafka's
/// default is 3 s; locally nobody else is coming, so the group forms at once.
pub const INITIAL_REBALANCE_DELAY_MS: i32 = 200;

/// A running mock cluster. It lives on the thread that made it and stops when dropped.
pub struct EmbeddedBroker {
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
        // SAFETY: the handle belongs to `owner`, which is alive; the call only sets a default.
        unsafe {
            let cluster = rdkafka_sys::rd_kafka_handle_mock_cluster(owner.client().native_ptr());
            if !cluster.is_null() {
                rdkafka_sys::rd_kafka_mock_group_initial_rebalance_delay_ms(
                    cluster,
                    INITIAL_REBALANCE_DELAY_MS,
                );
            }
        }
        Ok(EmbeddedBroker { owner })
    }

    /// The cluster, for topic creation and fault injection (request errors, brokers down/up).
    pub fn cluster(&self) -> MockCluster<'_, DefaultProducerContext> {
        self.owner
            .client()
            .mock_cluster()
            .expect("the owner client was created with a mock cluster")
    }

    pub fn bootstrap_servers(&self) -> String {
        self.cluster().bootstrap_servers()
    }

    /// Creates a topic (the mock cluster has no CreateTopics API).
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), BrokerError> {
        self.cluster().create_topic(topic, partitions, 1)?;
        Ok(())
    }
}
