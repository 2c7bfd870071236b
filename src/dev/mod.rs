//! Development tools: the embedded broker, generated workloads, a PostgreSQL for the demo,
//! the demo itself, and the group inspector tests and tools use to read committed offsets.

pub mod bench;
pub mod broker;
pub mod demo;
pub mod group;
pub mod postgres;
pub mod workload;

use std::time::Duration;

/// Failures of the development tools.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error(transparent)]
    Broker(#[from] broker::BrokerError),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Postgres(#[from] postgres::DevPostgresError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Service(#[from] crate::app::ServiceError),
    #[error("not everything was committed within {0:?}")]
    Timeout(Duration),
    #[error("benchmark: {0}")]
    Bench(String),
}

/// `history-service dev-kafka`: runs an embedded broker with the topic until `shutdown`.
/// Prints `bootstrap.servers=HOST:PORT` as the first line on standard output.
pub async fn dev_kafka(
    topic: &str,
    partitions: i32,
    brokers: i32,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DevError> {
    use std::io::Write;
    let broker = broker::EmbeddedBroker::start(brokers)?;
    broker.create_topic(topic, partitions)?;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "bootstrap.servers={}", broker.bootstrap_servers());
    let _ = stdout.flush();
    drop(stdout);
    eprintln!(
        "embedded Kafka broker ready: topic {topic} with {partitions} partitions; Ctrl-C stops it"
    );
    shutdown.await;
    drop(broker);
    Ok(())
}
