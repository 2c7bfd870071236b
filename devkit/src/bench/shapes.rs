//! `history-dev bench --partitions 1,3,6,24,96`: the drain of the real service on topics of
//! several shapes in one run — few partitions and many, and one skewed (24 partitions, 90% of
//! the records on one) — so that a shape the flow control serves badly shows next to the one
//! it serves well. Each shape drains its own topic into its own database, timed from the first
//! fetch to the final commit; its rate is compared with the 24-partition shape of the same run.
//!
//! The embedded broker keeps 5 MiB per partition, so a shape gets at most
//! [`RECORDS_PER_PARTITION`] records per partition (and no more than `--events`).

use std::time::Duration;

use super::{BenchDatabases, BenchOptions, phases, report::Rate};
use crate::DevError;
use crate::broker::EmbeddedBroker;
use crate::group::GroupInspector;
use crate::workload::{self, PlannedRecord, WorkloadSpec};
use history_service::config::Settings;
use history_service::store::{Database, verify};

/// Records per partition a shape gets at most: below the embedded broker's 5 MiB, with room
/// for the spread of records over partitions by key.
pub const RECORDS_PER_PARTITION: usize = 17_000;

/// Share of the skewed shape's records on its hot partition.
const HOT_SHARE: f64 = 0.9;

/// The partitions of the skewed shape.
const SKEWED_PARTITIONS: i32 = 24;

/// A topic shape to drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Records spread over the partitions by key.
    Even(i32),
    /// [`HOT_SHARE`] of the records on partition 0, the rest spread over the others.
    Skewed,
}

impl Shape {
    pub fn partitions(self) -> i32 {
        match self {
            Shape::Even(partitions) => partitions,
            Shape::Skewed => SKEWED_PARTITIONS,
        }
    }

    fn name(self) -> String {
        match self {
            Shape::Even(partitions) => partitions.to_string(),
            Shape::Skewed => "skewed".to_owned(),
        }
    }

    /// Records of the shape: as many as `--events` allows and the broker keeps.
    fn records(self, events: usize) -> usize {
        match self {
            Shape::Even(partitions) => events.min(partitions as usize * RECORDS_PER_PARTITION),
            Shape::Skewed => events.min((RECORDS_PER_PARTITION as f64 / HOT_SHARE) as usize),
        }
    }
}

/// What one shape's drain came to.
#[derive(Debug, Clone)]
pub struct ShapeResult {
    pub shape: Shape,
    pub rate: Rate,
    pub peak_rss_mb: f64,
    pub verified: bool,
}

/// The sweep's results, in the order the shapes ran.
#[derive(Debug, Clone)]
pub struct ShapesReport {
    pub results: Vec<ShapeResult>,
}

impl ShapesReport {
    /// The rate the shapes are compared with: the 24-partition shape's, else the first one's.
    fn reference(&self) -> f64 {
        self.results
            .iter()
            .find(|r| r.shape == Shape::Even(24))
            .or(self.results.first())
            .map_or(1.0, |r| r.rate.per_second())
    }

    pub fn verified(&self) -> bool {
        self.results.iter().all(|r| r.verified)
    }

    pub fn render(&self) -> String {
        let reference = self.reference();
        let mut out = String::from(
            "history-dev bench: topic shapes (the real service, first fetch to final commit)\n  \
             shape     records   seconds    events/s   ratio  peak RSS MB  verified\n",
        );
        for r in &self.results {
            out.push_str(&format!(
                "  {:<8} {:>8} {:>9.2} {:>11.0} {:>7.2} {:>12.1}  {}\n",
                r.shape.name(),
                r.rate.events,
                r.rate.elapsed.as_secs_f64(),
                r.rate.per_second(),
                r.rate.per_second() / reference,
                r.peak_rss_mb,
                if r.verified { "yes" } else { "NO" }
            ));
        }
        for r in &self.results {
            out.push_str(&format!(
                "RESULT shape={} partitions={} events={} service_eps={:.0} shape_ratio={:.2} peak_rss_mb={:.1}\n",
                r.shape.name(),
                r.shape.partitions(),
                r.rate.events,
                r.rate.per_second(),
                r.rate.per_second() / reference,
                r.peak_rss_mb
            ));
        }
        out
    }
}

