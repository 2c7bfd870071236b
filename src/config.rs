//! Configuration: the built-in defaults (`config/default.toml`), an optional file, then
//! `HISTORY__SECTION__KEY` environment variables, validated once at start-up.
//!
//! Secrets (the database password, Kafka SASL/SSL properties) are held as [`SecretString`] and
//! never printed: errors name the key and the reason, never the value.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::domain::budget::{MIN_BUDGET_BYTES, Split};

mod strict;

/// The defaults, built in so the binary needs no file to start.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// The prefix of environment overrides: `HISTORY__DATABASE__URL` sets `database.url`.
pub const ENV_PREFIX: &str = "HISTORY";

/// A configuration the service cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration: {0}")]
    Load(String),
    #[error("invalid configuration key `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
    /// A pass-through librdkafka property, named as configured
    /// (`kafka.properties.sasl.password`); the reason never carries its value.
    #[error("invalid configuration key `{key}`: {reason}")]
    InvalidProperty { key: String, reason: String },
}

impl ConfigError {
    fn invalid(key: &'static str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key,
            reason: reason.into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub kafka: KafkaSettings,
    pub pipeline: PipelineSettings,
    pub http: HttpSettings,
    pub log: LogSettings,
    pub dead_letter: DeadLetterSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterSettings {
    /// Kafka topic each dead letter is also published to; empty for none.
    pub topic: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    pub url: SecretString,
    pub password: SecretString,
    pub password_file: String,
    pub tls_ca_file: String,
    #[serde(deserialize_with = "strict::integer")]
    pub pool_size: u32,
    #[serde(deserialize_with = "strict::integer")]
    pub connect_timeout_ms: u64,
    /// Longest one write transaction may take, client side (the transaction is abandoned and
    /// its connection closed) and server side (`statement_timeout` of pooled sessions).
    #[serde(deserialize_with = "strict::integer")]
    pub statement_timeout_ms: u64,
    /// The server's `idle_in_transaction_session_timeout` for pooled sessions: a session left
    /// inside a transaction (its client frozen or gone) is ended and its locks released.
    #[serde(deserialize_with = "strict::integer")]
    pub idle_in_transaction_timeout_ms: u64,
    /// TCP keepalive of every connection: first probe after this long idle,
    #[serde(deserialize_with = "strict::integer")]
    pub keepalives_idle_ms: u64,
    /// then one probe per this interval,
    #[serde(deserialize_with = "strict::integer")]
    pub keepalives_interval_ms: u64,
    /// and the connection is dropped after this many unanswered probes.
    #[serde(deserialize_with = "strict::integer")]
    pub keepalives_retries: u32,
    /// Data sent and not acknowledged for this long drops the connection (`TCP_USER_TIMEOUT`).
    #[serde(deserialize_with = "strict::integer")]
    pub tcp_user_timeout_ms: u64,
    pub migrate_on_start: bool,
    /// Longest one attempt at applying the migrations may take (waiting for another replica's
    /// migration lock included), client side: a hung connection then gives way to a new
    /// attempt on a fresh one.
    #[serde(deserialize_with = "strict::integer")]
    pub migration_timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub brokers: String,
    pub group_id: String,
    pub topics: Vec<String>,
    pub client_id: String,
    /// The consumer group protocol: Kafka's `classic` one, or KIP-848's `consumer` (the broker
    /// assigns partitions; Kafka 4.0 and later).
    #[serde(deserialize_with = "strict::choice")]
    pub group_protocol: GroupProtocol,
    /// The broker's assignor under the `consumer` protocol (`uniform`, `range`); empty for the
    /// broker's default. Refused under `classic`.
    pub remote_assignor: String,
    /// A stable id of this replica in its group (KIP-345 static membership); empty for a
    /// dynamic member.
    pub group_instance_id: String,
    /// The classic protocol's session timeout. Optional so that setting it under the `consumer`
    /// protocol (where the broker owns it) is told apart from the default and refused.
    #[serde(default, deserialize_with = "strict::optional_integer")]
    pub session_timeout_ms: Option<u64>,
    /// How often the client refreshes topic metadata (`topic.metadata.refresh.interval.ms`):
    /// the bound on how soon a topic created later, or partitions added to one, are consumed.
    #[serde(deserialize_with = "strict::integer")]
    pub metadata_refresh_ms: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub revoke_timeout_ms: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub statistics_interval_ms: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub fetch_wait_max_ms: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub fetch_queue_kbytes: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub fetch_queue_messages: u64,
    /// The most a record batch of the consumed topics decompresses by: fetch requests are sized
    /// so that a response from every broker, decompressed, fits in the client's share of the
    /// budget even at this ratio (`history_fetch_compression_ratio` shows the topics' own).
    #[serde(deserialize_with = "strict::integer")]
    pub max_compression_ratio: u64,
    /// Repeats of one client error within this long are summarised in one line.
    #[serde(deserialize_with = "strict::integer")]
    pub error_log_interval_ms: u64,
    /// The most each commit's metadata may hold of the list of offsets above its position that
    /// are done (`offsets::done`); the brokers' `offset.metadata.max.bytes` bounds it. 0: none
    /// written, none read.
    #[serde(deserialize_with = "strict::integer")]
    pub commit_metadata_max_bytes: u64,
    /// librdkafka properties passed through verbatim; values may be secrets.
    #[serde(default)]
    pub properties: BTreeMap<String, SecretString>,
    /// librdkafka properties whose values are read from files.
    #[serde(default)]
    pub property_files: BTreeMap<String, String>,
}

/// The consumer group protocol (`kafka.group_protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupProtocol {
    /// Kafka's original protocol: the group's leader assigns, the members rebalance together
    /// (cooperatively by default).
    Classic,
    /// KIP-848 (GA in Kafka 4.0): the broker assigns, each member reconciles on its own
    /// heartbeat; the session timeout, heartbeat interval and assignor are the broker's.
    Consumer,
}

impl strict::Choice for GroupProtocol {
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("classic", GroupProtocol::Classic),
        ("consumer", GroupProtocol::Consumer),
    ];
}

impl GroupProtocol {
    /// The name librdkafka's `group.protocol` and the metrics use.
    pub fn name(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }
}

/// The session timeout of the classic protocol when `kafka.session_timeout_ms` is not set.
pub const DEFAULT_SESSION_TIMEOUT_MS: u64 = 10_000;

/// librdkafka properties the `consumer` protocol refuses (the broker owns them), with what to
/// do instead.
const NOT_UNDER_CONSUMER: [(&str, &str); 4] = [
    (
        "session.timeout.ms",
        "the broker sets it (group.consumer.session.timeout.ms)",
    ),
    (
        "heartbeat.interval.ms",
        "the broker sets it (group.consumer.heartbeat.interval.ms)",
    ),
    (
        "partition.assignment.strategy",
        "the broker assigns; choose its assignor with kafka.remote_assignor",
    ),
    ("group.protocol.type", "it belongs to the classic protocol"),
];

