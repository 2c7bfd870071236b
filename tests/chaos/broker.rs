//! The broker of a run: `history-dev dev-kafka` (three brokers, each behind a fault proxy of
//! its own) as a child process, faults injected through its standard input.

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
        std::thread::spawn({
            let refused = refused.clone();
            move || {
                for line in lines.map_while(Result::ok) {
                    if !line.starts_with("ok ") {
                        refused.lock().unwrap().push(line);
                    }
                }
            }
        });
        DevKafka {
            process,
            brokers,
            refused,
        }
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
