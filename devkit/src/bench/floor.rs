//! The floor under the service's CPU per event: what any consumer built on the same client and
//! decoder pays before it writes anything. Two readings of a process that consumes the backlog
//! with librdkafka's own poll loop on one thread (the client's cheapest path per record) and
//! copies each record's key and payload out of the client's buffers, as a consumer that hands
//! records to another thread must; the second also decodes each payload with the service's
//! decoder. The service's figure is compared with these, measured in the same run on the same
//! records, rather than with PostgreSQL's alone: the part above the second floor is what the
//! service's own design costs.

use std::hint::black_box;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;

use crate::DevError;
use history_service::domain::HistoryEvent;

/// How long a floor consumer may take to read the backlog before the benchmark gives up on it.
const FLOOR_DEADLINE: Duration = Duration::from_secs(300);

/// What the floor process read and the CPU its whole process spent from its first record to its
/// last (every thread, librdkafka's included).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloorReading {
    pub records: usize,
    pub cpu: Duration,
}

impl FloorReading {
    /// The floor process's last line.
    pub fn line(&self) -> String {
        format!(
            "FLOOR records={} cpu_ns={}",
            self.records,
            self.cpu.as_nanos()
        )
    }

    fn parse(line: &str) -> Option<FloorReading> {
        let mut records = None;
        let mut cpu = None;
        for pair in line.strip_prefix("FLOOR ")?.split_whitespace() {
            match pair.split_once('=')? {
                ("records", value) => records = value.parse().ok(),
                ("cpu_ns", value) => cpu = value.parse().ok().map(Duration::from_nanos),
                _ => {}
            }
        }
        Some(FloorReading {
            records: records?,
            cpu: cpu?,
        })
    }

    pub fn us_per_event(&self) -> f64 {
        super::report::per_event_us(self.cpu, self.records)
    }
}

/// The two floors of one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Floors {
    /// Consumed and copied.
    pub consume_us: f64,
    /// Consumed, copied and decoded.
    pub decode_us: f64,
}

/// The CPU this process has spent, every thread.
fn process_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "the process CPU clock is readable on Linux");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Consumes `records` records of `topic` from the start as group `group`, each copied and, with
/// `decode` (the largest payload accepted), decoded. Fails if they have not all come within
/// [`FLOOR_DEADLINE`].
pub fn consume(
    brokers: &str,
    topic: &str,
    group: &str,
    records: usize,
    decode: Option<usize>,
) -> Result<FloorReading, DevError> {
    let floor = |what: String| DevError::Bench(format!("floor consumer: {what}"));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .map_err(|err| floor(err.to_string()))?;
    consumer
        .subscribe(&[topic])
        .map_err(|err| floor(err.to_string()))?;
    let deadline = Instant::now() + FLOOR_DEADLINE;
    let mut started = None;
    let mut taken = 0;
    while taken < records {
        if Instant::now() > deadline {
            return Err(floor(format!(
                "{taken} of {records} records within {FLOOR_DEADLINE:?}"
            )));
        }
        let Some(received) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        // A broker's passing error is librdkafka's to retry; the deadline bounds the rest.
        let Ok(message) = received else {
            continue;
        };
        started.get_or_insert_with(process_cpu);
        let key = message.key().map(<[u8]>::to_vec);
        let payload = message.payload().map(<[u8]>::to_vec);
        let timestamp = message.timestamp().to_millis();
        if let Some(max_payload_bytes) = decode {
            let _ = black_box(HistoryEvent::decode(payload.as_deref(), max_payload_bytes));
        }
        black_box((key, payload, timestamp));
        taken += 1;
    }
    let cpu = process_cpu().saturating_sub(started.unwrap_or_default());
    Ok(FloorReading {
        records: taken,
        cpu,
    })
}

/// Runs the floor consumer as a process of its own (this binary's hidden `bench-floor`), so
/// that its CPU is its own and not the embedded broker's, and reads its last line.
async fn run_floor_process(
    brokers: &str,
    topic: &str,
    group: &str,
    records: usize,
    decode: Option<usize>,
) -> Result<FloorReading, DevError> {
    let failed = |what: String| DevError::Bench(format!("floor process: {what}"));
    let exe = std::env::current_exe().map_err(|err| failed(err.to_string()))?;
    let mut command = tokio::process::Command::new(exe);
    command
        .args(["bench-floor", "--brokers", brokers, "--topic", topic])
        .args(["--group", group, "--records", &records.to_string()])
        .env_remove("HISTORY_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(max_payload_bytes) = decode {
        command.args(["--decode", &max_payload_bytes.to_string()]);
    }
    let child = command.spawn().map_err(|err| failed(err.to_string()))?;
    let output = tokio::time::timeout(
        FLOOR_DEADLINE + Duration::from_secs(30),
        child.wait_with_output(),
    )
    .await
    .map_err(|_| failed(format!("no answer within {FLOOR_DEADLINE:?}")))?
    .map_err(|err| failed(err.to_string()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let reading = stdout.lines().rev().find_map(FloorReading::parse);
    match (output.status.success(), reading) {
        (true, Some(reading)) if reading.records == records => Ok(reading),
        _ => Err(failed(format!(
            "{}: {stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))),
    }
}

/// Both floors over the backlog of `records` records on `topic`.
pub(super) async fn measure(
    brokers: &str,
    topic: &str,
    records: usize,
    run_id: &str,
    max_payload_bytes: usize,
) -> Result<Floors, DevError> {
    let consume = run_floor_process(
        brokers,
        topic,
        &format!("bench-floor-consume-{run_id}"),
        records,
        None,
    )
    .await?;
    let decode = run_floor_process(
        brokers,
        topic,
        &format!("bench-floor-decode-{run_id}"),
        records,
        Some(max_payload_bytes),
    )
    .await?;
    Ok(Floors {
        consume_us: consume.us_per_event(),
        decode_us: decode.us_per_event(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_survives_its_line() {
        let reading = FloorReading {
            records: 500_000,
            cpu: Duration::from_nanos(612_345_678),
        };
        assert_eq!(FloorReading::parse(&reading.line()), Some(reading));
        assert_eq!(FloorReading::parse("FLOOR records=5"), None);
        assert_eq!(FloorReading::parse("RESULT records=5 cpu_ns=7"), None);
    }

    #[test]
    fn the_process_clock_counts_work() {
        let before = process_cpu();
        let mut x = 0u64;
        let until = Instant::now() + Duration::from_millis(30);
        while Instant::now() < until {
            x = black_box(x.wrapping_add(1));
        }
        assert!(process_cpu() > before + Duration::from_millis(10));
    }
}
