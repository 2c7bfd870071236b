//! The `history-service` command line. Errors become `anyhow` here, at the binary's edge.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::domain::DecodeError;
use crate::store::dead_letters::{self, DeadLetterFilter};
use crate::store::{Database, migrate, verify};

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
    /// event exactly once in effect. Stops gracefully on SIGTERM, SIGINT or SIGHUP.
    Run,
    /// Inspect and replay dead letters: records that could not be decoded.
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
    /// Apply pending database migrations, then exit. Safe to run from several replicas at once.
    Migrate(MigrateArgs),
    /// Check the database's invariants: every inbox marker has its history row and every row
    /// its marker. Exits 0 if they hold, 1 naming the offending event_ids if not, 2 on error.
    Verify(VerifyArgs),
}

#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// List dead letters (not yet replayed, unless --include-replayed), with counts by reason.
    List {
        #[command(flatten)]
        filter: DeadLetterSelection,
        /// Also print each payload (escaped, first 200 bytes).
        #[arg(long)]
        payload: bool,
    },
    /// Republish dead letters' original key and payload to a topic (by default the one they
    /// came from) and mark them replayed. Replay after fixing the cause: a record that still
    /// cannot be decoded is dead-lettered again, at its new offset.
    Replay {
        #[command(flatten)]
        filter: DeadLetterSelection,
        /// Publish to this topic instead of the original one.
        #[arg(long, value_name = "TOPIC")]
        to_topic: Option<String>,
        /// Replay every selected letter even when no filter narrows the selection.
        #[arg(long)]
        all: bool,
        /// Show what would be replayed, publish nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Publish the dead letters still waiting for `dead_letter.topic` now (the service's relay
    /// retries them anyway); exits 1 if some still fail, with the reason stored on each.
    Publish,
}

#[derive(Debug, clap::Args)]
pub struct DeadLetterSelection {
    /// Only letters from this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only letters from this partition.
    #[arg(long)]
    pub partition: Option<i32>,
    /// Only the letter at this offset.
    #[arg(long)]
    pub offset: Option<i64>,
    /// Only letters with this reason code (not_json, missing_field, bad_timestamp, ...).
    #[arg(
        long,
        value_name = "CODE",
        value_parser = clap::builder::PossibleValuesParser::new(DecodeError::CODES),
        hide_possible_values = true
    )]
    pub reason: Option<String>,
    /// Include letters already replayed.
    #[arg(long)]
    pub include_replayed: bool,
    /// Most letters selected.
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
}

impl DeadLetterSelection {
    fn filter(&self) -> DeadLetterFilter {
        DeadLetterFilter {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            reason_code: self.reason.clone(),
            include_replayed: self.include_replayed,
            limit: self.limit,
        }
    }

    fn narrows(&self) -> bool {
        self.topic.is_some()
            || self.partition.is_some()
            || self.offset.is_some()
            || self.reason.is_some()
    }
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
    crate::telemetry::init(&settings.log);
    let runtime = actix_rt::System::new();
    let result = match cli.command {
        Command::Run => runtime.block_on(run_service(&settings)),
        Command::DeadLetters(command) => runtime.block_on(run_dead_letters(&settings, &command)),
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

/// `run`'s exit code when it stopped gracefully but the final commit did not cover every
/// record it wrote (the database or the broker did not answer in time): nothing is lost, the
/// next owner re-reads those records.
pub const EXIT_STOPPED_WITH_LEFTOVERS: u8 = 3;

async fn run_service(settings: &Settings) -> anyhow::Result<ExitCode> {
    let report = crate::app::run(settings, crate::app::shutdown_signal())
        .await
        .context("history-service failed")?;
    Ok(if report.left.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_STOPPED_WITH_LEFTOVERS)
    })
}

