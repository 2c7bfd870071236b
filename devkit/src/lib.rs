//! history-service's development kit: the embedded broker and its faults, a TCP fault proxy,
//! generated workloads, a throwaway PostgreSQL server and a throwaway database per test, the group
//! inspector (committed offsets as an operator reads them), an HTTP probe and the one metrics
//! reader, /proc CPU readings, one child-process wrapper and `TestApp` (the service under test
//! with its database, broker, topic and group) — the test-support library the tests take as a
//! dev-dependency — and the `history-dev` commands: the demo, the benchmark and `dev-kafka`.
//! Nothing here is linked into the production binary.

pub mod bench;
pub mod broker;
pub mod cpu;
pub mod demo;
pub mod external_producer;
pub mod fault_proxy;
pub mod faults;
pub mod group;
pub mod identity;
pub mod kafka_wire;
pub mod postgres;
pub mod probe;
pub mod process;
pub mod raw_batch;
pub mod tansu;
pub mod test_app;
pub mod test_db;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

/// A binary of this workspace (`history-service`, `history-dev`), from the target directory
/// the running test executable was built in (`target/<profile>/deps/…` → `target/<profile>/`).
/// `scripts/test.sh` builds every binary of the workspace before it runs the tests.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the running executable has a path");
    let mut dir = exe
        .parent()
        .expect("an executable lives in a directory")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
}

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
    Store(#[from] history_service::store::StoreError),
    #[error(transparent)]
    Config(#[from] history_service::config::ConfigError),
    #[error(transparent)]
    Service(#[from] history_service::app::ServiceError),
    #[error("not everything was committed within {0:?}")]
    Timeout(Duration),
    #[error("benchmark: {0}")]
    Bench(String),
}

/// `history-dev dev-kafka`: runs an embedded broker with the topic until `shutdown`.
/// Prints `bootstrap.servers=HOST:PORT` as the first line on standard output, then reads fault
/// commands (see [`faults`]) from standard input, answering each with a line `ok ...` or
/// `error ...`.
pub async fn dev_kafka(
    topic: &str,
    partitions: i32,
    brokers: i32,
    proxied: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DevError> {
    use std::io::{BufRead, Write};
    let broker = if proxied {
        broker::EmbeddedBroker::start_proxied(brokers)?
    } else {
        broker::EmbeddedBroker::start(brokers)?
    };
    let broker = std::sync::Arc::new(broker);
    broker.create_topic(topic, partitions)?;
    println!("bootstrap.servers={}", broker.bootstrap_servers());
    let _ = std::io::stdout().flush();
    eprintln!(
        "embedded Kafka broker ready: topic {topic} with {partitions} partitions on {brokers} \
         broker(s){}; fault commands on stdin; Ctrl-C stops it",
        if proxied {
            ", each behind a fault proxy"
        } else {
            ""
        }
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
