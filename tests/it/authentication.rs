//! Every authentication mechanism, against a live server wherever one runs here (the embedded
//! broker authenticates no one):
//! - SCRAM-SHA-512 over TLS and SCRAM-SHA-256 against tansu, an independent broker that checks
//!   SCRAM credentials, and a wrong password refused by it, told by `/readyz` (tansu offers no
//!   PLAIN: that mechanism is shown by the start-up checks and librdkafka's features alone);
//! - OAUTHBEARER with OIDC against a real OpenID Connect provider (oauth2-mock-server, signing
//!   RS256 tokens): librdkafka fetches a token with the client-credentials grant, then goes on
//!   to authenticate with the broker — which the embedded one cannot do;
//! - GSSAPI against a real MIT Kerberos KDC: librdkafka logs in from the keytab with `kinit`
//!   and asks the KDC for the broker's service ticket — then the embedded broker cannot
//!   continue the exchange.

use std::time::Duration;

use history_devkit::identity::{Kdc, OidcProvider};
use history_devkit::tansu::{Scram, TansuBroker, TansuSetup};
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, WorkloadSpec, distinct_events};

const TOPIC: &str = "tickets.status.authenticated";

fn events(prefix: &str) -> Vec<PlannedRecord> {
    workload::generate(&WorkloadSpec {
        records: 300,
        duplicates: 0.1,
        poison: 0.0,
        partitions: 3,
        id_prefix: prefix.into(),
        tickets: 30,
        max_payload_bytes: 65536,
        seed: 27,
    })
}

/// The service's environment for the librdkafka properties `properties`.
fn property_env(properties: &[(String, String)]) -> Vec<(String, String)> {
    properties
        .iter()
        .map(|(key, value)| {
            (
                format!(
                    "HISTORY__KAFKA__PROPERTIES__{}",
                    key.replace('.', "_").to_uppercase()
                ),
                value.clone(),
            )
        })
        .collect()
}

/// tansu with one user and the topic, and a service authenticating to it with `properties`.
async fn against_tansu(
    user: (&str, &str, Scram),
    tls: bool,
    properties: Vec<(String, String)>,
) -> (TansuBroker, TestApp) {
    let broker = TansuBroker::start(&TansuSetup {
        users: vec![(user.0.into(), user.1.into(), user.2)],
        topics: vec![(TOPIC.into(), 3)],
        tls,
    })
    .unwrap_or_else(|err| panic!("{err}"));
    let mut properties = properties;
    if let Some(ca) = broker.ca_file() {
        properties.push(("ssl.ca.location".into(), ca.display().to_string()));
    }
    let brokers = broker.bootstrap_servers();
    let app = TestApp::prepare(|o| {
        o.external_brokers = Some(brokers);
        o.topic = TOPIC.into();
        o.partitions = 3;
        o.client_properties = properties.clone();
        for (key, value) in property_env(&properties) {
            o.env(&key, value);
        }
    })
    .await;
    (broker, app)
}

