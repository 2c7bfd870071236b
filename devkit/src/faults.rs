//! Fault injection into the embedded broker, driven by text commands (one per line on
//! `dev-kafka`'s standard input), so that tests and operators rehearsing failures can break the
//! broker from outside the process:
//!
//! ```text
//! broker-down 2                      # disconnect broker 2 and refuse new connections
//! broker-up 2
//! request-errors fetch 5 not-leader  # the next 5 Fetch requests fail with that error
//! clear-errors fetch
//! rtt 1 250                          # broker 1 answers 250 ms late (0 to clear)
//! leader tickets.status.v1 3 2        # broker 2 leads partition 3 from now on
//! coordinator history 3              # broker 3 coordinates group `history` from now on
//! decommission 1                     # broker 1 leaves the cluster for good
//! ```
//!
//! With the brokers behind fault proxies (`dev-kafka --proxied`), their connections themselves:
//!
//! ```text
//! freeze-connections both            # nothing more flows on the open connections (up, down)
//! thaw                               # they flow again, what was held first
//! freeze-new on                      # new connections are accepted and never answered (off)
//! refuse-connections on              # new connections are reset at once (off)
//! reset-connections                  # every open connection is reset (RST)
//! latency 200                        # every chunk forwarded 200 ms late, both ways (0: none)
//! ```

use std::time::Duration;

use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

use super::broker::EmbeddedBroker;
use super::fault_proxy::{Direction, FaultProxy};

/// One fault to inject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    BrokerDown(i32),
    BrokerUp(i32),
    RequestErrors {
        api: &'static str,
        count: usize,
        error: &'static str,
    },
    ClearErrors(&'static str),
    RoundTrip {
        broker: i32,
        delay_ms: u64,
    },
    /// The brokers' proxies: freeze their open connections, this way.
    FreezeConnections(Direction),
    /// The brokers' proxies: let every frozen connection flow again.
    Thaw,
    /// The brokers' proxies: accept new connections and never answer them (or stop).
    FreezeNew(bool),
    /// The brokers' proxies: reset new connections at once (or stop).
    RefuseConnections(bool),
    /// The brokers' proxies: reset every open connection.
    ResetConnections,
    /// The brokers' proxies: delay everything forwarded, both ways.
    Latency(u64),
    /// A partition's leadership moves to another broker.
    Leader {
        topic: String,
        partition: i32,
        broker: i32,
    },
    /// A consumer group's coordinator moves to another broker.
    Coordinator {
        group: String,
        broker: i32,
    },
    /// A broker leaves the cluster; its partitions move to the others.
    Decommission(i32),
}

/// Request kinds by Kafka's API keys (rdkafka's `RDKafkaApiKey` does not name KIP-848's).
const APIS: [(&str, i16); 11] = [
    ("produce", RDKafkaApiKey::Produce as i16),
    ("fetch", RDKafkaApiKey::Fetch as i16),
    ("list-offsets", RDKafkaApiKey::ListOffsets as i16),
    ("metadata", RDKafkaApiKey::Metadata as i16),
    ("offset-commit", RDKafkaApiKey::OffsetCommit as i16),
    ("offset-fetch", RDKafkaApiKey::OffsetFetch as i16),
    ("find-coordinator", RDKafkaApiKey::FindCoordinator as i16),
    ("join-group", RDKafkaApiKey::JoinGroup as i16),
    ("heartbeat", RDKafkaApiKey::Heartbeat as i16),
    ("sync-group", RDKafkaApiKey::SyncGroup as i16),
    // The `consumer` protocol's (KIP-848) heartbeat, which also carries its assignments.
    ("consumer-group-heartbeat", 68),
];

const ERRORS: [(&str, RDKafkaRespErr); 9] = [
    ("transport", RDKafkaRespErr::RD_KAFKA_RESP_ERR__TRANSPORT),
    (
        "not-leader",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
    ),
    (
        "leader-not-available",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
    ),
    (
        "coordinator-not-available",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
    ),
    (
        "not-coordinator",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
    ),
    (
        "request-timed-out",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
    ),
    (
        "unknown-member",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID,
    ),
    (
        "rebalance-in-progress",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
    ),
    (
        "fenced-member-epoch",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_FENCED_MEMBER_EPOCH,
    ),
];

/// Request kinds that `request-errors` accepts.
pub fn api_names() -> impl Iterator<Item = &'static str> {
    APIS.iter().map(|(name, _)| *name)
}

/// Error names that `request-errors` accepts.
pub fn error_names() -> impl Iterator<Item = &'static str> {
    ERRORS.iter().map(|(name, _)| *name)
}

