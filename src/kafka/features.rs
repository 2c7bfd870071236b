//! What this build of librdkafka can do: its compression codecs and its SASL mechanisms.
//!
//! They are decided when librdkafka is compiled (rdkafka's cargo features), not at run time, and a
//! missing one shows only on the day a topic or a cluster needs it: a batch compressed with a
//! codec the build lacks fails in the fetcher and its partition never moves; a mechanism it lacks
//! fails when the client is created. So the service logs the list at start-up, and the tests
//! assert every codec and mechanism a Kafka cluster may use is there.

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

/// Every compression codec a Kafka producer may use (`compression.type`).
pub const CODECS: [&str; 4] = ["gzip", "snappy", "lz4", "zstd"];

/// Every authentication a Kafka cluster may ask for: TLS, and the SASL mechanisms PLAIN,
/// SCRAM-SHA-256/512, GSSAPI (Kerberos) and OAUTHBEARER, with the OIDC token client
/// (`sasl.oauthbearer.method=oidc`, which needs librdkafka's HTTP client).
pub const AUTHENTICATION: [&str; 8] = [
    "ssl",
    "sasl",
    "sasl_plain",
    "sasl_scram",
    "sasl_gssapi",
    "sasl_oauthbearer",
    "http",
    "oidc",
];

/// librdkafka's version, as it reports it (`2.12.1`).
pub fn librdkafka_version() -> String {
    rdkafka::util::get_rdkafka_version().1
}

/// The features this build of librdkafka has (its `builtin.features` property), in its order.
pub fn builtin() -> Result<Vec<String>, KafkaError> {
    // A fresh configuration object reports the build's defaults: rdkafka's `ClientConfig`
    // alone holds only what was set on it.
    let native = ClientConfig::new().create_native_config()?;
    let list = native.get("builtin.features")?;
    Ok(list
        .split(',')
        .map(str::trim)
        .filter(|feature| !feature.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The codecs and authentication features of [`CODECS`] and [`AUTHENTICATION`] that
/// `features` lacks.
pub fn missing(features: &[String]) -> Vec<&'static str> {
    CODECS
        .iter()
        .chain(AUTHENTICATION.iter())
        .filter(|wanted| !features.iter().any(|feature| feature == *wanted))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_build_has_every_codec_and_every_authentication_mechanism() {
        let features = builtin().unwrap();
        assert_eq!(
            missing(&features),
            Vec::<&str>::new(),
            "{features:?}: librdkafka was configured without them (`http` and `oidc` need \
             Debian's libcurl4-openssl-dev when rdkafka-sys builds: run \
             scripts/ensure-build-deps.sh, then `cargo clean -p rdkafka-sys`)"
        );
    }

    #[test]
    fn a_missing_feature_is_named() {
        let features: Vec<String> = ["gzip", "snappy", "lz4", "ssl", "sasl", "sasl_plain"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        assert_eq!(
            missing(&features),
            vec![
                "zstd",
                "sasl_scram",
                "sasl_gssapi",
                "sasl_oauthbearer",
                "http",
                "oidc"
            ]
        );
    }
}
