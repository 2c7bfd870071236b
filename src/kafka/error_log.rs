//! Repeated Kafka client errors, logged without flooding. librdkafka reports a broker it cannot
//! reach tens of times a second (through the client's error callback and again on the consumer
//! stream); an operator needs the first report at once and then to know it goes on, not forty
//! lines a second. The first occurrence of a distinct error is logged; repeats within an
//! interval (`kafka.error_log_interval_ms`) are counted and summarised in one line per error per
//! interval. Every
//! occurrence counts in `history_kafka_client_errors_total{error}`, labelled by the error's code
//! name (bounded), never by its free text.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use tracing::{error, warn};

use crate::metrics;

/// How long repeats of one error are counted before their summary line, unless configured.
pub(crate) const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The level an error is logged at; a summary keeps the level of the error's first line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    Error,
    Warn,
}

/// What to do with one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The first of its kind (in this interval): log it in full.
    Log,
    /// A repeat: counted, summarised later.
    Suppress,
}

/// The repeats of one error over one interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    pub error: String,
    pub repeats: u64,
    /// From the error's first line (or the previous summary) to now.
    pub over: Duration,
    /// The details of the last repeat (the broker's text, which may change: "1/3 brokers are
    /// down", then "3/3").
    pub last_detail: String,
    pub severity: Severity,
}

#[derive(Debug)]
struct Entry {
    since: Instant,
    repeats: u64,
    last_detail: String,
    severity: Severity,
}

/// The pure aggregation: the caller passes the time, so tests control the clock.
#[derive(Debug)]
pub(crate) struct Aggregator {
    interval: Duration,
    entries: HashMap<String, Entry>,
}

impl Aggregator {
    pub(crate) fn new(interval: Duration) -> Self {
        Aggregator {
            interval,
            entries: HashMap::new(),
        }
    }

    /// One occurrence of `error` at `now`. Returns whether to log it, and the summary of the
    /// interval it ended, if any.
    pub(crate) fn record(
        &mut self,
        error: &str,
        detail: &str,
        severity: Severity,
        now: Instant,
    ) -> (Verdict, Option<Summary>) {
        let summary = self.flush_one(error, now);
        match self.entries.get_mut(error) {
            Some(entry) => {
                entry.repeats += 1;
                detail.clone_into(&mut entry.last_detail);
                (Verdict::Suppress, summary)
            }
            None => {
                self.entries.insert(
                    error.to_owned(),
                    Entry {
                        since: now,
                        repeats: 0,
                        last_detail: detail.to_owned(),
                        severity,
                    },
                );
                (Verdict::Log, summary)
            }
        }
    }

    /// The summaries of every interval that is over at `now`. An error that did not repeat
    /// during its interval is forgotten, so its next occurrence is logged in full again.
    pub(crate) fn flush(&mut self, now: Instant) -> Vec<Summary> {
        let due: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, entry)| now.saturating_duration_since(entry.since) >= self.interval)
            .map(|(error, _)| error.clone())
            .collect();
        let mut summaries: Vec<Summary> = due
            .iter()
            .filter_map(|error| self.flush_one(error, now))
            .collect();
        summaries.sort_by(|a, b| a.error.cmp(&b.error));
        summaries
    }

    /// The summaries of every error that repeated since its last line, whether its interval is
    /// over or not (the process is stopping); forgets them all.
    pub(crate) fn flush_all(&mut self, now: Instant) -> Vec<Summary> {
        let mut summaries: Vec<Summary> = self
            .entries
            .drain()
            .filter(|(_, entry)| entry.repeats > 0)
            .map(|(error, entry)| Summary {
                error,
                repeats: entry.repeats,
                over: now.saturating_duration_since(entry.since),
                last_detail: entry.last_detail,
                severity: entry.severity,
            })
            .collect();
        summaries.sort_by(|a, b| a.error.cmp(&b.error));
        summaries
    }

    fn flush_one(&mut self, error: &str, now: Instant) -> Option<Summary> {
        let entry = self.entries.get_mut(error)?;
        let over = now.saturating_duration_since(entry.since);
        if over < self.interval {
            return None;
        }
        if entry.repeats == 0 {
            self.entries.remove(error);
            return None;
        }
        let summary = Summary {
            error: error.to_owned(),
            repeats: entry.repeats,
            over,
            last_detail: entry.last_detail.clone(),
            severity: entry.severity,
        };
        entry.since = now;
        entry.repeats = 0;
        Some(summary)
    }
}