fn api(name: &str) -> Result<(&'static str, i16), String> {
    APIS.iter()
        .find(|(known, _)| *known == name)
        .copied()
        .ok_or_else(|| {
            format!(
                "unknown request kind {name:?}; one of: {}",
                api_names().collect::<Vec<_>>().join(", ")
            )
        })
}

fn error(name: &str) -> Result<(&'static str, RDKafkaRespErr), String> {
    ERRORS
        .iter()
        .find(|(known, _)| *known == name)
        .copied()
        .ok_or_else(|| {
            format!(
                "unknown error {name:?}; one of: {}",
                error_names().collect::<Vec<_>>().join(", ")
            )
        })
}

fn switch(word: Option<&str>) -> Result<bool, String> {
    match word.ok_or("missing on or off")? {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?} is not on or off")),
    }
}

fn number<T: std::str::FromStr>(word: Option<&str>, what: &str) -> Result<T, String> {
    word.ok_or_else(|| format!("missing {what}"))?
        .parse()
        .map_err(|_| format!("{what} must be a number"))
}

impl std::str::FromStr for Fault {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let mut words = line.split_whitespace();
        let command = words.next().ok_or("empty command")?;
        let fault = match command {
            "broker-down" => Fault::BrokerDown(number(words.next(), "broker id")?),
            "broker-up" => Fault::BrokerUp(number(words.next(), "broker id")?),
            "request-errors" => {
                let (api, _) = api(words.next().ok_or("missing request kind")?)?;
                let count = number(words.next(), "count")?;
                let (error, _) = error(words.next().ok_or("missing error name")?)?;
                Fault::RequestErrors { api, count, error }
            }
            "clear-errors" => {
                Fault::ClearErrors(api(words.next().ok_or("missing request kind")?)?.0)
            }
            "rtt" => Fault::RoundTrip {
                broker: number(words.next(), "broker id")?,
                delay_ms: number(words.next(), "delay in ms")?,
            },
            "freeze-connections" => Fault::FreezeConnections(
                match words.next().ok_or("missing direction (up, down, both)")? {
                    "up" => Direction::Upstream,
                    "down" => Direction::Downstream,
                    "both" => Direction::Both,
                    other => {
                        return Err(format!(
                            "unknown direction {other:?}; one of: up, down, both"
                        ));
                    }
                },
            ),
            "thaw" => Fault::Thaw,
            "freeze-new" => Fault::FreezeNew(switch(words.next())?),
            "refuse-connections" => Fault::RefuseConnections(switch(words.next())?),
            "reset-connections" => Fault::ResetConnections,
            "latency" => Fault::Latency(number(words.next(), "delay in ms")?),
            "leader" => Fault::Leader {
                topic: words.next().ok_or("missing topic")?.to_owned(),
                partition: number(words.next(), "partition")?,
                broker: number(words.next(), "broker id")?,
            },
            "coordinator" => Fault::Coordinator {
                group: words.next().ok_or("missing group")?.to_owned(),
                broker: number(words.next(), "broker id")?,
            },
            "decommission" => Fault::Decommission(number(words.next(), "broker id")?),
            other => return Err(format!("unknown command {other:?}")),
        };
        match words.next() {
            Some(extra) => Err(format!("unexpected {extra:?} after the command")),
            None => Ok(fault),
        }
    }
}

impl Fault {
    /// Applies the fault to the broker.
    pub fn apply(&self, broker: &EmbeddedBroker) -> Result<(), String> {
        let cluster = broker.cluster();
        let result = match self {
            Fault::BrokerDown(id) => cluster.broker_down(*id),
            Fault::BrokerUp(id) => cluster.broker_up(*id),
            Fault::RequestErrors {
                api: name,
                count,
                error: code,
            } => {
                let (_, key) = api(name)?;
                let (_, code) = error(code)?;
                broker.push_request_errors(key, &vec![code; *count]);
                Ok(())
            }
            Fault::ClearErrors(name) => {
                broker.clear_request_errors(api(name)?.1);
                Ok(())
            }
            Fault::RoundTrip { broker, delay_ms } => {
                cluster.broker_round_trip_time(*broker, Duration::from_millis(*delay_ms))
            }
            Fault::FreezeConnections(direction) => {
                return each_proxy(broker, |proxy| {
                    proxy.freeze_open(*direction);
                });
            }
            Fault::Thaw => return each_proxy(broker, FaultProxy::thaw),
            Fault::FreezeNew(on) => return each_proxy(broker, |proxy| proxy.freeze_new(*on)),
            Fault::RefuseConnections(on) => {
                return each_proxy(broker, |proxy| proxy.refuse_new(*on));
            }
            Fault::ResetConnections => {
                return each_proxy(broker, |proxy| {
                    proxy.reset_all();
                });
            }
            Fault::Latency(ms) => {
                return each_proxy(broker, |proxy| {
                    proxy.set_latency(Direction::Both, Duration::from_millis(*ms))
                });
            }
            Fault::Leader {
                topic,
                partition,
                broker: leader,
            } => {
                return broker
                    .set_leader(topic, *partition, *leader)
                    .map_err(|err| err.to_string());
            }
            Fault::Coordinator {
                group,
                broker: coordinator,
            } => {
                return broker
                    .set_coordinator(group, *coordinator)
                    .map_err(|err| err.to_string());
            }
            Fault::Decommission(id) => {
                return broker.decommission(*id).map_err(|err| err.to_string());
            }
        };
        result.map_err(|err| err.to_string())
    }
}