/// Why a pass-through librdkafka property is refused.
#[derive(Debug, Clone, Copy)]
enum Guarded {
    /// The service sets it from a key of its own (checked at start-up): set that instead.
    Own(&'static str),
    /// The service sets it, for the reason given.
    Set(&'static str),
    /// Only these values keep an offset guard on; any other is refused for the reason given.
    Only(&'static [&'static str], &'static str),
}

/// What the budget sets the prefetch's sizes from.
const FROM_THE_BUDGET: &str = "pipeline.max_in_flight_bytes (with kafka.max_compression_ratio)";

/// Pass-through properties that would override a setting of the service's own or switch one of
/// its offset guards off; refused at start-up, naming what to do instead.
const GUARDED: [(&str, Guarded); 26] = [
    ("bootstrap.servers", Guarded::Own("kafka.brokers")),
    ("metadata.broker.list", Guarded::Own("kafka.brokers")),
    ("group.id", Guarded::Own("kafka.group_id")),
    ("client.id", Guarded::Own("kafka.client_id")),
    ("group.protocol", Guarded::Own("kafka.group_protocol")),
    (
        "group.remote.assignor",
        Guarded::Own("kafka.remote_assignor"),
    ),
    ("group.instance.id", Guarded::Own("kafka.group_instance_id")),
    (
        "topic.metadata.refresh.interval.ms",
        Guarded::Own("kafka.metadata_refresh_ms"),
    ),
    (
        "statistics.interval.ms",
        Guarded::Own("kafka.statistics_interval_ms"),
    ),
    ("fetch.wait.max.ms", Guarded::Own("kafka.fetch_wait_max_ms")),
    (
        "queued.max.messages.kbytes",
        Guarded::Own("kafka.fetch_queue_kbytes"),
    ),
    (
        "queued.min.messages",
        Guarded::Own("kafka.fetch_queue_messages"),
    ),
    ("fetch.max.bytes", Guarded::Own(FROM_THE_BUDGET)),
    ("max.partition.fetch.bytes", Guarded::Own(FROM_THE_BUDGET)),
    ("fetch.message.max.bytes", Guarded::Own(FROM_THE_BUDGET)),
    ("message.max.bytes", Guarded::Own(FROM_THE_BUDGET)),
    ("receive.message.max.bytes", Guarded::Own(FROM_THE_BUDGET)),
    (
        "auto.commit.interval.ms",
        Guarded::Own("pipeline.commit_interval_ms"),
    ),
    (
        "fetch.queue.backoff.ms",
        Guarded::Set(
            "the service sets it so that a backlog is fetched again as soon as the prefetch \
             queue has room",
        ),
    ),
    (
        "enable.auto.commit",
        Guarded::Set(
            "the service commits only positions whose records are written; librdkafka's own \
             commits would cover records not written yet, lost after a crash",
        ),
    ),
    (
        "auto.commit.enable",
        Guarded::Set(
            "the service commits only positions whose records are written; librdkafka's own \
             commits would cover records not written yet, lost after a crash",
        ),
    ),
    (
        "enable.auto.offset.store",
        Guarded::Set(
            "the service stores only positions whose records are written; offsets stored as \
             records are handed out would be committed past records not written yet",
        ),
    ),
    (
        "offset.store.method",
        Guarded::Set("offsets are kept by the brokers, committed by the service"),
    ),
    (
        "enable.partition.eof",
        Guarded::Set("the service reads each partition as a stream without an end"),
    ),
    (
        "isolation.level",
        Guarded::Only(
            &["read_committed"],
            "read_uncommitted would record the events of aborted producer transactions: \
             events that never happened",
        ),
    ),
    (
        "auto.offset.reset",
        Guarded::Only(
            &["earliest", "smallest", "beginning"],
            "a projection starts from the earliest record: a new group would skip the history \
             it has not read (latest), or stop consuming (error)",
        ),
    ),
];

/// Properties the classic protocol's settings derive, refused under it.
const SET_UNDER_CLASSIC: [(&str, Guarded); 2] = [
    (
        "session.timeout.ms",
        Guarded::Own("kafka.session_timeout_ms"),
    ),
    (
        "heartbeat.interval.ms",
        Guarded::Set("the service sets it to a third of kafka.session_timeout_ms (at most 3 s)"),
    ),
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSettings {
    #[serde(deserialize_with = "strict::integer")]
    pub writers: usize,
    #[serde(deserialize_with = "strict::integer")]
    pub batch_max_events: usize,
    #[serde(deserialize_with = "strict::integer")]
    pub batch_linger_ms: u64,
    /// How long a full batch's transaction is aimed to last (0: not aimed) — see
    /// `src/domain/batch_size.rs`.
    #[serde(deserialize_with = "strict::integer")]
    pub batch_aim_ms: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub max_in_flight_per_partition: usize,
    /// Records held in all partitions together before the service stops taking more from the
    /// Kafka client (which then keeps what it prefetched).
    #[serde(deserialize_with = "strict::integer")]
    pub max_in_flight: usize,
    /// The instance's memory for fetched records, in bytes: half for what the service holds,
    /// half for the Kafka client's prefetch ([`PipelineSettings::budget`]).
    #[serde(deserialize_with = "strict::integer")]
    pub max_in_flight_bytes: usize,
    #[serde(deserialize_with = "strict::integer")]
    pub commit_interval_ms: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub retry_initial_ms: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub retry_max_ms: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub shutdown_timeout_ms: u64,
    #[serde(deserialize_with = "strict::integer")]
    pub max_payload_bytes: usize,
    /// How long every write may keep failing before `/readyz` says the service is not ready.
    #[serde(deserialize_with = "strict::integer")]
    pub unready_after_failing_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub listen: String,
    pub enabled: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

impl strict::Choice for LogFormat {
    const CHOICES: &'static [(&'static str, Self)] =
        &[("human", LogFormat::Human), ("json", LogFormat::Json)];
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    #[serde(deserialize_with = "strict::choice")]
    pub format: LogFormat,
    pub filter: String,
}

impl Settings {
    /// Reads the layers and [validates](Settings::validate) the result. `file` is the
    /// `--config` path, if any. The service starts from [`Settings::load`] (defined in `app`),
    /// which also has the database's settings parsed.
    pub fn read(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::read_from(file, None)
    }

    /// Like [`Settings::read`], with the environment given explicitly (tests).
    pub fn read_from(
        file: Option<&Path>,
        environment: Option<std::collections::HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let mut builder = config::Config::builder().add_source(config::File::from_str(
            DEFAULT_TOML,
            config::FileFormat::Toml,
        ));
        if let Some(path) = file {
            if path.is_dir() {
                return Err(ConfigError::Load(format!(
                    "configuration file {} is a directory",
                    path.display()
                )));
            }
            if !path.is_file() {
                return Err(ConfigError::Load(format!(
                    "configuration file {} does not exist",
                    path.display()
                )));
            }
            builder = builder.add_source(config::File::from(path.to_path_buf()).required(true));
        }
        match &environment {
            Some(variables) => property_variables(variables.keys().map(String::as_str))?,
            None => {
                let names: Vec<String> = std::env::vars_os()
                    .filter_map(|(name, _)| name.into_string().ok())
                    .collect();
                property_variables(names.iter().map(String::as_str))?
            }
        }
        builder = builder.add_source(
            config::Environment::with_prefix(ENV_PREFIX)
                .separator("__")
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("kafka.topics")
                .source(environment),
        );
        let raw = builder
            .build()
            .map_err(|err| ConfigError::Load(err.to_string()))?;
        let mut settings: Settings = raw.try_deserialize().map_err(|err| {
            let text = err.to_string();
            if text.contains("invalid type: map") && text.contains("kafka.propert") {
                // `[kafka.properties.security] protocol = …`: a dotted name read as tables.
                ConfigError::Load(format!(
                    "{text}: a librdkafka property is one key, its name quoted \
                     (\"security.protocol\" = \"SASL_SSL\" under [kafka.properties]), or from \
                     the environment with one underscore for each dot \
                     (HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL)"
                ))
            } else {
                ConfigError::Load(text)
            }
        })?;
        settings.kafka.properties = normalize_properties(settings.kafka.properties);
        for topic in &mut settings.kafka.topics {
            *topic = topic.trim().to_owned();
        }
        settings.kafka.property_files = settings
            .kafka
            .property_files
            .into_iter()
            .map(|(key, path)| (key.replace('_', "."), path))
            .collect();
        settings.validate()?;
        Ok(settings)
    }

    /// Checks every value the types alone do not constrain, except the database's URL and
    /// password file: PostgreSQL's details are the store's (`store::target`), and
    /// [`Settings::load`] has them checked there.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.database.pool_size as usize <= self.pipeline.writers {
            return Err(ConfigError::invalid(
                "database.pool_size",
                format!(
                    "must be greater than pipeline.writers ({}): each writer holds a connection",
                    self.pipeline.writers
                ),
            ));
        }
        bounded_ms(
            "database.connect_timeout_ms",
            self.database.connect_timeout_ms,
            1,
            HOUR_MS,
        )?;
        self.database.validate_limits()?;

        let kafka = &self.kafka;
        validate_brokers(&kafka.brokers)?;
        if kafka.group_id.trim().is_empty() {
            return Err(ConfigError::invalid("kafka.group_id", "must not be empty"));
        }
        if kafka.topics.is_empty() {
            return Err(ConfigError::invalid(
                "kafka.topics",
                "must list at least one topic",
            ));
        }
        for topic in &kafka.topics {
            validate_topic(topic)?;
        }
        kafka.validate_group()?;
        kafka.validate_prefetch(&self.pipeline)?;
        bounded_ms(
            "kafka.revoke_timeout_ms",
            kafka.revoke_timeout_ms,
            1,
            10 * MINUTE_MS,
        )?;
        bounded_ms(
            "kafka.error_log_interval_ms",
            kafka.error_log_interval_ms,
            1,
            DAY_MS,
        )?;
        if !(kafka.commit_metadata_max_bytes == 0
            || (64..=1 << 20).contains(&kafka.commit_metadata_max_bytes))
        {
            return Err(ConfigError::invalid(
                "kafka.commit_metadata_max_bytes",
                format!(
                    "{} is neither 0 (no lists of done offsets) nor in 64..=1048576 (at most \
                     the brokers' offset.metadata.max.bytes, 4096 by default)",
                    kafka.commit_metadata_max_bytes
                ),
            ));
        }
        bounded_ms(
            "kafka.statistics_interval_ms",
            kafka.statistics_interval_ms,
            0,
            DAY_MS,
        )?;
        // librdkafka's own range.
        bounded_ms(
            "kafka.fetch_wait_max_ms",
            kafka.fetch_wait_max_ms,
            0,
            300_000,
        )?;

        let pipeline = &self.pipeline;
        in_range("pipeline.writers", pipeline.writers, 1, 256)?;
        in_range(
            "pipeline.batch_max_events",
            pipeline.batch_max_events,
            1,
            50_000,
        )?;
        in_range(
            "pipeline.max_in_flight_per_partition",
            pipeline.max_in_flight_per_partition,
            1,
            10_000_000,
        )?;
        in_range(
            "pipeline.max_in_flight",
            pipeline.max_in_flight,
            1,
            100_000_000,
        )?;
        in_range(
            "pipeline.max_in_flight_bytes",
            pipeline.max_in_flight_bytes,
            MIN_BUDGET_BYTES,
            1 << 40,
        )?;
        bounded_ms(
            "pipeline.batch_linger_ms",
            pipeline.batch_linger_ms,
            0,
            MINUTE_MS,
        )?;
        bounded_ms("pipeline.batch_aim_ms", pipeline.batch_aim_ms, 0, MINUTE_MS)?;
        bounded_ms(
            "pipeline.commit_interval_ms",
            pipeline.commit_interval_ms,
            1,
            HOUR_MS,
        )?;
        bounded_ms(
            "pipeline.retry_initial_ms",
            pipeline.retry_initial_ms,
            1,
            HOUR_MS,
        )?;
        if pipeline.retry_max_ms < pipeline.retry_initial_ms {
            return Err(ConfigError::invalid(
                "pipeline.retry_max_ms",
                "must not be less than pipeline.retry_initial_ms",
            ));
        }
        bounded_ms("pipeline.retry_max_ms", pipeline.retry_max_ms, 1, HOUR_MS)?;
        bounded_ms(
            "pipeline.shutdown_timeout_ms",
            pipeline.shutdown_timeout_ms,
            1,
            HOUR_MS,
        )?;
        in_range(
            "pipeline.max_payload_bytes",
            pipeline.max_payload_bytes,
            64,
            64 << 20,
        )?;
        bounded_ms(
            "pipeline.unready_after_failing_ms",
            pipeline.unready_after_failing_ms,
            1,
            DAY_MS,
        )?;

        self.http.listen_addr()?;
        if self
            .log
            .filter
            .parse::<tracing_subscriber::EnvFilter>()
            .is_err()
        {
            return Err(ConfigError::invalid(
                "log.filter",
                "not a valid tracing filter",
            ));
        }
        Ok(())
    }
}

