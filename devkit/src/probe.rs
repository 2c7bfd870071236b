//! A minimal HTTP/1.0 client for the service's own endpoints (`/metrics`, `/readyz`), and the
//! one reader of its Prometheus text exposition ([`Metrics`]), used by the benchmark and the
//! tests to look at a running service from outside.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::time::Duration;

/// GETs `path` from `127.0.0.1:port`; returns the status code and the body.
pub fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The value of one series in a Prometheus text exposition, if present (see [`Metrics::get`]).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    Metrics::parse(text).get(series)
}

/// One sample line of an exposition: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series as written, everything before the value: `name{label="value",...}`.
    pub series: String,
    /// The sample's name (a histogram's `_bucket`, `_sum` and `_count` are names of their own).
    pub name: String,
    /// The labels in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of the label `key`, if the series has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The sample as the exposition writes it, from the parser's view of it.
    fn from_parsed(parsed: &nom_openmetrics::Sample<'_>) -> Sample {
        let labels: Vec<(String, String)> = parsed
            .labels()
            .iter()
            .map(|label| (label.name.to_owned(), label.value.clone()))
            .collect();
        let series = if labels.is_empty() {
            parsed.name().to_owned()
        } else {
            let written: Vec<String> = labels
                .iter()
                .map(|(key, value)| format!("{key}=\"{}\"", escape(value)))
                .collect();
            format!("{}{{{}}}", parsed.name(), written.join(","))
        };
        Sample {
            series,
            name: parsed.name().to_owned(),
            labels,
            value: parsed.number(),
        }
    }
}

/// A label value as the text format writes it: `\\`, `\"` and `\n` escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A parsed `/metrics` page: look a series up, sum a family, select series by label.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    text: String,
    samples: Vec<Sample>,
}

impl Metrics {
    /// Reads an exposition; a line that is neither a comment nor a sample fails the caller (a
    /// test, the bench): a series it cannot read would otherwise look absent, and an assertion
    /// about it pass or fail for the wrong reason. See [`try_parse`](Self::try_parse).
    pub fn parse(text: &str) -> Metrics {
        Self::try_parse(text).unwrap_or_else(|err| panic!("{err}\n{text}"))
    }

    /// Reads an exposition with `nom_openmetrics`'s parser of the Prometheus text format, which
    /// takes the whole text or fails; the error names the first line it could not read. Blank
    /// lines, which the format allows between families, are dropped first (the parser takes
    /// none).
    pub fn try_parse(text: &str) -> Result<Metrics, String> {
        let mut kept = String::with_capacity(text.len() + 1);
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            kept.push_str(line);
            kept.push('\n');
        }
        let families = match nom_openmetrics::parser::prometheus(&kept) {
            Ok((_, families)) => families,
            Err(err) => {
                let rest = match &err {
                    nom::Err::Error(e) | nom::Err::Failure(e) => e
                        .errors
                        .first()
                        .map(|(rest, _)| *rest)
                        .unwrap_or(kept.as_str()),
                    nom::Err::Incomplete(_) => "",
                };
                let line = kept[..kept.len() - rest.len()].matches('\n').count() + 1;
                let what = kept.lines().nth(line - 1).unwrap_or_default();
                return Err(format!(
                    "line {line} of the exposition (blank lines not counted) is not a \
                     sample, HELP or TYPE: {what:?}"
                ));
            }
        };
        let samples = families
            .iter()
            .flat_map(|family| family.samples.iter().map(Sample::from_parsed))
            .collect();
        Ok(Metrics {
            text: text.to_owned(),
            samples,
        })
    }

    /// The exposition as served.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Every sample, in the order served.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The value of one series, written as the exposition writes it:
    /// `history_events_total{outcome="applied"}`, or a bare name for a series without labels.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.samples
            .iter()
            .find(|sample| sample.series == series)
            .map(|sample| sample.value)
    }

    /// The series of `name` that carry every one of `labels` (and maybe more).
    pub fn select<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |sample| {
            sample.name == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.label(key) == Some(value))
        })
    }

    /// The value of the one series of `name` with these labels, if there is one.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.select(name, labels).next().map(|sample| sample.value)
    }

    /// The sum over every series of `name`.
    pub fn sum(&self, name: &str) -> f64 {
        self.select(name, &[]).map(|sample| sample.value).sum()
    }

    /// Every sample name served (histograms as `_bucket`, `_sum`, `_count`).
    pub fn names(&self) -> BTreeSet<String> {
        self.samples
            .iter()
            .map(|sample| sample.name.clone())
            .collect()
    }
}

impl std::fmt::Display for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP history_events_total Events by outcome.\n\
        # TYPE history_events_total counter\n\
        history_events_total{outcome=\"applied\"} 12\n\
        history_events_total{outcome=\"already_applied\"} 3\n\
        history_retries_total 0\n\
        history_stuck_event{topic=\"t\",partition=\"2\",message=\"a \\\"b\\\", c\"} 1\n\
        history_transaction_seconds_count 4\n";

    #[test]
    fn series_are_found_as_written_summed_by_name_and_selected_by_label() {
        let metrics = Metrics::parse(TEXT);
        assert_eq!(
            metrics.get("history_events_total{outcome=\"applied\"}"),
            Some(12.0)
        );
        assert_eq!(metrics.get("history_retries_total"), Some(0.0));
        assert_eq!(metrics.get("history_events_total"), None);
        assert_eq!(metrics.sum("history_events_total"), 15.0);
        assert_eq!(
            metrics.value("history_stuck_event", &[("partition", "2")]),
            Some(1.0)
        );
        let stuck = metrics.select("history_stuck_event", &[]).next().unwrap();
        assert_eq!(stuck.label("message"), Some("a \"b\", c"));
        assert_eq!(stuck.label("topic"), Some("t"));
        assert_eq!(
            metrics.names().into_iter().collect::<Vec<_>>(),
            [
                "history_events_total",
                "history_retries_total",
                "history_stuck_event",
                "history_transaction_seconds_count"
            ]
        );
        assert_eq!(sample(TEXT, "history_transaction_seconds_count"), Some(4.0));
        assert_eq!(metrics.to_string(), TEXT);
    }

    #[test]
    fn a_histogram_keeps_each_sample_and_blank_lines_between_families_are_allowed() {
        let text = format!(
            "{TEXT}\n# TYPE history_transaction_seconds histogram\n\
             history_transaction_seconds_bucket{{le=\"0.005\"}} 1\n\
             history_transaction_seconds_bucket{{le=\"+Inf\"}} 4\n\
             history_transaction_seconds_sum 0.25\n\n"
        );
        let metrics = Metrics::parse(&text);
        assert_eq!(
            metrics.get("history_transaction_seconds_bucket{le=\"+Inf\"}"),
            Some(4.0)
        );
        assert_eq!(
            metrics.value("history_transaction_seconds_bucket", &[("le", "0.005")]),
            Some(1.0)
        );
        assert_eq!(metrics.get("history_transaction_seconds_sum"), Some(0.25));
    }

    #[test]
    fn a_line_that_is_not_a_sample_is_named_not_skipped() {
        for bad in [
            "history_events_total{outcome=\"applied\" 12\n",
            "history_events_total{outcome=\"applied\"} twelve\n",
            "history_events_total\n",
            "history_stuck_event{topic=\"t} 1\n",
        ] {
            let text = format!("{TEXT}{bad}");
            let err = Metrics::try_parse(&text).unwrap_err();
            assert!(err.contains("line 8"), "{bad:?}: {err}");
        }
        assert!(Metrics::try_parse(TEXT).is_ok());
    }
}
