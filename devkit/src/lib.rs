//! Development tools: the embedded broker, generated workloads, a PostgreSQL for the demo,
//! the demo itself, and the group inspector tests and tools use to read committed offsets.

pub mod bench;
pub mod broker;
pub mod cpu;
pub mod demo;
pub mod faults;
pub mod group;
pub mod postgres;
pub mod probe;
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
/// Prints `bootstrap.servers=HOST:PORT` as the first line on standard output, then reads fault
/// commands (see [`faults`]) from standard input, answering each with a line `ok ...` or
/// `error ...`.
pub async fn dev_kafka(
    topic: &str,
    partitions: i32,
    brokers: i32,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DevError> {
    use std::io::{BufRead, Write};
    let broker = std::sync::Arc::new(broker::EmbeddedBroker::start(brokers)?);
    broker.create_topic(topic, partitions)?;
    println!("bootstrap.servers={}", broker.bootstrap_servers());
    let _ = std::io::stdout().flush();
    eprintln!(
        "embedded Kafka broker ready: topic {topic} with {partitions} partitions on {brokers} \
         broker(s); fault commands on stdin; Ctrl-C stops it"
    );
    let control = broker.clone();
    // A plain thread: reading stdin blocks, and the broker is safe to drive from any thread.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if line.trim().is_empty() {
                continue;
            }
            let answer = line
                .parse::<faults::Fault>()
                .and_then(|fault| fault.apply(&control));
            let mut stdout = std::io::stdout().lock();
            let _ = match answer {
                Ok(()) => writeln!(stdout, "ok {}", line.trim()),
                Err(err) => writeln!(stdout, "error {}: {err}", line.trim()),
            };
            let _ = stdout.flush();
        }
    });
    shutdown.await;
    drop(broker);
    Ok(())
}
