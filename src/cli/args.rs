//! The command line's arguments: what clap parses, and nothing it runs.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::store::dead_letters::DeadLetterFilter;

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
        /// Longest the whole replay waits for the broker to confirm the letters; those not
        /// confirmed by then are not marked replayed, and the command exits 2.
        #[arg(long, value_name = "SECONDS", default_value_t = 30,
              value_parser = clap::value_parser!(u64).range(1..))]
        timeout: u64,
    },
    /// Publish the dead letters still waiting for `dead_letter.topic` now (the service's relay
    /// retries them anyway); exits 1 if some still fail, with the reason stored on each.
    Publish,
    /// Set aside an event the database rejects, which holds its partition at its offset: the
    /// replica retrying it stores it as a dead letter (reason set_aside, its own bytes) at its
    /// next retry, and the partition moves on. Nothing to stop; `replay` can bring it back once
    /// the database takes it. Exits 0 once a replica set it aside, 1 if the offset is not a
    /// stuck event (saying what it is) or no replica answered within --wait.
    SetAside {
        /// The stuck event's topic.
        #[arg(long)]
        topic: String,
        /// Its partition.
        #[arg(long)]
        partition: i32,
        /// Its offset (the service's ERROR line and `history_stuck_event` name it).
        #[arg(long)]
        offset: i64,
        /// Why, kept with the letter.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// How long to wait for the replica's answer; 0 asks and returns.
        #[arg(long, value_name = "SECONDS", default_value_t = 60)]
        wait: u64,
    },
}

#[derive(Debug, clap::Args)]
pub struct DeadLetterSelection {
    /// Only letters from this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only letters from this partition.
    #[arg(long)]
    pub partition: Option<i32>,
    /// Only the letter at this offset of `--partition` (required with it: an offset names a
    /// record only within one partition, and one topic when letters of several are stored).
    #[arg(long, requires = "partition")]
    pub offset: Option<i64>,
    /// Only letters with this reason code (not_json, missing_field, bad_timestamp, ...,
    /// conflicting_duplicate).
    #[arg(
        long,
        value_name = "CODE",
        value_parser = clap::builder::PossibleValuesParser::new(
            crate::domain::values::dead_letter_reasons()
        ),
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
    pub(super) fn filter(&self) -> DeadLetterFilter {
        DeadLetterFilter {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            reason_code: self.reason.clone(),
            include_replayed: self.include_replayed,
            limit: self.limit,
        }
    }

    pub(super) fn narrows(&self) -> bool {
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
    /// Check the database alone: skip the check that the newest records below the group's
    /// committed offsets are in it (which needs the Kafka cluster).
    #[arg(long)]
    pub no_kafka: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DecodeError, Field};

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
        for code in crate::domain::values::dead_letter_reasons() {
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