const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 60 * MINUTE_MS;
const DAY_MS: u64 = 24 * HOUR_MS;

/// Kafka's rule for a topic's name: 1 to 249 of a-z, A-Z, 0-9, '.', '_' and '-', and not `.`
/// or `..`. (Names are trimmed before: a list from the environment is often written with a
/// space after its commas.)
fn validate_topic(topic: &str) -> Result<(), ConfigError> {
    let valid = !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if valid {
        return Ok(());
    }
    Err(ConfigError::invalid(
        "kafka.topics",
        format!(
            "`{topic}` is not a Kafka topic name: 1 to 249 of a-z, A-Z, 0-9, '.', '_' and '-' \
             (not `.` or `..`)"
        ),
    ))
}

fn bounded_ms(key: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if !(min..=max).contains(&value) {
        return Err(ConfigError::invalid(
            key,
            format!("{value} is out of range {min}..={max}"),
        ));
    }
    Ok(())
}

fn in_range(key: &'static str, value: usize, min: usize, max: usize) -> Result<(), ConfigError> {
    if !(min..=max).contains(&value) {
        return Err(ConfigError::invalid(
            key,
            format!("{value} is out of range {min}..={max}"),
        ));
    }
    Ok(())
}

/// `host:port` entries separated by commas, as librdkafka's `bootstrap.servers` takes them
/// (an IPv6 address in brackets: `[::1]:9092`). librdkafka itself accepts nonsense here and
/// then retries it forever, so it is checked before it gets there.
fn validate_brokers(brokers: &str) -> Result<(), ConfigError> {
    let invalid = |reason: String| ConfigError::invalid("kafka.brokers", reason);
    let entries: Vec<&str> = brokers.split(',').map(str::trim).collect();
    if entries.iter().all(|entry| entry.is_empty()) {
        return Err(invalid("must name at least one broker".to_owned()));
    }
    for (index, entry) in entries.iter().enumerate() {
        let position = index + 1;
        if entry.is_empty() {
            return Err(invalid(format!("entry {position} is empty")));
        }
        // librdkafka accepts an optional scheme prefix (`PLAINTEXT://host:port`).
        let address = entry.split_once("://").map_or(*entry, |(_, rest)| rest);
        let (host, port) = if let Some(bracketed) = address.strip_prefix('[') {
            let Some((host, rest)) = bracketed.split_once(']') else {
                return Err(invalid(format!(
                    "entry {position} `{entry}`: an IPv6 address needs its closing `]`"
                )));
            };
            (host, rest.strip_prefix(':'))
        } else {
            match address.rsplit_once(':') {
                Some((host, _)) if host.contains(':') => {
                    return Err(invalid(format!(
                        "entry {position} `{entry}`: write an IPv6 address in brackets, e.g. \
                         [::1]:9092"
                    )));
                }
                Some((host, port)) => (host, Some(port)),
                None => (address, None),
            }
        };
        if host.is_empty() {
            return Err(invalid(format!("entry {position} `{entry}` has no host")));
        }
        match port {
            None => {
                return Err(invalid(format!(
                    "entry {position} `{entry}` has no port: expected HOST:PORT"
                )));
            }
            Some(port) if port.parse::<u16>().map_or(true, |port| port == 0) => {
                return Err(invalid(format!(
                    "entry {position} `{entry}`: the port must be a number from 1 to 65535"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// An environment variable for a librdkafka property takes one underscore for each dot of the
/// property's name (`HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL`); a double one, as every
/// other key takes, would be read as a table and refused with a baffling type error — so it
/// is refused here, with the right spelling.
fn property_variables<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), ConfigError> {
    for name in names {
        for section in ["PROPERTIES", "PROPERTY_FILES"] {
            let prefix = format!("{ENV_PREFIX}__KAFKA__{section}__");
            let Some(property) = name
                .get(..prefix.len())
                .filter(|head| head.eq_ignore_ascii_case(&prefix))
                .map(|_| &name[prefix.len()..])
            else {
                continue;
            };
            if property.contains("__") {
                let right = format!("{prefix}{}", property.replace("__", "_"));
                return Err(ConfigError::InvalidProperty {
                    key: name.to_owned(),
                    reason: format!(
                        "a librdkafka property takes one underscore for each dot of its name: \
                         write {right} (for {})",
                        property
                            .replace("__", "_")
                            .replace('_', ".")
                            .to_ascii_lowercase()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Environment variables cannot carry dots, so `HISTORY__KAFKA__PROPERTIES__SASL_PASSWORD`
/// arrives as `sasl_password`; librdkafka property names never contain `_`, so map it back.
fn normalize_properties(
    properties: BTreeMap<String, SecretString>,
) -> BTreeMap<String, SecretString> {
    properties
        .into_iter()
        .map(|(key, value)| (key.replace('_', "."), value))
        .collect()
}

/// The longest deadline PostgreSQL takes in milliseconds (its settings are 32-bit integers).
const POSTGRES_MAX_MS: u64 = i32::MAX as u64;

impl DatabaseSettings {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub fn statement_timeout(&self) -> Duration {
        Duration::from_millis(self.statement_timeout_ms)
    }

    pub fn migration_timeout(&self) -> Duration {
        Duration::from_millis(self.migration_timeout_ms)
    }

    pub fn idle_in_transaction_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_in_transaction_timeout_ms)
    }

    pub fn keepalives_idle(&self) -> Duration {
        Duration::from_millis(self.keepalives_idle_ms)
    }

    pub fn keepalives_interval(&self) -> Duration {
        Duration::from_millis(self.keepalives_interval_ms)
    }

    pub fn tcp_user_timeout(&self) -> Duration {
        Duration::from_millis(self.tcp_user_timeout_ms)
    }

    /// Every wait on the database is bounded: none of these may be 0 (which PostgreSQL and the
    /// kernel read as "no limit"), and each must be one its receiver can hold.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        let bounded = |key: &'static str, value: u64, min: u64, max: u64, unit: &str| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(ConfigError::invalid(
                    key,
                    format!("{value} is out of range {min}..={max}{unit}"),
                ))
            }
        };
        bounded(
            "database.statement_timeout_ms",
            self.statement_timeout_ms,
            1,
            POSTGRES_MAX_MS,
            " (0 would mean no deadline)",
        )?;
        bounded(
            "database.migration_timeout_ms",
            self.migration_timeout_ms,
            1,
            u64::from(u32::MAX),
            " (0 would mean no deadline)",
        )?;
        bounded(
            "database.idle_in_transaction_timeout_ms",
            self.idle_in_transaction_timeout_ms,
            1,
            POSTGRES_MAX_MS,
            " (0 would mean no deadline)",
        )?;
        // The kernel counts keepalive times in whole seconds.
        bounded(
            "database.keepalives_idle_ms",
            self.keepalives_idle_ms,
            1000,
            POSTGRES_MAX_MS,
            " (the kernel counts whole seconds)",
        )?;
        bounded(
            "database.keepalives_interval_ms",
            self.keepalives_interval_ms,
            1000,
            POSTGRES_MAX_MS,
            " (the kernel counts whole seconds)",
        )?;
        bounded(
            "database.keepalives_retries",
            u64::from(self.keepalives_retries),
            1,
            127,
            "",
        )?;
        bounded(
            "database.tcp_user_timeout_ms",
            self.tcp_user_timeout_ms,
            1,
            u64::from(u32::MAX),
            " (0 would mean the kernel's default, minutes)",
        )?;
        Ok(())
    }
}

impl KafkaSettings {
    /// The pass-through librdkafka properties, with those kept in files read in.
    pub fn librdkafka_properties(&self) -> Result<BTreeMap<String, SecretString>, ConfigError> {
        let mut properties = self.properties.clone();
        for (key, path) in &self.property_files {
            let value = std::fs::read_to_string(path).map_err(|err| {
                ConfigError::invalid(
                    "kafka.property_files",
                    format!("cannot read {path} for `{key}`: {err}"),
                )
            })?;
            properties.insert(
                key.clone(),
                SecretString::from(value.trim_end_matches(['\r', '\n']).to_owned()),
            );
        }
        Ok(properties)
    }

    /// Every configured property value: what an error message about a Kafka client must never
    /// show.
    pub fn property_values(&self) -> Vec<SecretString> {
        match self.librdkafka_properties() {
            Ok(properties) => properties.into_values().collect(),
            Err(_) => self.properties.values().cloned().collect(),
        }
    }

    /// The classic protocol's session timeout: the configured one or the default. (Under the
    /// `consumer` protocol the broker's applies; validation refuses a configured one.)
    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(
            self.session_timeout_ms
                .unwrap_or(DEFAULT_SESSION_TIMEOUT_MS),
        )
    }

    /// Whether this replica is a static member of its group (`kafka.group_instance_id`).
    pub fn is_static_member(&self) -> bool {
        !self.group_instance_id.is_empty()
    }

    /// Checks the group settings against the chosen protocol: a setting that does not apply
    /// to it is refused, naming the key and why, rather than dropped.
    fn validate_group(&self) -> Result<(), ConfigError> {
        let passed_through = |key: &str| {
            if self.property_files.contains_key(key) {
                Some(format!("kafka.property_files.{key}"))
            } else if self.properties.contains_key(key) {
                Some(format!("kafka.properties.{key}"))
            } else {
                None
            }
        };
        let classic = match self.group_protocol {
            GroupProtocol::Classic => &SET_UNDER_CLASSIC[..],
            GroupProtocol::Consumer => &[],
        };
        for (property, guard) in GUARDED.iter().chain(classic) {
            let Some(key) = passed_through(property) else {
                continue;
            };
            let reason = match *guard {
                Guarded::Own(own) => format!("set it with `{own}`, which is checked at start-up"),
                Guarded::Set(why) => format!("the service sets this itself: {why}; remove it"),
                Guarded::Only(allowed, why) => {
                    let value = self.properties.get(*property).map(|value| {
                        secrecy::ExposeSecret::expose_secret(value)
                            .trim()
                            .to_ascii_lowercase()
                    });
                    if value.is_some_and(|value| allowed.contains(&value.as_str())) {
                        continue;
                    }
                    format!("only {} is accepted: {why}", allowed.join(" or "))
                }
            };
            return Err(ConfigError::InvalidProperty { key, reason });
        }
        match self.group_protocol {
            GroupProtocol::Classic => {
                if !self.remote_assignor.is_empty() {
                    return Err(ConfigError::invalid(
                        "kafka.remote_assignor",
                        "applies only to kafka.group_protocol = \"consumer\" (under \"classic\" \
                         the group's leader assigns: partition.assignment.strategy)",
                    ));
                }
                if let Some(timeout) = self.session_timeout_ms {
                    bounded_ms("kafka.session_timeout_ms", timeout, 1, i32::MAX as u64)?;
                }
            }
            GroupProtocol::Consumer => {
                if self.session_timeout_ms.is_some() {
                    return Err(ConfigError::invalid(
                        "kafka.session_timeout_ms",
                        "does not apply to kafka.group_protocol = \"consumer\": the broker sets \
                         the session timeout (group.consumer.session.timeout.ms); remove it",
                    ));
                }
                for (property, why) in NOT_UNDER_CONSUMER {
                    if let Some(key) = passed_through(property) {
                        return Err(ConfigError::InvalidProperty {
                            key,
                            reason: format!(
                                "does not apply to kafka.group_protocol = \"consumer\": {why}"
                            ),
                        });
                    }
                }
                if self.remote_assignor.trim() != self.remote_assignor
                    || self.remote_assignor.contains(char::is_whitespace)
                {
                    return Err(ConfigError::invalid(
                        "kafka.remote_assignor",
                        "must be an assignor's name (e.g. uniform, range), or empty for the \
                         broker's default",
                    ));
                }
            }
        }
        // Kafka's rule for group.instance.id: at most 249 of [a-zA-Z0-9._-].
        if self.group_instance_id.len() > 249
            || !self
                .group_instance_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(ConfigError::invalid(
                "kafka.group_instance_id",
                "must be at most 249 characters of a-z, A-Z, 0-9, '.', '_' and '-' (a pod name \
                 is), or empty for a dynamic member",
            ));
        }
        bounded_ms(
            "kafka.metadata_refresh_ms",
            self.metadata_refresh_ms,
            1000,
            3_600_000,
        )?;
        Ok(())
    }

    /// The prefetch settings: librdkafka's queue may be given explicitly, but only within the
    /// client's share of the budget, which the fetch sizing relies on.
    fn validate_prefetch(&self, pipeline: &PipelineSettings) -> Result<(), ConfigError> {
        let split = pipeline.budget();
        if self.fetch_queue_kbytes > split.queue_kbytes as u64 {
            return Err(ConfigError::invalid(
                "kafka.fetch_queue_kbytes",
                format!(
                    "{} KiB is more than the Kafka client's queue may hold within \
                     pipeline.max_in_flight_bytes (a quarter of it: {} KiB); raise \
                     pipeline.max_in_flight_bytes instead, or leave it 0",
                    self.fetch_queue_kbytes, split.queue_kbytes
                ),
            ));
        }
        if self.fetch_queue_messages > pipeline.max_in_flight as u64 {
            return Err(ConfigError::invalid(
                "kafka.fetch_queue_messages",
                format!(
                    "{} records is more than the whole budget in records \
                     (pipeline.max_in_flight = {}); raise that instead, or leave it 0",
                    self.fetch_queue_messages, pipeline.max_in_flight
                ),
            ));
        }
        bounded_ms(
            "kafka.max_compression_ratio",
            self.max_compression_ratio,
            1,
            1000,
        )
    }

    pub fn metadata_refresh(&self) -> Duration {
        Duration::from_millis(self.metadata_refresh_ms)
    }

    pub fn revoke_timeout(&self) -> Duration {
        Duration::from_millis(self.revoke_timeout_ms)
    }

    pub fn error_log_interval(&self) -> Duration {
        Duration::from_millis(self.error_log_interval_ms)
    }
}

/// `text` without any of `secrets`: each occurrence becomes `***`. Values shorter than four
/// characters (a number, a flag) are cut only where quoted, as librdkafka quotes the values it
/// rejects: cutting every `1` out of a message would leave it unreadable.
pub fn redact<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    const SHORTEST_ANYWHERE: usize = 4;
    let mut text = text.to_owned();
    for secret in secrets {
        if secret.is_empty() {
            continue;
        }
        let cut = if secret.len() >= SHORTEST_ANYWHERE {
            secret.to_owned()
        } else {
            format!("\"{secret}\"")
        };
        let replacement = if cut.starts_with('"') {
            "\"***\""
        } else {
            "***"
        };
        text = text.replace(&cut, replacement);
        if text.contains(&cut) {
            // Cutting made a new occurrence (a secret of asterisks): keep nothing.
            return "(message withheld: it would show a configured value)".to_owned();
        }
    }
    text
}

impl PipelineSettings {
    /// The budget for fetched records, split between the service and the Kafka client.
    pub fn budget(&self) -> Split {
        Split::of(self.max_in_flight, self.max_in_flight_bytes)
    }

    pub fn batch_linger(&self) -> Duration {
        Duration::from_millis(self.batch_linger_ms)
    }

    /// How long a full batch's transaction is aimed to last; `None` when not aimed (0).
    pub fn batch_aim(&self) -> Option<Duration> {
        (self.batch_aim_ms > 0).then(|| Duration::from_millis(self.batch_aim_ms))
    }

    pub fn commit_interval(&self) -> Duration {
        Duration::from_millis(self.commit_interval_ms)
    }

    pub fn retry_initial(&self) -> Duration {
        Duration::from_millis(self.retry_initial_ms)
    }

    pub fn retry_max(&self) -> Duration {
        Duration::from_millis(self.retry_max_ms)
    }

    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }

    pub fn unready_after_failing(&self) -> Duration {
        Duration::from_millis(self.unready_after_failing_ms)
    }
}

impl HttpSettings {
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen.parse().map_err(|err| {
            ConfigError::invalid(
                "http.listen",
                format!("{err}: expected HOST:PORT, e.g. 127.0.0.1:9464"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Write;

    use secrecy::ExposeSecret;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn read(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::read_from(None, env(pairs))
    }

    fn invalid_key(result: Result<Settings, ConfigError>) -> &'static str {
        match result {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected an invalid key, got {other:?}"),
        }
    }

    #[test]
    fn the_built_in_defaults_are_valid() {
        let settings = read(&[]).unwrap();
        assert_eq!(settings.kafka.topics, vec!["tickets.status.v1"]);
        assert_eq!(settings.kafka.group_id, "history-service");
        assert_eq!(settings.http.listen, "127.0.0.1:9464");
        assert_eq!(settings.pipeline.writers, 2);
    }

    #[test]
    fn environment_variables_override_the_documented_keys() {
        let settings = read(&[
            (
                "HISTORY__DATABASE__URL",
                "postgres://app@db.internal:6432/hist",
            ),
            ("HISTORY__KAFKA__BROKERS", "k1:9092,k2:9092"),
            ("HISTORY__KAFKA__GROUP_ID", "history-blue"),
            ("HISTORY__KAFKA__TOPICS", "a.v1,b.v1"),
            ("HISTORY__HTTP__LISTEN", "0.0.0.0:9000"),
            ("HISTORY__PIPELINE__WRITERS", "4"),
        ])
        .unwrap();
        assert_eq!(
            settings.database.url.expose_secret(),
            "postgres://app@db.internal:6432/hist"
        );
        assert_eq!(settings.kafka.brokers, "k1:9092,k2:9092");
        assert_eq!(settings.kafka.group_id, "history-blue");
        assert_eq!(settings.kafka.topics, vec!["a.v1", "b.v1"]);
        assert_eq!(settings.http.listen, "0.0.0.0:9000");
        assert_eq!(settings.pipeline.writers, 4);
    }

    #[test]
    fn a_file_overrides_the_defaults_and_the_environment_overrides_the_file() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "[kafka]\ngroup_id = \"from-file\"\nbrokers = \"file:9092\"\n[pipeline]\nwriters = 3"
        )
        .unwrap();
        let settings = Settings::read_from(
            Some(&file.0),
            env(&[("HISTORY__KAFKA__GROUP_ID", "from-env")]),
        )
        .unwrap();
        assert_eq!(settings.kafka.group_id, "from-env");
        assert_eq!(settings.kafka.brokers, "file:9092");
        assert_eq!(settings.pipeline.writers, 3);
        std::fs::remove_file(&file.0).unwrap();
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let err =
            Settings::read_from(Some(Path::new("/nonexistent/history.toml")), None).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/history.toml"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let err = read(&[("HISTORY__PIPELINE__WRITTERS", "4")]).unwrap_err();
        assert!(err.to_string().contains("writters"), "{err}");
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_key() {
        let err = read(&[("HISTORY__PIPELINE__WRITERS", "many")]).unwrap_err();
        assert!(err.to_string().contains("pipeline.writers"), "{err}");
    }

    #[test]
    fn invalid_values_name_the_key_and_the_reason() {
        assert_eq!(
            invalid_key(read(&[("HISTORY__PIPELINE__WRITERS", "0")])),
            "pipeline.writers"
        );
        assert_eq!(
            invalid_key(read(&[("HISTORY__KAFKA__BROKERS", " ")])),
            "kafka.brokers"
        );
        assert_eq!(
            invalid_key(read(&[("HISTORY__KAFKA__GROUP_ID", "")])),
            "kafka.group_id"
        );
        assert_eq!(
            invalid_key(read(&[("HISTORY__HTTP__LISTEN", "nowhere")])),
            "http.listen"
        );
        assert_eq!(
            invalid_key(read(&[
                ("HISTORY__PIPELINE__RETRY_INITIAL_MS", "500"),
                ("HISTORY__PIPELINE__RETRY_MAX_MS", "100"),
            ])),
            "pipeline.retry_max_ms"
        );
        assert_eq!(
            invalid_key(read(&[("HISTORY__DATABASE__POOL_SIZE", "2")])),
            "database.pool_size"
        );
        assert_eq!(
            invalid_key(read(&[("HISTORY__LOG__FILTER", "=[")])),
            "log.filter"
        );
    }

    #[test]
    fn the_password_never_appears_in_debug_output() {
        let settings = read(&[
            (
                "HISTORY__DATABASE__URL",
                "postgres://user:s3cr3tpw@host:5432/db",
            ),
            ("HISTORY__DATABASE__PASSWORD", "p4ssw0rd"),
            ("HISTORY__KAFKA__PROPERTIES__SASL_PASSWORD", "k4fk4pw"),
        ])
        .unwrap();
        let shown = format!("{settings:?}");
        for secret in ["s3cr3tpw", "p4ssw0rd", "k4fk4pw"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }

    #[test]
    fn kafka_properties_from_the_environment_get_their_dots_back() {
        let settings = read(&[
            ("HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL", "SASL_SSL"),
            ("HISTORY__KAFKA__PROPERTIES__SASL_MECHANISMS", "PLAIN"),
        ])
        .unwrap();
        let keys: Vec<&str> = settings
            .kafka
            .properties
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, vec!["sasl.mechanisms", "security.protocol"]);
    }

    #[test]
    fn counts_are_whole_numbers_from_a_file_and_from_the_environment() {
        let mut file = tempfile();
        writeln!(file.1, "[pipeline]\nwriters = 4.5").unwrap();
        let err = Settings::read_from(Some(&file.0), env(&[])).unwrap_err();
        std::fs::remove_file(&file.0).unwrap();
        assert!(err.to_string().contains("pipeline.writers"), "{err}");
        assert!(err.to_string().contains("whole number"), "{err}");
        for (variable, value) in [
            ("HISTORY__PIPELINE__WRITERS", "true"),
            ("HISTORY__PIPELINE__WRITERS", "2.6"),
            ("HISTORY__PIPELINE__SHUTDOWN_TIMEOUT_MS", "1e30"),
            ("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "3000.5"),
        ] {
            let err = read(&[(variable, value)]).unwrap_err();
            assert!(
                err.to_string().contains("whole number"),
                "{variable}={value}: {err}"
            );
        }
        assert_eq!(
            read(&[("HISTORY__PIPELINE__WRITERS", "3")])
                .unwrap()
                .pipeline
                .writers,
            3
        );
    }

    #[test]
    fn absurd_durations_are_refused_naming_the_key() {
        for (variable, key) in [
            (
                "HISTORY__PIPELINE__SHUTDOWN_TIMEOUT_MS",
                "pipeline.shutdown_timeout_ms",
            ),
            (
                "HISTORY__PIPELINE__COMMIT_INTERVAL_MS",
                "pipeline.commit_interval_ms",
            ),
            (
                "HISTORY__PIPELINE__BATCH_LINGER_MS",
                "pipeline.batch_linger_ms",
            ),
            ("HISTORY__PIPELINE__BATCH_AIM_MS", "pipeline.batch_aim_ms"),
            (
                "HISTORY__KAFKA__REVOKE_TIMEOUT_MS",
                "kafka.revoke_timeout_ms",
            ),
            (
                "HISTORY__KAFKA__FETCH_WAIT_MAX_MS",
                "kafka.fetch_wait_max_ms",
            ),
            (
                "HISTORY__DATABASE__CONNECT_TIMEOUT_MS",
                "database.connect_timeout_ms",
            ),
        ] {
            assert_eq!(
                refusal(read(&[(variable, "1000000000000000")])).0,
                key,
                "{variable}"
            );
        }
    }

    #[test]
    fn topic_names_are_trimmed_and_checked_against_kafkas_rules() {
        let settings =
            read(&[("HISTORY__KAFKA__TOPICS", "tickets.status.v1, other_topic")]).unwrap();
        assert_eq!(
            settings.kafka.topics,
            vec!["tickets.status.v1", "other_topic"]
        );
        for bad in [
            "two words",
            "a/b",
            "..",
            &"t".repeat(250),
            "tickets.status.v1,,x",
        ] {
            let (key, reason) = refusal(read(&[("HISTORY__KAFKA__TOPICS", bad)]));
            assert_eq!(key, "kafka.topics", "{bad}");
            assert!(reason.contains("not a Kafka topic name"), "{bad}: {reason}");
        }
    }

    #[test]
    fn a_choice_takes_any_case_and_an_unknown_one_lists_the_choices() {
        let settings = read(&[
            ("HISTORY__KAFKA__GROUP_PROTOCOL", "Consumer"),
            ("HISTORY__LOG__FORMAT", "JSON"),
        ])
        .unwrap();
        assert_eq!(settings.kafka.group_protocol, GroupProtocol::Consumer);
        assert_eq!(settings.log.format, LogFormat::Json);
        let err = read(&[("HISTORY__KAFKA__GROUP_PROTOCOL", "kip848")]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("classic, consumer") && text.contains("kafka.group_protocol"),
            "{text}"
        );
        let err = read(&[("HISTORY__LOG__FORMAT", "xml")]).unwrap_err();
        assert!(err.to_string().contains("human, json"), "{err}");
    }

    #[test]
    fn properties_that_would_switch_a_guard_off_or_override_a_key_are_refused() {
        for (variable, value, key, says) in [
            (
                "ENABLE_AUTO_COMMIT",
                "true",
                "enable.auto.commit",
                "remove it",
            ),
            (
                "ENABLE_AUTO_OFFSET_STORE",
                "true",
                "enable.auto.offset.store",
                "remove it",
            ),
            (
                "ENABLE_PARTITION_EOF",
                "true",
                "enable.partition.eof",
                "remove it",
            ),
            (
                "ISOLATION_LEVEL",
                "read_uncommitted",
                "isolation.level",
                "aborted",
            ),
            (
                "AUTO_OFFSET_RESET",
                "latest",
                "auto.offset.reset",
                "earliest",
            ),
            (
                "AUTO_OFFSET_RESET",
                "error",
                "auto.offset.reset",
                "earliest",
            ),
            ("GROUP_ID", "other", "group.id", "kafka.group_id"),
            (
                "BOOTSTRAP_SERVERS",
                "k:9092",
                "bootstrap.servers",
                "kafka.brokers",
            ),
            (
                "METADATA_BROKER_LIST",
                "k:9092",
                "metadata.broker.list",
                "kafka.brokers",
            ),
            ("CLIENT_ID", "x", "client.id", "kafka.client_id"),
            (
                "STATISTICS_INTERVAL_MS",
                "100",
                "statistics.interval.ms",
                "kafka.statistics_interval_ms",
            ),
            (
                "FETCH_MAX_BYTES",
                "52428800",
                "fetch.max.bytes",
                "pipeline.max_in_flight_bytes",
            ),
            (
                "MAX_PARTITION_FETCH_BYTES",
                "1048576",
                "max.partition.fetch.bytes",
                "pipeline.max_in_flight_bytes",
            ),
            (
                "QUEUED_MAX_MESSAGES_KBYTES",
                "65536",
                "queued.max.messages.kbytes",
                "kafka.fetch_queue_kbytes",
            ),
            (
                "QUEUED_MIN_MESSAGES",
                "100000",
                "queued.min.messages",
                "kafka.fetch_queue_messages",
            ),
            (
                "SESSION_TIMEOUT_MS",
                "45000",
                "session.timeout.ms",
                "kafka.session_timeout_ms",
            ),
        ] {
            let variable = format!("HISTORY__KAFKA__PROPERTIES__{variable}");
            let (refused, reason) = refusal(read(&[(&variable, value)]));
            assert_eq!(refused, format!("kafka.properties.{key}"), "{variable}");
            assert!(reason.contains(says), "{variable}: {reason}");
        }
        // The values that keep the guards on are accepted.
        read(&[
            (
                "HISTORY__KAFKA__PROPERTIES__ISOLATION_LEVEL",
                "read_committed",
            ),
            ("HISTORY__KAFKA__PROPERTIES__AUTO_OFFSET_RESET", "Earliest"),
        ])
        .unwrap();
    }

    #[test]
    fn the_prefetch_may_be_set_only_within_the_clients_share_of_the_budget() {
        // 32 MiB: the client's queue may hold an eighth, 4 MiB; the records, 8,000.
        read(&[("HISTORY__KAFKA__FETCH_QUEUE_KBYTES", "4096")]).unwrap();
        let (key, reason) = refusal(read(&[("HISTORY__KAFKA__FETCH_QUEUE_KBYTES", "4097")]));
        assert_eq!(key, "kafka.fetch_queue_kbytes");
        assert!(reason.contains("pipeline.max_in_flight_bytes"), "{reason}");
        read(&[("HISTORY__KAFKA__FETCH_QUEUE_MESSAGES", "8000")]).unwrap();
        let (key, reason) = refusal(read(&[("HISTORY__KAFKA__FETCH_QUEUE_MESSAGES", "8001")]));
        assert_eq!(key, "kafka.fetch_queue_messages");
        assert!(reason.contains("pipeline.max_in_flight"), "{reason}");
        for ratio in ["0", "1001"] {
            assert_eq!(
                refusal(read(&[("HISTORY__KAFKA__MAX_COMPRESSION_RATIO", ratio)])).0,
                "kafka.max_compression_ratio"
            );
        }
        let settings = read(&[]).unwrap();
        assert_eq!(settings.kafka.max_compression_ratio, 10);
    }

    #[test]
    fn a_property_variable_with_double_underscores_is_refused_with_the_right_spelling() {
        let (key, reason) = refusal(read(&[(
            "HISTORY__KAFKA__PROPERTIES__SECURITY__PROTOCOL",
            "SASL_SSL",
        )]));
        assert_eq!(key, "HISTORY__KAFKA__PROPERTIES__SECURITY__PROTOCOL");
        assert!(
            reason.contains("write HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL"),
            "{reason}"
        );
        assert!(reason.contains("security.protocol"), "{reason}");
        let (key, _) = refusal(read(&[(
            "HISTORY__KAFKA__PROPERTY_FILES__SASL__PASSWORD",
            "/run/secrets/kafka",
        )]));
        assert_eq!(key, "HISTORY__KAFKA__PROPERTY_FILES__SASL__PASSWORD");
    }

    #[test]
    fn a_property_written_as_a_table_in_a_file_is_told_how_to_write_it() {
        let mut file = tempfile();
        writeln!(file.1, "[kafka.properties.security]\nprotocol = \"SSL\"").unwrap();
        let err = Settings::read_from(Some(&file.0), env(&[])).unwrap_err();
        std::fs::remove_file(&file.0).unwrap();
        let text = err.to_string();
        assert!(text.contains("\"security.protocol\" = "), "{text}");
    }

    #[test]
    fn a_directory_given_as_the_file_is_named_as_one() {
        let err = Settings::read_from(Some(&std::env::temp_dir()), None).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
    }

    #[test]
    fn every_broker_entry_needs_a_host_and_a_numeric_port() {
        for brokers in [
            "::::,,",
            "k1:9092,,k2:9092",
            "k1",
            ":9092",
            "k1:port",
            "k1:0",
            "k1:70000",
            "::1:9092",
            "[::1:9092",
            "[]:9092",
        ] {
            let err = read(&[("HISTORY__KAFKA__BROKERS", brokers)]).unwrap_err();
            assert!(
                matches!(
                    &err,
                    ConfigError::Invalid {
                        key: "kafka.brokers",
                        ..
                    }
                ),
                "{brokers}: {err}"
            );
        }
        for brokers in [
            "k1:9092",
            "k1:9092, k2:9093",
            "10.0.0.1:9092",
            "[::1]:9092,[fe80::1]:19092",
            "SASL_SSL://kafka.internal:9094",
        ] {
            assert!(
                read(&[("HISTORY__KAFKA__BROKERS", brokers)]).is_ok(),
                "{brokers}"
            );
        }
    }

    #[test]
    fn the_unready_time_must_be_positive() {
        assert_eq!(
            invalid_key(read(&[(
                "HISTORY__PIPELINE__UNREADY_AFTER_FAILING_MS",
                "0"
            )])),
            "pipeline.unready_after_failing_ms"
        );
        let settings = read(&[("HISTORY__PIPELINE__UNREADY_AFTER_FAILING_MS", "1500")]).unwrap();
        assert_eq!(
            settings.pipeline.unready_after_failing(),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn every_database_wait_is_bounded_and_a_zero_names_its_key() {
        let settings = read(&[]).unwrap();
        assert_eq!(
            settings.database.statement_timeout(),
            Duration::from_secs(10)
        );
        for (variable, key) in [
            (
                "HISTORY__DATABASE__STATEMENT_TIMEOUT_MS",
                "database.statement_timeout_ms",
            ),
            (
                "HISTORY__DATABASE__IDLE_IN_TRANSACTION_TIMEOUT_MS",
                "database.idle_in_transaction_timeout_ms",
            ),
            (
                "HISTORY__DATABASE__KEEPALIVES_IDLE_MS",
                "database.keepalives_idle_ms",
            ),
            (
                "HISTORY__DATABASE__KEEPALIVES_INTERVAL_MS",
                "database.keepalives_interval_ms",
            ),
            (
                "HISTORY__DATABASE__KEEPALIVES_RETRIES",
                "database.keepalives_retries",
            ),
            (
                "HISTORY__DATABASE__TCP_USER_TIMEOUT_MS",
                "database.tcp_user_timeout_ms",
            ),
        ] {
            let result = read(&[(variable, "0")]);
            let message = format!("{:?}", result.as_ref().err());
            assert_eq!(invalid_key(result), key, "{message}");
        }
        assert_eq!(
            invalid_key(read(&[(
                "HISTORY__DATABASE__STATEMENT_TIMEOUT_MS",
                "3000000000"
            )])),
            "database.statement_timeout_ms"
        );
        assert_eq!(
            invalid_key(read(&[("HISTORY__DATABASE__KEEPALIVES_IDLE_MS", "500")])),
            "database.keepalives_idle_ms"
        );
        let err = read(&[("HISTORY__DATABASE__STATEMENT_TIMEOUT_MS", "0")]).unwrap_err();
        assert!(err.to_string().contains("no deadline"), "{err}");
    }

    #[test]
    fn redact_cuts_every_secret_and_short_ones_only_where_quoted() {
        assert_eq!(
            redact("x \"hunter2\" y hunter2", ["hunter2"]),
            "x \"***\" y ***"
        );
        assert_eq!(
            redact("value \"1\" out of range 1..10", ["1"]),
            "value \"***\" out of range 1..10"
        );
        assert_eq!(redact("nothing here", ["", "secret"]), "nothing here");
        assert!(!redact("a ***** b", ["****"]).contains("****"));
    }

    /// The key and the reason of a refused setting.
    fn refusal(result: Result<Settings, ConfigError>) -> (String, String) {
        match result {
            Err(ConfigError::Invalid { key, reason }) => (key.to_owned(), reason),
            Err(ConfigError::InvalidProperty { key, reason }) => (key, reason),
            other => panic!("expected a refused setting, got {other:?}"),
        }
    }

    const CONSUMER: (&str, &str) = ("HISTORY__KAFKA__GROUP_PROTOCOL", "consumer");

    #[test]
    fn the_group_protocol_is_classic_unless_chosen_and_nothing_else_is_allowed() {
        let settings = read(&[]).unwrap();
        assert_eq!(settings.kafka.group_protocol, GroupProtocol::Classic);
        assert_eq!(settings.kafka.session_timeout_ms, None);
        assert_eq!(
            settings.kafka.session_timeout(),
            Duration::from_millis(DEFAULT_SESSION_TIMEOUT_MS)
        );
        assert!(!settings.kafka.is_static_member());
        assert_eq!(settings.kafka.metadata_refresh_ms, 10_000);
        let settings = read(&[CONSUMER, ("HISTORY__KAFKA__REMOTE_ASSIGNOR", "range")]).unwrap();
        assert_eq!(settings.kafka.group_protocol, GroupProtocol::Consumer);
        assert_eq!(settings.kafka.remote_assignor, "range");
        let err = read(&[("HISTORY__KAFKA__GROUP_PROTOCOL", "next")]).unwrap_err();
        assert!(err.to_string().contains("group_protocol"), "{err}");
    }

    #[test]
    fn settings_the_consumer_protocol_leaves_to_the_broker_are_refused_with_it() {
        let (key, reason) = refusal(read(&[
            CONSUMER,
            ("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "10000"),
        ]));
        assert_eq!(key, "kafka.session_timeout_ms");
        assert!(reason.contains("the broker sets"), "{reason}");
        for (variable, key) in [
            (
                "HISTORY__KAFKA__PROPERTIES__SESSION_TIMEOUT_MS",
                "kafka.properties.session.timeout.ms",
            ),
            (
                "HISTORY__KAFKA__PROPERTIES__HEARTBEAT_INTERVAL_MS",
                "kafka.properties.heartbeat.interval.ms",
            ),
            (
                "HISTORY__KAFKA__PROPERTIES__PARTITION_ASSIGNMENT_STRATEGY",
                "kafka.properties.partition.assignment.strategy",
            ),
            (
                "HISTORY__KAFKA__PROPERTIES__GROUP_PROTOCOL_TYPE",
                "kafka.properties.group.protocol.type",
            ),
        ] {
            let (refused, reason) = refusal(read(&[CONSUMER, (variable, "1")]));
            assert_eq!(refused, key);
            assert!(reason.contains("does not apply"), "{reason}");
            // The same under classic is a plain librdkafka property.
            read(&[(variable, "3000")])
                .map(|_| ())
                .unwrap_or_else(|err| {
                    assert!(!err.to_string().contains("does not apply"), "{err}")
                });
        }
    }

    #[test]
    fn settings_the_classic_protocol_has_no_use_for_are_refused_with_it() {
        let (key, reason) = refusal(read(&[("HISTORY__KAFKA__REMOTE_ASSIGNOR", "uniform")]));
        assert_eq!(key, "kafka.remote_assignor");
        assert!(reason.contains("only to"), "{reason}");
        let settings = read(&[("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "6000")]).unwrap();
        assert_eq!(settings.kafka.session_timeout(), Duration::from_secs(6));
        assert_eq!(
            refusal(read(&[("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "0")])).0,
            "kafka.session_timeout_ms"
        );
    }

    #[test]
    fn group_settings_with_keys_of_their_own_are_refused_as_pass_through_properties() {
        for (variable, key, own) in [
            (
                "HISTORY__KAFKA__PROPERTIES__GROUP_PROTOCOL",
                "kafka.properties.group.protocol",
                "kafka.group_protocol",
            ),
            (
                "HISTORY__KAFKA__PROPERTIES__GROUP_INSTANCE_ID",
                "kafka.properties.group.instance.id",
                "kafka.group_instance_id",
            ),
            (
                "HISTORY__KAFKA__PROPERTIES__TOPIC_METADATA_REFRESH_INTERVAL_MS",
                "kafka.properties.topic.metadata.refresh.interval.ms",
                "kafka.metadata_refresh_ms",
            ),
        ] {
            let (refused, reason) = refusal(read(&[(variable, "x")]));
            assert_eq!(refused, key);
            assert!(reason.contains(own), "{reason}");
        }
    }

    #[test]
    fn a_group_instance_id_is_a_pod_name_or_nothing() {
        let settings = read(&[(
            "HISTORY__KAFKA__GROUP_INSTANCE_ID",
            "history-service-7d9f8c-x2k4p",
        )])
        .unwrap();
        assert!(settings.kafka.is_static_member());
        for bad in ["two words", "a/b", &"x".repeat(250)] {
            assert_eq!(
                refusal(read(&[("HISTORY__KAFKA__GROUP_INSTANCE_ID", bad)])).0,
                "kafka.group_instance_id",
                "{bad}"
            );
        }
        assert_eq!(
            refusal(read(&[("HISTORY__KAFKA__METADATA_REFRESH_MS", "10")])).0,
            "kafka.metadata_refresh_ms"
        );
    }

    fn tempfile() -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!(
            "history-config-{}-{}.toml",
            std::process::id(),
            rand::random::<u64>()
        ));
        let file = std::fs::File::create(&path).unwrap();
        (path, file)
    }
}