async fn run_dead_letters(
    settings: &Settings,
    command: &DeadLettersCommand,
) -> anyhow::Result<ExitCode> {
    let database = Database::from_settings(&settings.database)?;
    let client = database
        .connect()
        .await
        .with_context(|| format!("failed to connect to {}", database.target()))?;
    match command {
        DeadLettersCommand::List { filter, payload } => {
            let letters = dead_letters::list(&client, &filter.filter()).await?;
            println!(
                "{:<24} {:>9} {:>10}  {:<18} {:<20} {:<20} REASON",
                "TOPIC", "PARTITION", "OFFSET", "CODE", "FIRST SEEN", "REPLAYED"
            );
            for letter in &letters {
                println!(
                    "{:<24} {:>9} {:>10}  {:<18} {:<20} {:<20} {}",
                    letter.topic,
                    letter.partition,
                    letter.offset,
                    letter.reason_code,
                    letter.first_seen.format("%Y-%m-%d %H:%M:%S"),
                    letter.replayed_at.map_or("-".to_owned(), |at| at
                        .format("%Y-%m-%d %H:%M:%S")
                        .to_string()),
                    letter.reason
                );
                if *payload {
                    println!("    payload: {}", preview(letter.payload.as_deref()));
                }
                if let Some(topic) = &letter.publish_to {
                    println!("    {}", publish_state(topic, letter));
                }
            }
            let counts = dead_letters::count_by_reason(&client).await?;
            let summary: Vec<String> = counts
                .iter()
                .map(|(code, count)| format!("{code}={count}"))
                .collect();
            println!(
                "{} shown; all dead letters by reason: {}",
                letters.len(),
                if summary.is_empty() {
                    "none".to_owned()
                } else {
                    summary.join(" ")
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersCommand::Replay {
            filter,
            to_topic,
            all,
            dry_run,
        } => {
            if !filter.narrows() && !all {
                anyhow::bail!(
                    "replay needs a selection (--topic, --partition, --offset, --reason) or --all"
                );
            }
            let letters = dead_letters::list(&client, &filter.filter()).await?;
            let replayer = if *dry_run {
                None
            } else {
                Some(crate::kafka::replay::Replayer::new(&settings.kafka)?)
            };
            for letter in &letters {
                let target = to_topic.as_deref().unwrap_or(&letter.topic);
                let origin = format!("{}/{}/{}", letter.topic, letter.partition, letter.offset);
                match &replayer {
                    None => println!("would replay {origin} to {target}"),
                    Some(replayer) => {
                        let (partition, offset) = replayer
                            .replay(letter, to_topic.as_deref())
                            .await
                            .with_context(|| format!("failed to replay {origin}"))?;
                        dead_letters::mark_replayed(&client, letter).await?;
                        println!("replayed {origin} to {target}/{partition}/{offset}");
                    }
                }
            }
            println!(
                "{} {} dead letters",
                if *dry_run { "would replay" } else { "replayed" },
                letters.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersCommand::Publish => publish_dead_letters(settings, &database).await,
    }
}

/// Where a letter stands with the dead-letter topic.
fn publish_state(topic: &str, letter: &dead_letters::StoredDeadLetter) -> String {
    match (&letter.published_at, &letter.publish_error) {
        (Some(at), _) => format!("published to {topic} at {}", at.format("%Y-%m-%d %H:%M:%S")),
        (None, error) => format!(
            "not yet published to {topic}: {} failed attempts{}",
            letter.publish_attempts,
            error
                .as_ref()
                .map_or(String::new(), |error| format!(", last error: {error}"))
        ),
    }
}

/// `dead-letters publish`: the relay's rounds, run once until nothing is pending or a round fails.
async fn publish_dead_letters(
    settings: &Settings,
    database: &Database,
) -> anyhow::Result<ExitCode> {
    let topic = &settings.dead_letter.topic;
    if topic.is_empty() {
        anyhow::bail!("dead_letter.topic is not set: there is no topic to publish to");
    }
    let publisher =
        crate::kafka::dead_letter_topic::DeadLetterPublisher::new(&settings.kafka, topic)?;
    let pool = database.pool(1, settings.database.connect_timeout());
    let (mut published, mut failed) = (0, 0);
    loop {
        let round = publisher.publish_round(&pool).await?;
        published += round.published;
        failed += round.failed;
        if round.pending == 0 || round.failed > 0 {
            break;
        }
    }
    println!("published {published} dead letters to {topic}; {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        println!("see `history-service dead-letters list` for each one's reason");
        ExitCode::from(1)
    })
}

/// A payload for a terminal: escaped, at most 200 bytes.
fn preview(payload: Option<&[u8]>) -> String {
    match payload {
        None => "(null: tombstone)".to_owned(),
        Some(bytes) => {
            let shown = &bytes[..bytes.len().min(200)];
            let text: String = shown.escape_ascii().to_string();
            if bytes.len() > shown.len() {
                format!("{text}... ({} bytes)", bytes.len())
            } else {
                text
            }
        }
    }
}

async fn run_migrate(settings: &Settings, args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let database = Database::from_settings(&settings.database)?;
    let target = database.target();
    if args.create_database && migrate::create_database_if_missing(&database).await? {
        println!("created database {target}");
    }
    let mut client = database
        .connect()
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
    let database = Database::from_settings(&settings.database)?;
    let target = database.target();
    let client = database
        .connect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Field;

    #[test]
    fn every_decode_error_code_is_a_valid_reason_and_no_other() {
        let field = Field::EventId;
        let errors = [
            DecodeError::NullPayload,
            DecodeError::TooLarge { size: 2, limit: 1 },
            DecodeError::NotUtf8 { detail: "x".into() },
            DecodeError::NotJson { detail: "x".into() },
            DecodeError::NotObject { found: "an array" },
            DecodeError::MissingField { field },
            DecodeError::DuplicateField { field },
            DecodeError::WrongType {
                field,
                found: "a number",
            },
            DecodeError::EmptyField { field },
            DecodeError::TooLong {
                field,
                chars: 2,
                limit: 1,
            },
            DecodeError::ControlCharacter { field },
            DecodeError::BadTimestamp { detail: "x".into() },
        ];
        let mut codes: Vec<&str> = errors.iter().map(DecodeError::code).collect();
        let mut listed = DecodeError::CODES.to_vec();
        codes.sort_unstable();
        listed.sort_unstable();
        assert_eq!(codes, listed);
    }

    #[test]
    fn an_unknown_reason_code_is_refused_listing_the_valid_ones() {
        let err = Cli::try_parse_from([
            "history-service",
            "dead-letters",
            "list",
            "--reason",
            "nosuch",
        ])
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("nosuch"), "{text}");
        for code in DecodeError::CODES {
            assert!(text.contains(code), "{code} not listed in: {text}");
        }
        let parsed = Cli::try_parse_from([
            "history-service",
            "dead-letters",
            "replay",
            "--reason",
            "too_large",
        ]);
        assert!(parsed.is_ok(), "{parsed:?}");
    }
}
