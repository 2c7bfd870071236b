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
/// `error ...`. With `print_commits` (behind proxies), every OffsetCommit a broker is sent is
/// printed too, a line per partition (see [`commit_sent_line`]), within 50 ms; the command
/// `print-commits` prints the rest at once and answers `ok print-commits`.
pub async fn dev_kafka(
    topic: &str,
    partitions: i32,
    brokers: i32,
    proxied: bool,
    print_commits: bool,
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
    // How many of the sent commits are printed; held while printing, so that the lines come
    // out in order and an answered `print-commits` follows every one sent before it.
    let printed = std::sync::Arc::new(std::sync::Mutex::new(0usize));
    let print_new = {
        let printed = printed.clone();
        move |broker: &broker::EmbeddedBroker| {
            let mut printed = printed.lock().unwrap();
            let sent = broker.sent_commits_since(*printed);
            *printed += sent.len();
            let mut stdout = std::io::stdout().lock();
            for line in sent.iter().flat_map(commit_sent_line) {
                let _ = writeln!(stdout, "{line}");
            }
            let _ = stdout.flush();
        }
    };
    if print_commits {
        let broker = std::sync::Arc::downgrade(&broker);
        let print_new = print_new.clone();
        std::thread::spawn(move || {
            while let Some(broker) = broker.upgrade() {
                print_new(&broker);
                drop(broker);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    let control = broker.clone();
    // A plain thread: reading stdin blocks, and the broker is safe to drive from any thread.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if line.trim().is_empty() {
                continue;
            }
            // Prints the commits not printed yet, then answers: what a reader of the output
            // waits for to know it has every commit sent so far.
            if print_commits && line.trim() == "print-commits" {
                print_new(&control);
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "ok print-commits");
                let _ = stdout.flush();
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

/// The lines `dev-kafka --print-commits` prints for one OffsetCommit a broker was sent, one per
/// partition: `commit-sent at=RFC3339 broker=B group=G generation=N member=M topic=T
/// partition=P offset=O` (the group, member and topic as sent, spaces and all never in them:
/// Kafka's names have none, and librdkafka's member ids neither).
pub fn commit_sent_line(sent: &broker::SentCommit) -> Vec<String> {
    let commit = &sent.commit;
    commit
        .partitions
        .iter()
        .map(|position| {
            format!(
                "commit-sent at={} broker={} group={} generation={} member={} topic={} \
                 partition={} offset={}",
                sent.wall
                    .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
                sent.broker,
                commit.group_id,
                commit.generation,
                commit.member_id,
                position.topic,
                position.partition,
                position.offset
            )
        })
        .collect()
}
