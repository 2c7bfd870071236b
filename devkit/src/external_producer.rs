//! Records produced by a client that is not ours: the confluent-kafka Python client (Debian's
//! `python3-confluent-kafka`, on a librdkafka of its own build), configured as a user's
//! producer would be — with `compression.type` gzip, snappy, lz4 or zstd. The embedded broker
//! stores the batches as they came, so the service then reads them compressed as it would on
//! the user's cluster.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::workload::{Delivered, PlannedRecord};

/// The producer script (`devkit/python/produce.py`).
const SCRIPT: &str = include_str!("../python/produce.py");

/// Every codec a Kafka producer may use.
pub const CODECS: [&str; 4] = ["gzip", "snappy", "lz4", "zstd"];

/// The Python that has the confluent-kafka client: Debian's, where `python3-confluent-kafka`
/// installs it (another `python3` may come first on `PATH`).
fn python() -> Result<&'static str, String> {
    for candidate in ["/usr/bin/python3", "python3"] {
        let found = python_command(candidate)
            .args(["-c", "import confluent_kafka"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if found {
            return Ok(candidate);
        }
    }
    Err(
        "no python3 with the confluent-kafka client: install Debian's python3-confluent-kafka \
         (scripts/test-tools.sh does)"
            .to_owned(),
    )
}

/// A command for `python`, with the client on its own librdkafka: `cargo test` puts the
/// directories of the workspace's native libraries on `LD_LIBRARY_PATH`, where rdkafka-sys's
/// build left a `librdkafka.so.1` of this build, which the client's extension would load
/// instead of Debian's.
fn python_command(python: &str) -> Command {
    let mut command = Command::new(python);
    command.env_remove("LD_LIBRARY_PATH");
    command
}

/// The librdkafka version the external client runs on (Debian's, not this build's).
pub fn client_librdkafka_version() -> Result<String, String> {
    let output = python_command(python()?)
        .args([
            "-c",
            "import confluent_kafka; print(confluent_kafka.libversion()[0])",
        ])
        .output()
        .map_err(|err| err.to_string())?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Produces `records` to `topic` with the confluent-kafka Python client, `properties` set on it
/// (`compression.type`, `linger.ms`, ...); returns where each landed, in input order.
pub fn produce(
    brokers: &str,
    topic: &str,
    records: &[PlannedRecord],
    properties: &[(&str, &str)],
) -> Result<Vec<Delivered>, String> {
    let python = python()?;
    let mut command = python_command(python);
    command
        .arg("-c")
        .arg(SCRIPT)
        .arg(format!("bootstrap.servers={brokers}"));
    for (key, value) in properties {
        command.arg(format!("{key}={value}"));
    }
    let mut child = command
        .arg(topic)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("cannot run {python}: {err}"))?;
    let mut input = String::new();
    for record in records {
        let line = serde_json::json!({
            "key": hex(&record.key),
            "value": record.payload.as_deref().map(hex),
            "partition": record.partition,
        });
        input.push_str(&line.to_string());
        input.push('\n');
    }
    // Written from a thread: the child writes its deliveries while it reads.
    let mut stdin = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child
        .wait_with_output()
        .map_err(|err| format!("the producer did not finish: {err}"))?;
    let written = writer.join().expect("the writer does not panic");
    // A producer that failed stops reading: its own reason comes first.
    if !output.status.success() {
        return Err(format!(
            "the confluent-kafka producer failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    written.map_err(|err| format!("cannot write to the producer: {err}"))?;
    let delivered: Vec<Delivered> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let value: serde_json::Value =
                serde_json::from_str(line).map_err(|err| format!("{line}: {err}"))?;
            let field = |name: &str| {
                value[name]
                    .as_i64()
                    .ok_or_else(|| format!("{line}: no {name}"))
            };
            Ok(Delivered {
                index: field("index")? as usize,
                partition: field("partition")? as i32,
                offset: field("offset")?,
            })
        })
        .collect::<Result<_, String>>()?;
    if delivered.len() != records.len() {
        return Err(format!(
            "{} of {} records delivered",
            delivered.len(),
            records.len()
        ));
    }
    Ok(delivered)
}