/// Applies `change` to every broker's proxy; an error when the brokers run without proxies.
fn each_proxy(broker: &EmbeddedBroker, change: impl Fn(&FaultProxy)) -> Result<(), String> {
    if broker.proxies().is_empty() {
        return Err(
            "the brokers run without fault proxies (start dev-kafka with --proxied)".to_owned(),
        );
    }
    broker.proxies().iter().for_each(change);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_into_faults() {
        assert_eq!("broker-down 2".parse(), Ok(Fault::BrokerDown(2)));
        assert_eq!(" broker-up  1 ".parse(), Ok(Fault::BrokerUp(1)));
        assert_eq!(
            "request-errors offset-commit 3 coordinator-not-available".parse(),
            Ok(Fault::RequestErrors {
                api: "offset-commit",
                count: 3,
                error: "coordinator-not-available"
            })
        );
        assert_eq!(
            "clear-errors fetch".parse(),
            Ok(Fault::ClearErrors("fetch"))
        );
        assert_eq!(
            "rtt 1 250".parse(),
            Ok(Fault::RoundTrip {
                broker: 1,
                delay_ms: 250
            })
        );
        assert_eq!(
            "leader tickets.status.v1 3 2".parse(),
            Ok(Fault::Leader {
                topic: "tickets.status.v1".into(),
                partition: 3,
                broker: 2
            })
        );
        assert_eq!(
            "coordinator history 3".parse(),
            Ok(Fault::Coordinator {
                group: "history".into(),
                broker: 3
            })
        );
        assert_eq!("decommission 1".parse(), Ok(Fault::Decommission(1)));
    }

    #[test]
    fn moves_of_leaders_and_coordinators_apply_to_the_cluster() {
        let broker = EmbeddedBroker::start(3).unwrap();
        broker.create_topic("moves", 2).unwrap();
        for command in [
            "leader moves 1 3",
            "coordinator some-group 2",
            "decommission 1",
        ] {
            command.parse::<Fault>().unwrap().apply(&broker).unwrap();
        }
        let unknown = "leader moves 1 9".parse::<Fault>().unwrap().apply(&broker);
        assert!(unknown.is_err(), "{unknown:?}");
    }

    #[test]
    fn bad_commands_say_what_is_wrong() {
        let err = |line: &str| line.parse::<Fault>().unwrap_err();
        assert!(err("").contains("empty"));
        assert!(err("reboot").contains("unknown command"));
        assert!(err("broker-down").contains("broker id"));
        assert!(err("broker-down two").contains("number"));
        assert!(err("request-errors fetchh 1 transport").contains("one of: produce, fetch"));
        assert!(err("request-errors fetch 1 oops").contains("one of: transport"));
        assert!(err("broker-up 1 now").contains("unexpected"));
        assert!(err("freeze-connections sideways").contains("one of: up, down, both"));
        assert!(err("refuse-connections maybe").contains("on or off"));
    }

    #[test]
    fn connection_faults_parse_and_need_the_proxies() {
        assert_eq!(
            "freeze-connections both".parse(),
            Ok(Fault::FreezeConnections(Direction::Both))
        );
        assert_eq!("thaw".parse(), Ok(Fault::Thaw));
        assert_eq!("freeze-new on".parse(), Ok(Fault::FreezeNew(true)));
        assert_eq!(
            "refuse-connections off".parse(),
            Ok(Fault::RefuseConnections(false))
        );
        assert_eq!("reset-connections".parse(), Ok(Fault::ResetConnections));
        assert_eq!("latency 200".parse(), Ok(Fault::Latency(200)));
        let plain = EmbeddedBroker::start(1).unwrap();
        assert!(Fault::Thaw.apply(&plain).unwrap_err().contains("--proxied"));
        let proxied = EmbeddedBroker::start_proxied(2).unwrap();
        assert_eq!(proxied.proxies().len(), 2);
        assert!(
            Fault::FreezeConnections(Direction::Both)
                .apply(&proxied)
                .is_ok()
        );
    }
}