/// A bounded name for an error: its librdkafka code (`AllBrokersDown`), or the variant of an
/// error that has none (`Canceled`, `Subscription`).
pub(crate) fn error_name(error: &KafkaError) -> String {
    if let Some(code) = error.rdkafka_error_code() {
        return format!("{code:?}");
    }
    let variant = match error {
        KafkaError::AdminOp(_) => "AdminOp",
        KafkaError::AdminOpCreation(_) => "AdminOpCreation",
        KafkaError::Canceled => "Canceled",
        KafkaError::ClientConfig(..) => "ClientConfig",
        KafkaError::ClientCreation(_) => "ClientCreation",
        KafkaError::NoMessageReceived => "NoMessageReceived",
        KafkaError::Nul(_) => "Nul",
        KafkaError::PartitionEOF(_) => "PartitionEOF",
        KafkaError::PauseResume(_) => "PauseResume",
        KafkaError::Seek(_) => "Seek",
        KafkaError::Subscription(_) => "Subscription",
        _ => "Other",
    };
    variant.to_owned()
}

/// The one aggregator of the process's Kafka client errors, shared by the client's error
/// callback and the supervisor's stream (which sees the same errors again as consumer errors),
/// and — cloned — by every other client the service makes of the same cluster (the metadata
/// client and the checking clients of start-up): an unreachable cluster is one line per error,
/// not one per client. The summaries left are said when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct ClientErrorLog {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    aggregator: Mutex<Aggregator>,
}

impl Default for ClientErrorLog {
    fn default() -> Self {
        ClientErrorLog::new(ERROR_LOG_INTERVAL)
    }
}

impl ClientErrorLog {
    pub fn new(interval: Duration) -> Self {
        ClientErrorLog {
            shared: Arc::new(Shared {
                aggregator: Mutex::new(Aggregator::new(interval)),
            }),
        }
    }

    /// An error from librdkafka's error callback, with its reason text.
    pub fn client_error(&self, error: &KafkaError, reason: &str) {
        let name = error_name(error);
        let (verdict, summary) = self.record(&name, reason, Severity::Error);
        if verdict == Verdict::Log {
            error!(%error, reason, "kafka client error");
        }
        log_summary(summary);
    }

    /// An error the consumer stream returned instead of a record.
    pub fn consumer_error(&self, error: &KafkaError) {
        let name = error_name(error);
        let (verdict, summary) = self.record(&name, &error.to_string(), Severity::Warn);
        if verdict == Verdict::Log {
            warn!(%error, "consumer error");
        }
        log_summary(summary);
    }

    /// Logs the summaries of the intervals that are over; call it periodically, so a summary
    /// is written even when the error stopped.
    pub fn flush(&self) {
        let summaries = self.shared.aggregator.lock().unwrap().flush(Instant::now());
        for summary in summaries {
            log_summary(Some(summary));
        }
    }

    /// A line of librdkafka's own log at warning level or above. The same failure usually
    /// reaches the error callback too ([`client_error`](Self::client_error)): these lines are
    /// aggregated the same way, under their facility (`FAIL`, `ERROR`, …), at WARN, so one
    /// failure is not one ERROR line twice over.
    pub fn client_log(&self, facility: &str, message: &str) {
        let name = format!("log:{facility}");
        let (verdict, summary) = self.record(&name, message, Severity::Warn);
        if verdict == Verdict::Log {
            warn!(facility, message, "kafka client log");
        }
        log_summary(summary);
    }