fn sasl(protocol: &str, mechanism: &str, user: &str, password: &str) -> Vec<(String, String)> {
    [
        ("security.protocol", protocol),
        ("sasl.mechanism", mechanism),
        ("sasl.username", user),
        ("sasl.password", password),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

async fn drains_exactly(app: &mut TestApp, prefix: &str) {
    let records = events(prefix);
    app.produce(&records).await;
    app.start();
    app.wait_committed(Duration::from_secs(90)).await;
    assert_eq!(
        app.db.count("history_events").await,
        distinct_events(&records) as i64
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn scram_sha_512_over_tls_drains_exactly_against_a_broker_that_checks_credentials() {
    let (_broker, mut app) = against_tansu(
        ("history", "s3cret-512", Scram::Sha512),
        true,
        sasl("SASL_SSL", "SCRAM-SHA-512", "history", "s3cret-512"),
    )
    .await;
    drains_exactly(&mut app, "scram512").await;
}

#[actix_rt::test]
async fn scram_sha_256_drains_exactly_against_a_broker_that_checks_credentials() {
    let (_broker, mut app) = against_tansu(
        ("history", "s3cret-256", Scram::Sha256),
        false,
        sasl("SASL_PLAINTEXT", "SCRAM-SHA-256", "history", "s3cret-256"),
    )
    .await;
    drains_exactly(&mut app, "scram256").await;
}

/// The broker refuses the password: nothing is consumed, the log has the broker's reason and
/// `/readyz` says no broker answers, and why.
#[actix_rt::test]
async fn a_password_the_broker_refuses_is_named_by_the_log_and_readyz() {
    let (_broker, mut app) = against_tansu(
        ("history", "the-right-one", Scram::Sha512),
        false,
        sasl("SASL_PLAINTEXT", "SCRAM-SHA-512", "history", "a-wrong-one"),
    )
    .await;
    app.start();
    let (_, reason) = app
        .wait_for_answer("/readyz", Duration::from_secs(60), |status, body| {
            status == 503
                && body.contains("no Kafka broker answers")
                && body.contains("Authentication")
        })
        .await;
    assert!(!reason.contains("a-wrong-one"), "{reason}");
    app.wait_for_log(
        &["kafka client error", "Authentication"],
        Duration::from_secs(10),
    )
    .await;
    assert!(!app.logs().contains("a-wrong-one"), "the password leaked");
    assert_eq!(app.db.count("history_events").await, 0);
}

#[actix_rt::test]
async fn oidc_tokens_come_from_the_provider_with_the_client_credentials_grant() {
    let provider = OidcProvider::start().unwrap_or_else(|err| panic!("{err}"));
    let mut app = TestApp::prepare(|o| {
        let properties = [
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
            (
                "sasl.oauthbearer.token.endpoint.url",
                &provider.token_endpoint(),
            ),
            ("sasl.oauthbearer.client.id", "history-service"),
            ("sasl.oauthbearer.client.secret", "oidc-s3cret"),
            ("sasl.oauthbearer.scope", "kafka"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        for (key, value) in property_env(&properties) {
            o.env(&key, value);
        }
    })
    .await;
    app.start();
    // Its token in hand, the client goes on to the broker, which speaks no SASL.
    app.wait_for_log(
        &["SASL Handshake not supported by broker", "OAUTHBEARER"],
        Duration::from_secs(30),
    )
    .await;
    let requests = provider.token_requests();
    assert!(!requests.is_empty(), "no token was asked for");
    // HTTP Basic: base64("history-service:oidc-s3cret").
    let credentials = "Basic aGlzdG9yeS1zZXJ2aWNlOm9pZGMtczNjcmV0";
    for request in &requests {
        assert_eq!(request["grant_type"], "client_credentials", "{request}");
        assert_eq!(request["scope"], "kafka", "{request}");
        assert_eq!(request["authorization"], credentials, "{request}");
    }
    let logs = app.logs();
    assert!(
        !logs.contains("OAUTHBEARER token") && !logs.contains("Failed to retrieve OIDC"),
        "the token was refused:\n{logs}"
    );
    assert!(!logs.contains("oidc-s3cret"), "the secret leaked");
}

#[actix_rt::test]
async fn kerberos_logs_in_from_the_keytab_and_asks_the_kdc_for_the_brokers_ticket() {
    let kdc = Kdc::start("HISTORY.TEST").unwrap_or_else(|err| panic!("{err}"));
    let keytab = kdc
        .add_principal_with_keytab("history")
        .unwrap_or_else(|err| panic!("{err}"));
    kdc.add_principal("kafka/127.0.0.1")
        .unwrap_or_else(|err| panic!("{err}"));
    let cache = kdc.dir().join("ccache");
    let mut app = TestApp::prepare(|o| {
        let properties = [
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "GSSAPI"),
            ("sasl.kerberos.service.name", "kafka"),
            ("sasl.kerberos.principal", "history@HISTORY.TEST"),
            ("sasl.kerberos.keytab", &keytab.display().to_string()),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        for (key, value) in property_env(&properties) {
            o.env(&key, value);
        }
        o.env("KRB5_CONFIG", kdc.krb5_conf().display().to_string());
        o.env("KRB5CCNAME", format!("FILE:{}", cache.display()));
    })
    .await;
    app.start();
    // kinit from the keytab: the KDC issues the service's ticket-granting ticket; then the
    // client (Cyrus SASL's GSSAPI, linked in) asks for the broker's service ticket.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let log = kdc.log();
        let tgt = log.lines().any(|line| {
            line.contains("AS_REQ")
                && line.contains("ISSUE")
                && line.contains("history@HISTORY.TEST")
        });
        let service = log.lines().any(|line| {
            line.contains("TGS_REQ")
                && line.contains("ISSUE")
                && line.contains("kafka/127.0.0.1@HISTORY.TEST")
        });
        if tgt && service {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the KDC did not issue both tickets:\n{log}\n{}",
            app.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cache.is_file(), "kinit wrote no ticket cache");
    assert!(
        !app.logs().contains("missing a GSSAPI module"),
        "{}",
        app.logs()
    );
}
