//! The pass-through librdkafka properties (`kafka.properties.*`, `kafka.property_files.*`),
//! checked against librdkafka itself when the settings are loaded: the plain settings in
//! `config` know nothing of the client, the way the store parses PostgreSQL's URL.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use secrecy::ExposeSecret;

use super::authentication::{self, Host};
use crate::config::{ConfigError, KafkaSettings, redact};

/// Checks each pass-through property on its own against librdkafka, so a misspelled name or a
/// rejected value stops the service at start-up naming the key — in a message built here, since
/// librdkafka's own quotes the value, and values may be secrets.
pub(crate) fn validate(kafka: &KafkaSettings) -> Result<(), ConfigError> {
    let properties = kafka.librdkafka_properties()?;
    for (key, value) in &properties {
        let origin = origin(kafka, key);
        let mut single = rdkafka::ClientConfig::new();
        single.set(key.as_str(), value.expose_secret());
        if let Err(err) = single.create_native_config() {
            return Err(ConfigError::InvalidProperty {
                key: format!("{origin}.{key}"),
                reason: rejection(&err, value.expose_secret()),
            });
        }
    }
    authentication::check(&properties, &Host::current()).map_err(|refusal| {
        ConfigError::InvalidProperty {
            key: format!("{}.{}", origin(kafka, refusal.property), refusal.property),
            reason: refusal.reason,
        }
    })
}

/// Where a property was configured: `kafka.property_files` or `kafka.properties`.
fn origin(kafka: &KafkaSettings, key: &str) -> &'static str {
    if kafka.property_files.contains_key(key) {
        "kafka.property_files"
    } else {
        "kafka.properties"
    }
}

/// Why librdkafka refused one property, without its value.
fn rejection(err: &KafkaError, value: &str) -> String {
    match err {
        KafkaError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, ..) => {
            "librdkafka has no such property (is it misspelled?)".to_owned()
        }
        KafkaError::ClientConfig(_, description, ..) => {
            format!(
                "librdkafka rejects its value (not shown): {}",
                redact(description, [value])
            )
        }
        // A NUL byte in the name or the value: the only other way setting one can fail.
        _ => "the name or the value contains a NUL character".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::Settings;

    fn read(pairs: &[(&str, &str)]) -> Result<(), ConfigError> {
        let environment: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        validate(&Settings::read_from(None, Some(environment))?.kafka)
    }

    /// The key and the reason of a rejected Kafka property; the value never shows.
    fn property_error(pairs: &[(&str, &str)], secret: &str) -> (String, String) {
        match read(pairs) {
            Err(err @ ConfigError::InvalidProperty { .. }) => {
                let shown = format!("{err} {err:?}");
                assert!(!shown.contains(secret), "the value leaked: {shown}");
                let ConfigError::InvalidProperty { key, reason } = err else {
                    unreachable!()
                };
                (key, reason)
            }
            other => panic!("expected an invalid property, got {other:?}"),
        }
    }

    #[test]
    fn a_misspelled_kafka_property_is_named_without_its_value() {
        let (key, reason) = property_error(
            &[("HISTORY__KAFKA__PROPERTIES__SASL_PASWORD", "hunter2-secret")],
            "hunter2-secret",
        );
        assert_eq!(key, "kafka.properties.sasl.pasword");
        assert!(reason.contains("no such property"), "{reason}");
    }

    #[test]
    fn a_rejected_kafka_property_value_is_not_shown() {
        let (key, reason) = property_error(
            &[(
                "HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL",
                "bogus-s3cr3t",
            )],
            "bogus-s3cr3t",
        );
        assert_eq!(key, "kafka.properties.security.protocol");
        assert!(reason.contains("rejects its value"), "{reason}");
    }

    #[test]
    fn a_property_read_from_a_file_is_named_with_its_file_key() {
        let file = std::env::temp_dir().join(format!(
            "history-kafka-property-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::write(&file, "file-s3cr3t-value\n").unwrap();
        let path = file.display().to_string();
        let (key, _) = property_error(
            &[("HISTORY__KAFKA__PROPERTY_FILES__SASL_PASWORD", &path)],
            "file-s3cr3t-value",
        );
        assert_eq!(key, "kafka.property_files.sasl.pasword");
        let (key, _) = property_error(
            &[("HISTORY__KAFKA__PROPERTY_FILES__SECURITY_PROTOCOL", &path)],
            "file-s3cr3t-value",
        );
        assert_eq!(key, "kafka.property_files.security.protocol");
        std::fs::remove_file(&file).unwrap();
    }
}
