//! `history-dev`: the development kit's commands — the whole service on embedded defaults
//! (`demo`), the benchmark (`bench`), and an embedded Kafka-protocol broker (`dev-kafka`). None
//! of it is linked into the production binary, `history-service`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use history_service::config::Settings;

#[derive(Debug, Parser)]
#[command(
    name = "history-dev",
    version,
    about = "history-service's development kit: a demo on embedded defaults, the benchmark, an embedded Kafka broker",
    long_about = None,
)]
struct Cli {
    /// Configuration file layered over the built-in defaults (environment variables
    /// HISTORY__SECTION__KEY override both).
    #[arg(
        long,
        short = 'c',
        global = true,
        env = "HISTORY_CONFIG",
        value_name = "PATH"
    )]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the whole service on embedded defaults: an embedded broker, the configured
    /// PostgreSQL (or a throwaway one), the seed scenario and a generated stream, then a report.
    Demo(DemoArgs),
    /// Measure throughput, memory and latency: the service (`history-service run`, beside this
    /// binary) draining a backlog, against the batched statement alone, PostgreSQL's own
    /// set-based insert and a naive consumer. Prints a table and a last line
    /// `RESULT events=... service_eps=... ceiling_ratio=... p99_ms=...`. With `--fairness`, how
    /// the service shares a slowed database between backlogged partitions instead
    /// (`RESULT phase=fairness ...`).
    Bench(BenchArgs),
    /// Run an embedded Kafka-protocol broker (librdkafka's mock cluster) for local development.
    /// Prints `bootstrap.servers=HOST:PORT` as its first line; runs until SIGINT or SIGTERM.
    DevKafka(DevKafkaArgs),
    /// The benchmark's floor consumer (run by `bench`, not by hand): consumes `--records`
    /// records from the start, copying (and with `--decode`, decoding) each, and prints `FLOOR
    /// records=N cpu_ns=C`, its process's CPU from the first record to the last.
    #[command(hide = true)]
    BenchFloor(BenchFloorArgs),
}

#[derive(Debug, clap::Args)]
struct BenchFloorArgs {
    #[arg(long)]
    brokers: String,
    #[arg(long)]
    topic: String,
    #[arg(long)]
    group: String,
    #[arg(long)]
    records: usize,
    /// Decode each payload too, accepting payloads up to this many bytes.
    #[arg(long, value_name = "MAX_PAYLOAD_BYTES")]
    decode: Option<usize>,
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// Generated records after the three seed records.
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Partitions of the demo topic.
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// Fraction of generated records that redeliver an earlier event.
    #[arg(long, default_value_t = 0.1)]
    duplicates: f64,
    /// Fraction of generated records that are poison (dead-lettered).
    #[arg(long, default_value_t = 0.0005)]
    poison: f64,
}

#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Records in the backlog (duplicates included) [default: 100000; with --fairness 460000,
    /// spread over every partition but the quiet one].
    #[arg(long)]
    events: Option<usize>,
    /// Partitions of the backlog's topic. The embedded broker keeps 5 MiB per partition, about
    /// 25,000 records: use at least events / 20,000. Several, comma separated (`1,3,6,24,96`),
    /// sweep topic shapes instead: the service's drain on each (at most 17,000 records per
    /// partition), plus a skewed shape (24 partitions, 90% of the records on one), one RESULT
    /// line each.
    #[arg(long, default_value = "24", value_delimiter = ',', num_args = 1..)]
    partitions: Vec<i32>,
    /// Fraction of records that redeliver an earlier event.
    #[arg(long, default_value_t = 0.1)]
    duplicates: f64,
    /// DB writers of the service, and connections of the ceiling (default: pipeline.writers).
    #[arg(long)]
    writers: Option<usize>,
    /// Events per transaction (default: pipeline.batch_max_events).
    #[arg(long)]
    batch: Option<usize>,
    /// Records the naive consumer processes; its rate is measured on this sample.
    #[arg(long, default_value_t = 2000)]
    naive_events: usize,
    /// Offered load of the latency measurement, events per second.
    #[arg(long, default_value_t = 2000)]
    latency_rate: u32,
    /// Duration of the latency measurement, seconds.
    #[arg(long, default_value_t = 10)]
    latency_seconds: u64,
    /// Keep the benchmark's databases (history_bench_*) instead of dropping them.
    #[arg(long)]
    keep_databases: bool,
    /// Measure only fairness under a slow database: every partition but the last backlogged
    /// with --events records, the database slowed to a tenth of the service's measured speed,
    /// an event every 250 ms on the quiet partition. Reports each partition's smallest share of
    /// the rows written in any 5 s window and the quiet events' produce -> row latency; last
    /// line `RESULT phase=fairness partitions=... min_share=... quiet_p99_ms=...`.
    #[arg(
        long,
        conflicts_with_all = ["duplicates", "naive_events", "latency_rate", "latency_seconds"]
    )]
    fairness: bool,
    /// With --fairness: the backlog producer's `batch.size` in bytes (default librdkafka's,
    /// 1 MB). A fetch response carries a partition's batch whole, so this is how many records
    /// of one partition arrive together.
    #[arg(long, requires = "fairness")]
    producer_batch_bytes: Option<usize>,
}

