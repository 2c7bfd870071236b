//! The broker of a run: `history-dev dev-kafka` (three brokers, each behind a fault proxy of
//! its own) as a child process, faults injected through its standard input, and every
//! OffsetCommit its brokers were sent read back from its standard output.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use history_devkit::process::Process;

use crate::schedule::PARTITIONS;

pub struct DevKafka {
    process: Process,
    /// Its `bootstrap.servers`.
    pub brokers: String,
    /// What it answered other than `ok` to a fault command: the run fails on it.
    refused: Arc<Mutex<Vec<String>>>,
    /// Every OffsetCommit its brokers were sent, a position each, in the order sent.
    sent: Arc<Mutex<Vec<SentCommit>>>,
    /// `print-commits` commands answered.
    printed: Arc<std::sync::atomic::AtomicUsize>,
}

/// One partition's position in an OffsetCommit a broker was sent, as `dev-kafka
/// --print-commits` reads it off the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentCommit {
    pub at: chrono::DateTime<chrono::Utc>,
    pub group: String,
    pub generation: i32,
    pub member: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl SentCommit {
    /// Reads a `commit-sent …` line; `None` for any other.
    fn parse(line: &str) -> Option<SentCommit> {
        let fields: std::collections::HashMap<&str, &str> = line
            .strip_prefix("commit-sent ")?
            .split(' ')
            .filter_map(|field| field.split_once('='))
            .collect();
        Some(SentCommit {
            at: chrono::DateTime::parse_from_rfc3339(fields.get("at")?)
                .ok()?
                .to_utc(),
            group: fields.get("group")?.to_string(),
            generation: fields.get("generation")?.parse().ok()?,
            member: fields.get("member")?.to_string(),
            topic: fields.get("topic")?.to_string(),
            partition: fields.get("partition")?.parse().ok()?,
            offset: fields.get("offset")?.parse().ok()?,
        })
    }
}

impl DevKafka {
    /// Starts the development kit's broker (the service under test may be a mutant build);
    /// its standard error goes to `dir/dev-kafka.log`.
    pub fn start(dir: &Path) -> DevKafka {
        let mut process = Process::command(history_devkit::workspace_binary("history-dev"))
            .args([
                "dev-kafka",
                "--brokers",
                "3",
                "--partitions",
                &PARTITIONS.to_string(),
                "--proxied",
                "--print-commits",
            ])
            .stdin_piped()
            .stdout_piped()
            .log_file(dir.join("dev-kafka.log"))
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(process.take_stdout().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let brokers = first.strip_prefix("bootstrap.servers=").unwrap().to_owned();
        let refused = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let printed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::spawn({
            let (refused, sent, printed) = (refused.clone(), sent.clone(), printed.clone());
            move || {
                for line in lines.map_while(Result::ok) {
                    if line == "ok print-commits" {
                        printed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    } else if line.starts_with("commit-sent ") {
                        match SentCommit::parse(&line) {
                            Some(commit) => sent.lock().unwrap().push(commit),
                            None => refused.lock().unwrap().push(format!("unreadable: {line}")),
                        }
                    } else if !line.starts_with("ok ") {
                        refused.lock().unwrap().push(line);
                    }
                }
            }
        });
        DevKafka {
            process,
            brokers,
            refused,
            sent,
            printed,
        }
    }

    /// Every OffsetCommit its brokers were sent so far: asks dev-kafka to print the ones it has
    /// not yet, and waits for its answer, which comes after them.
    pub fn sent_commits(&mut self) -> Vec<SentCommit> {
        let answered = self.printed.load(std::sync::atomic::Ordering::SeqCst);
        self.fault("print-commits");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.printed.load(std::sync::atomic::Ordering::SeqCst) == answered {
            assert!(
                std::time::Instant::now() < deadline,
                "dev-kafka did not answer print-commits within 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        self.sent.lock().unwrap().clone()
    }

    /// Sends one fault command (see `history_devkit::faults`).
    pub fn fault(&mut self, command: &str) {
        self.assert_none_refused();
        let control = self.process.stdin().expect("standard input is piped");
        writeln!(control, "{command}").unwrap();
        control.flush().unwrap();
    }

    /// Fails the run if dev-kafka refused a fault sent so far (a fault that did not happen
    /// would make the run prove less than it says).
    pub fn assert_none_refused(&self) {
        let refused = self.refused.lock().unwrap();
        assert!(refused.is_empty(), "dev-kafka refused faults: {refused:?}");
    }

    pub fn kill(&mut self) {
        self.assert_none_refused();
        self.process.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_dev_kafka_prints_of_a_commit_is_read_back() {
        use history_devkit::kafka_wire::{CommittedPartition, OffsetCommit};
        let sent = history_devkit::broker::SentCommit {
            at: std::time::Instant::now(),
            wall: chrono::Utc::now(),
            broker: 2,
            commit: OffsetCommit {
                version: 9,
                group_id: "g".into(),
                generation: 7,
                member_id: "rdkafka-1b2c".into(),
                partitions: vec![CommittedPartition {
                    topic: "t".into(),
                    partition: 4,
                    offset: 1200,
                    metadata: None,
                }],
            },
        };
        let lines = history_devkit::commit_sent_line(&sent);
        let commit = SentCommit::parse(&lines[0]).unwrap();
        assert_eq!(
            commit,
            SentCommit {
                at: sent.wall,
                group: "g".into(),
                generation: 7,
                member: "rdkafka-1b2c".into(),
                topic: "t".into(),
                partition: 4,
                offset: 1200,
            }
        );
        assert_eq!(SentCommit::parse("ok thaw"), None);
    }
}