    /// Logs the summary of every error that repeated since its last line, interval over or
    /// not: the client is about to close, and may not finish closing before the process ends.
    pub fn flush_all(&self) {
        let summaries = self
            .shared
            .aggregator
            .lock()
            .unwrap()
            .flush_all(Instant::now());
        for summary in summaries {
            log_summary(Some(summary));
        }
    }

    fn record(&self, name: &str, detail: &str, severity: Severity) -> (Verdict, Option<Summary>) {
        metrics::kafka_client_error(name);
        self.shared
            .aggregator
            .lock()
            .unwrap()
            .record(name, detail, severity, Instant::now())
    }
}

impl Drop for Shared {
    /// The last client is closing: what repeated since the last line is said now, not never.
    fn drop(&mut self) {
        let aggregator = self
            .aggregator
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for summary in aggregator.flush_all(Instant::now()) {
            log_summary(Some(summary));
        }
    }
}

/// The context of the service's producers (the dead-letter topic, replays): their client
/// errors and librdkafka's error lines go through one [`ClientErrorLog`] instead of a line each,
/// and its summaries are said when the producer is dropped.
#[derive(Debug, Default)]
pub(crate) struct LoggedClientContext {
    errors: ClientErrorLog,
}

impl LoggedClientContext {
    pub(crate) fn new(interval: Duration) -> Self {
        LoggedClientContext {
            errors: ClientErrorLog::new(interval),
        }
    }

    /// A context whose lines go through `errors`, shared with other clients.
    pub(crate) fn sharing(errors: ClientErrorLog) -> Self {
        LoggedClientContext { errors }
    }
}

impl rdkafka::client::ClientContext for LoggedClientContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel::*;
        match level {
            Emerg | Alert | Critical | Error | Warning => self.errors.client_log(facility, message),
            Notice | Info | Debug => tracing::debug!(facility, message, "kafka client log"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.client_error(&error, reason);
    }
}

/// The checking client reads as a consumer; it never joins a group, so nothing to add.
impl rdkafka::consumer::ConsumerContext for LoggedClientContext {}