#[derive(Debug, clap::Args)]
struct DevKafkaArgs {
    /// Topic to create.
    #[arg(long, default_value = "tickets.status.v1")]
    topic: String,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// Brokers in the cluster.
    #[arg(long, default_value_t = 1)]
    brokers: i32,
    /// Reach every broker through a fault proxy of its own, for the connection faults
    /// (freeze-connections, thaw, freeze-new, refuse-connections, reset-connections, latency).
    #[arg(long)]
    proxied: bool,
    /// Print every OffsetCommit a broker is sent (read off the wire by the proxies), a line
    /// `commit-sent at=… broker=… group=… generation=… member=… topic=… partition=… offset=…`
    /// per partition. Needs --proxied.
    #[arg(long, requires = "proxied")]
    print_commits: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let mut log = settings.log.clone();
    if matches!(cli.command, Command::Demo(_) | Command::Bench(_))
        && std::env::var_os("RUST_LOG").is_none()
    {
        // The demo prints its own progress and report; only warnings (poison records, retries)
        // are worth interleaving with them.
        log.filter = "warn".to_owned();
    }
    history_service::telemetry::init(&log);
    let runtime = actix_rt::System::new();
    let result = match cli.command {
        Command::Demo(args) => runtime.block_on(run_demo(&settings, &args)),
        Command::Bench(args) => runtime.block_on(run_bench(&settings, &args)),
        Command::BenchFloor(args) => history_devkit::bench::floor::consume(
            &args.brokers,
            &args.topic,
            &args.group,
            args.records,
            args.decode,
        )
        .map(|reading| {
            println!("{}", reading.line());
            ExitCode::SUCCESS
        })
        .map_err(anyhow::Error::from),
        Command::DevKafka(args) => runtime.block_on(async {
            history_devkit::dev_kafka(
                &args.topic,
                args.partitions,
                args.brokers,
                args.proxied,
                args.print_commits,
                history_service::app::shutdown_signal(),
            )
            .await?;
            Ok(ExitCode::SUCCESS)
        }),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

async fn run_demo(settings: &Settings, args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let options = history_devkit::demo::DemoOptions {
        records: args.events,
        partitions: args.partitions,
        duplicates: args.duplicates,
        poison: args.poison,
        ..Default::default()
    };
    let report = history_devkit::demo::run(settings, &options)
        .await
        .context("demo failed")?;
    print!("{}", report.render());
    if report.is_correct() {
        println!("OK: every event recorded once, every poison record kept, every offset committed");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("FAILED: the run did not meet the promise (see above)");
        Ok(ExitCode::from(1))
    }
}

async fn run_bench(settings: &Settings, args: &BenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(&partitions) = args.partitions.iter().find(|&&p| p < 1) {
        anyhow::bail!("--partitions: {partitions} is not a partition count");
    }
    let default_events = if args.fairness {
        history_devkit::bench::fairness::DEFAULT_EVENTS
    } else {
        history_devkit::bench::BenchOptions::default().events
    };
    let options = history_devkit::bench::BenchOptions {
        events: args.events.unwrap_or(default_events),
        partitions: args.partitions[0],
        duplicates: args.duplicates,
        writers: args.writers.unwrap_or(settings.pipeline.writers),
        batch: args.batch.unwrap_or(settings.pipeline.batch_max_events),
        naive_events: args.naive_events,
        latency_rate: args.latency_rate,
        latency_seconds: args.latency_seconds,
        keep_databases: args.keep_databases,
        producer_batch_bytes: args.producer_batch_bytes,
        ..Default::default()
    };
    if args.fairness {
        if args.partitions.len() > 1 {
            anyhow::bail!("--fairness takes one --partitions count");
        }
        let report = history_devkit::bench::fairness::run(settings, &options)
            .await
            .context("benchmark failed")?;
        print!("{}", report.render());
        return Ok(if report.verified {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    if args.partitions.len() > 1 {
        let shapes = history_devkit::bench::shapes::parse(&args.partitions);
        let report = history_devkit::bench::shapes::run(settings, &options, &shapes)
            .await
            .context("benchmark failed")?;
        print!("{}", report.render());
        return Ok(if report.verified() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let report = history_devkit::bench::run(settings, &options)
        .await
        .context("benchmark failed")?;
    print!("{}", report.render());
    Ok(if report.verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