pub async fn run(
    settings: &Settings,
    options: &BenchOptions,
    shapes: &[Shape],
) -> Result<ShapesReport, DevError> {
    let run_id = format!("{:08x}", rand::random::<u32>());
    let broker = EmbeddedBroker::start(1)?;
    let brokers = broker.bootstrap_servers();
    let server = crate::postgres::prepare(&settings.database.postgres_config()?).await?;
    let databases = BenchDatabases::new(&server.config, &run_id, options.keep_databases);
    let inspector = GroupInspector::new(&brokers, "bench-shapes-inspector")?;
    let mut results = Vec::with_capacity(shapes.len());
    for &shape in shapes {
        let topic = format!("bench.shape.{}", shape.name());
        let partitions = shape.partitions();
        broker.create_topic(&topic, partitions)?;
        let events = shape.records(options.events);
        let mut records = workload::generate(&WorkloadSpec {
            records: events,
            duplicates: options.duplicates,
            poison: 0.0,
            partitions,
            id_prefix: format!("bench-{run_id}-{}", shape.name()),
            tickets: 10_000,
            max_payload_bytes: settings.pipeline.max_payload_bytes,
            seed: 42,
        });
        if shape == Shape::Skewed {
            skew(&mut records, partitions);
        }
        let distinct = workload::distinct_events(&records);
        eprintln!(
            "shape {}: producing {events} records to {topic}...",
            shape.name()
        );
        let produce = {
            let (brokers, topic, records) = (brokers.clone(), topic.clone(), records.clone());
            tokio::task::spawn_blocking(move || workload::produce(&brokers, &topic, &records))
        };
        produce.await.expect("producer thread")?;
        for partition in 0..partitions {
            let (low, _) = inspector.watermarks(&topic, partition, Duration::from_secs(5))?;
            if low > 0 {
                return Err(DevError::Bench(format!(
                    "{topic}[{partition}] dropped its first {low} records (the embedded broker \
                     keeps 5 MiB per partition): use fewer --events"
                )));
            }
        }
        let ends = inspector.ends(&topic, partitions, Duration::from_secs(10))?;
        let database = databases.create(&format!("shape_{}", shape.name())).await?;
        let shape_options = BenchOptions {
            events,
            partitions,
            ..options.clone()
        };
        let drain = phases::measure_service(
            settings,
            &shape_options,
            &brokers,
            &server.config,
            &database,
            &topic,
            &ends,
            &run_id,
        )
        .await?;
        let verified = {
            let client = Database::plain(database.clone()).connect().await?;
            let report = verify::verify(&client, 5).await?;
            report.is_consistent() && report.history_rows == distinct as i64
        };
        eprintln!(
            "  {:.0} events/s, peak RSS {:.1} MB",
            drain.rate.per_second(),
            drain.peak_rss_mb
        );
        results.push(ShapeResult {
            shape,
            rate: drain.rate,
            peak_rss_mb: drain.peak_rss_mb,
            verified,
        });
    }
    databases.drop_all().await;
    drop(server);
    Ok(ShapesReport { results })
}

/// Moves [`HOT_SHARE`] of the records to partition 0 and spreads the rest over the others, in a
/// fixed pattern (nine of every ten records to the hot partition).
fn skew(records: &mut [PlannedRecord], partitions: i32) {
    let cold = (partitions - 1).max(1) as usize;
    for (n, record) in records.iter_mut().enumerate() {
        record.partition = Some(if n % 10 < 9 {
            0
        } else {
            1 + ((n / 10) % cold) as i32
        });
    }
}

/// The shapes `--partitions` names: one per count, and the skewed one when there are several.
pub fn parse(partitions: &[i32]) -> Vec<Shape> {
    let mut shapes: Vec<Shape> = partitions.iter().map(|&p| Shape::Even(p)).collect();
    if shapes.len() > 1 {
        shapes.push(Shape::Skewed);
    }
    shapes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_adds_the_skewed_shape_and_a_single_shape_does_not() {
        assert_eq!(
            parse(&[1, 24]),
            vec![Shape::Even(1), Shape::Even(24), Shape::Skewed]
        );
        assert_eq!(parse(&[24]), vec![Shape::Even(24)]);
    }

    #[test]
    fn small_shapes_get_what_the_broker_keeps_per_partition() {
        assert_eq!(Shape::Even(1).records(100_000), RECORDS_PER_PARTITION);
        assert_eq!(Shape::Even(3).records(100_000), 3 * RECORDS_PER_PARTITION);
        assert_eq!(Shape::Even(24).records(100_000), 100_000);
        let skewed = Shape::Skewed.records(100_000);
        assert!((skewed as f64 * HOT_SHARE) as usize <= RECORDS_PER_PARTITION);
    }

    #[test]
    fn the_skewed_shape_puts_nine_records_in_ten_on_partition_0() {
        let mut records: Vec<PlannedRecord> = workload::generate(&WorkloadSpec {
            records: 1000,
            duplicates: 0.0,
            poison: 0.0,
            partitions: 24,
            id_prefix: "skew".into(),
            tickets: 10,
            max_payload_bytes: 65536,
            seed: 1,
        });
        skew(&mut records, 24);
        let hot = records.iter().filter(|r| r.partition == Some(0)).count();
        assert_eq!(hot, 900);
        assert!(records.iter().all(|r| r.partition.unwrap() < 24));
    }
}
