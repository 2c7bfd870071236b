//! The `history-service` command line. Errors become `anyhow` here, at the binary's edge.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::store::{migrate, verify};

#[derive(Debug, Parser)]
#[command(
    name = "history-service",
    version,
    about = "Keeps an exactly-once-in-effect projection of ticket status events from Kafka in PostgreSQL",
    long_about = None,
)]
pub struct Cli {
    /// Configuration file layered over the built-in defaults (environment variables
    /// HISTORY__SECTION__KEY override both).
    #[arg(
        long,
        short = 'c',
        global = true,
        env = "HISTORY_CONFIG",
        value_name = "PATH"
    )]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service: consume the configured topics in the consumer group and record every
    /// event exactly once in effect. Stops gracefully on SIGINT or SIGTERM.
    Run,
    /// Run the whole service on embedded defaults: an embedded broker, the configured
    /// PostgreSQL (or a throwaway one), the seed scenario and a generated stream, then a report.
    Demo(DemoArgs),
    /// Run an embedded Kafka-protocol broker (librdkafka's mock cluster) for local development.
    /// Prints `bootstrap.servers=HOST:PORT` as its first line; runs until SIGINT or SIGTERM.
    DevKafka(DevKafkaArgs),
    /// Apply pending database migrations, then exit. Safe to run from several replicas at once.
    Migrate(MigrateArgs),
    /// Check the database's invariants: every inbox marker has its history row and every row
    /// its marker. Exits 0 if they hold, 1 naming the offending event_ids if not, 2 on error.
    Verify(VerifyArgs),
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Generated records after the three seed records.
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    /// Partitions of the demo topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Fraction of generated records that redeliver an earlier event.
    #[arg(long, default_value_t = 0.1)]
    pub duplicates: f64,
    /// Fraction of generated records that are poison (dead-lettered).
    #[arg(long, default_value_t = 0.0005)]
    pub poison: f64,
}

#[derive(Debug, clap::Args)]
pub struct DevKafkaArgs {
    /// Topic to create.
    #[arg(long, default_value = "tickets.status.v1")]
    pub topic: String,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Brokers in the cluster.
    #[arg(long, default_value_t = 1)]
    pub brokers: i32,
}

#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    /// Create the configured database first if it does not exist.
    #[arg(long)]
    pub create_database: bool,
}

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Most offending event_ids listed per kind of violation.
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
}

/// Parses the command line, runs the command, and maps the result to the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let mut log = settings.log.clone();
    if matches!(cli.command, Command::Demo(_)) && std::env::var_os("RUST_LOG").is_none() {
        // The demo prints its own progress and report; only warnings (poison records, retries)
        // are worth interleaving with them.
        log.filter = "warn".to_owned();
    }
    crate::telemetry::init(&log);
    let runtime = actix_rt::System::new();
    let result = match cli.command {
        Command::Run => runtime.block_on(run_service(&settings)),
        Command::Demo(args) => runtime.block_on(run_demo(&settings, &args)),
        Command::DevKafka(args) => runtime.block_on(async {
            crate::dev::dev_kafka(
                &args.topic,
                args.partitions,
                args.brokers,
                crate::app::shutdown_signal(),
            )
            .await?;
            Ok(ExitCode::SUCCESS)
        }),
        Command::Migrate(args) => runtime.block_on(run_migrate(&settings, &args)),
        Command::Verify(args) => runtime.block_on(run_verify(&settings, &args)),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

async fn run_service(settings: &Settings) -> anyhow::Result<ExitCode> {
    crate::app::run(settings, crate::app::shutdown_signal())
        .await
        .context("history-service failed")?;
    Ok(ExitCode::SUCCESS)
}

async fn run_demo(settings: &Settings, args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let options = crate::dev::demo::DemoOptions {
        records: args.events,
        partitions: args.partitions,
        duplicates: args.duplicates,
        poison: args.poison,
        ..Default::default()
    };
    let report = crate::dev::demo::run(settings, &options)
        .await
        .context("demo failed")?;
    print!("{}", report.render(&options.topic));
    if report.is_correct() {
        println!("OK: every event recorded once, every poison record kept, every offset committed");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("FAILED: the run did not meet the promise (see above)");
        Ok(ExitCode::from(1))
    }
}

async fn run_migrate(settings: &Settings, args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let config = settings.database.postgres_config()?;
    let target = settings.database.display_target();
    if args.create_database && migrate::create_database_if_missing(&config).await? {
        println!("created database {target}");
    }
    let mut client = migrate::connect(&config)
        .await
        .with_context(|| format!("failed to connect to {target}"))?;
    let report = migrate::run_migrations(&mut client)
        .await
        .with_context(|| format!("failed to migrate {target}"))?;
    if report.applied.is_empty() {
        println!("{target}: schema up to date ({} migrations)", report.known);
    } else {
        println!(
            "{target}: applied {} ({} migrations known)",
            report.applied.join(", "),
            report.known
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_verify(settings: &Settings, args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let config = settings.database.postgres_config()?;
    let target = settings.database.display_target();
    let client = migrate::connect(&config)
        .await
        .with_context(|| format!("failed to connect to {target}"))?;
    let report = verify::verify(&client, args.limit)
        .await
        .with_context(|| format!("failed to check {target}"))?;
    println!("database:                       {target}");
    println!("inbox markers:                  {}", report.inbox_markers);
    println!("history rows:                   {}", report.history_rows);
    println!(
        "markers without a history row:  {}",
        report.markers_without_row_total
    );
    println!(
        "history rows without a marker:  {}",
        report.rows_without_marker_total
    );
    if report.is_consistent() {
        println!("OK: every inbox marker has its history row, and every row its marker");
        return Ok(ExitCode::SUCCESS);
    }
    print_offenders(
        "lost events (marker without history row)",
        &report.markers_without_row,
        report.markers_without_row_total,
    );
    print_offenders(
        "history rows without a marker",
        &report.rows_without_marker,
        report.rows_without_marker_total,
    );
    Ok(ExitCode::from(1))
}

fn print_offenders(title: &str, ids: &[String], total: i64) {
    if total == 0 {
        return;
    }
    println!("VIOLATION: {title}: {total}");
    for id in ids {
        println!("  {id}");
    }
    if total > ids.len() as i64 {
        println!("  ... and {} more", total - ids.len() as i64);
    }
}