fn log_summary(summary: Option<Summary>) {
    let Some(summary) = summary else {
        return;
    };
    let Summary {
        error,
        repeats,
        over,
        last_detail,
        severity,
    } = summary;
    let seconds = over.as_secs();
    match severity {
        Severity::Error => error!(
            error,
            repeats,
            last = %last_detail,
            "kafka client error {error} repeated {repeats} times in the last {seconds} s"
        ),
        Severity::Warn => warn!(
            error,
            repeats,
            last = %last_detail,
            "kafka client error {error} repeated {repeats} times in the last {seconds} s"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode;

    const INTERVAL: Duration = Duration::from_secs(30);

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    #[test]
    fn the_first_occurrence_is_logged_and_repeats_within_the_interval_are_not() {
        let start = Instant::now();
        let mut log = Aggregator::new(INTERVAL);
        let first = log.record("AllBrokersDown", "1/1 down", Severity::Error, start);
        assert_eq!(first, (Verdict::Log, None));
        for i in 1..=599 {
            let verdict = log.record(
                "AllBrokersDown",
                "1/1 down",
                Severity::Error,
                at(start, i * 50),
            );
            assert_eq!(verdict, (Verdict::Suppress, None), "repeat {i}");
        }
        assert!(log.flush(at(start, 29_999)).is_empty());
    }

    #[test]
    fn repeats_are_summarised_once_per_interval_with_their_count_and_last_detail() {
        let start = Instant::now();
        let mut log = Aggregator::new(INTERVAL);
        log.record("AllBrokersDown", "1/3 down", Severity::Error, start);
        log.record("AllBrokersDown", "2/3 down", Severity::Error, at(start, 10));
        log.record("AllBrokersDown", "3/3 down", Severity::Error, at(start, 20));
        let summaries = log.flush(at(start, 30_000));
        assert_eq!(
            summaries,
            vec![Summary {
                error: "AllBrokersDown".into(),
                repeats: 2,
                over: INTERVAL,
                last_detail: "3/3 down".into(),
                severity: Severity::Error,
            }]
        );
        // The next interval starts at the summary: a repeat is counted, not logged.
        let next = log.record(
            "AllBrokersDown",
            "3/3 down",
            Severity::Error,
            at(start, 30_001),
        );
        assert_eq!(next, (Verdict::Suppress, None));
        assert!(log.flush(at(start, 59_999)).is_empty());
        assert_eq!(log.flush(at(start, 60_000))[0].repeats, 1);
    }

    #[test]
    fn a_repeat_after_the_interval_brings_the_summary_without_waiting_for_a_flush() {
        let start = Instant::now();
        let mut log = Aggregator::new(INTERVAL);
        log.record("Fail", "x", Severity::Warn, start);
        log.record("Fail", "y", Severity::Warn, at(start, 1));
        let (verdict, summary) = log.record("Fail", "z", Severity::Warn, at(start, 31_000));
        assert_eq!(verdict, Verdict::Suppress);
        let summary = summary.expect("the interval was over");
        assert_eq!(
            (summary.repeats, summary.over),
            (1, Duration::from_secs(31))
        );
    }

    #[test]
    fn an_error_that_stopped_is_forgotten_and_logged_in_full_when_it_returns() {
        let start = Instant::now();
        let mut log = Aggregator::new(INTERVAL);
        log.record("AllBrokersDown", "down", Severity::Error, start);
        assert!(
            log.flush(at(start, 30_000)).is_empty(),
            "no repeats, nothing to say"
        );
        let again = log.record("AllBrokersDown", "down", Severity::Error, at(start, 45_000));
        assert_eq!(again, (Verdict::Log, None));
    }

    #[test]
    fn at_the_end_every_pending_repeat_is_summarised_and_nothing_else() {
        let start = Instant::now();
        let mut log = Aggregator::new(INTERVAL);
        log.record("AllBrokersDown", "a", Severity::Error, start);
        log.record("AllBrokersDown", "b", Severity::Error, at(start, 1_000));
        log.record("Fail", "once", Severity::Warn, start);
        let summaries = log.flush_all(at(start, 5_000));
        assert_eq!(
            summaries,
            vec![Summary {
                error: "AllBrokersDown".into(),
                repeats: 1,
                over: Duration::from_secs(5),
                last_detail: "b".into(),
                severity: Severity::Error,
            }]
        );
        assert!(log.flush_all(at(start, 6_000)).is_empty());
    }

    #[test]
    fn distinct_errors_are_aggregated_apart() {
        let start = Instant::now();
        let mut log = Aggregator::new(INTERVAL);
        assert_eq!(
            log.record("AllBrokersDown", "", Severity::Error, start).0,
            Verdict::Log
        );
        assert_eq!(
            log.record("BrokerTransportFailure", "", Severity::Error, start)
                .0,
            Verdict::Log
        );
        assert_eq!(
            log.record("AllBrokersDown", "", Severity::Warn, start).0,
            Verdict::Suppress
        );
        log.record("BrokerTransportFailure", "", Severity::Error, start);
        log.record("BrokerTransportFailure", "", Severity::Error, start);
        let summaries = log.flush(at(start, 30_000));
        let counts: Vec<(&str, u64)> = summaries
            .iter()
            .map(|s| (s.error.as_str(), s.repeats))
            .collect();
        assert_eq!(
            counts,
            vec![("AllBrokersDown", 1), ("BrokerTransportFailure", 2)]
        );
    }

    #[test]
    fn error_names_are_the_code_or_the_variant_never_the_text() {
        let down = KafkaError::Global(RDKafkaErrorCode::AllBrokersDown);
        assert_eq!(error_name(&down), "AllBrokersDown");
        let consumed = KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure);
        assert_eq!(error_name(&consumed), "BrokerTransportFailure");
        let subscription = KafkaError::Subscription("secret topic text".into());
        assert_eq!(error_name(&subscription), "Subscription");
        assert_eq!(error_name(&KafkaError::Canceled), "Canceled");
    }
}
