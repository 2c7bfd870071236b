//! Security: librdkafka properties and secret files checked at start-up, naming the key and
//! never the value; SASL settings passed through with no secret in the logs; TLS to PostgreSQL,
//! verified against a CA file.

use std::process::Command;
use std::time::Duration;

use history_devkit::test_app::TestApp;

use crate::common::TestDb;

#[test]
fn an_unknown_librdkafka_property_fails_at_start_up_naming_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .arg("run")
        .env("HISTORY__DATABASE__MIGRATE_ON_START", "false")
        .env("HISTORY__HTTP__ENABLED", "false")
        .env("HISTORY__KAFKA__PROPERTIES__BOGUS_SETTING", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("bogus.setting"), "{stderr}");
}

#[test]
fn an_unreadable_secret_file_fails_at_start_up_naming_its_key() {
    let output = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .arg("run")
        .env(
            "HISTORY__KAFKA__PROPERTY_FILES__SASL_PASSWORD",
            "/nonexistent/secret",
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("kafka.property_files"), "{stderr}");
}

#[actix_rt::test]
async fn security_settings_pass_through_and_secrets_never_reach_the_logs() {
    let secret_dir =
        std::env::temp_dir().join(format!("history-secrets-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("kafka"), "k4fk4-s3cr3t\n").unwrap();
    std::fs::write(secret_dir.join("db"), "").unwrap();
    let mut app = TestApp::spawn(|o| {
        o.external_brokers = Some("127.0.0.1:1".into());
        o.env("RUST_LOG", "debug")
            .env("HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL", "SASL_SSL")
            .env(
                "HISTORY__KAFKA__PROPERTIES__SASL_MECHANISMS",
                "SCRAM-SHA-512",
            )
            .env("HISTORY__KAFKA__PROPERTIES__SASL_USERNAME", "history")
            .env(
                "HISTORY__KAFKA__PROPERTY_FILES__SASL_PASSWORD",
                secret_dir.join("kafka").display().to_string(),
            )
            .env("HISTORY__DATABASE__PASSWORD", "pg-s3cr3t");
    })
    .await;
    // The consumer accepts the settings (SASL over TLS is built in) and keeps trying to reach
    // the broker: its first failed attempt is logged; it does not exit with a configuration
    // error.
    let service = app.process();
    let seen = service.wait_for_line("kafka client error", Duration::from_secs(30));
    assert!(seen.is_some(), "{}", service.logs());
    assert_eq!(service.exit_status(), None, "{}", service.logs());
    app.stop();
    let logs = app.logs();
    assert!(logs.contains("history-service starting"), "{logs}");
    assert!(
        !logs.contains("k4fk4-s3cr3t"),
        "the Kafka password leaked:\n{logs}"
    );
    assert!(
        !logs.contains("pg-s3cr3t"),
        "the database password leaked:\n{logs}"
    );
    let _ = std::fs::remove_dir_all(&secret_dir);
}

#[actix_rt::test]
async fn tls_is_used_when_the_url_requires_it_and_verified_against_a_ca_file() {
    use history_service::config::DatabaseSettings;
    use history_service::store::Database;
    use secrecy::SecretString;

    let db = TestDb::create().await;
    let admin = crate::common::admin_client().await;
    let ssl: String = admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    assert_eq!(
        ssl, "on",
        "this test needs the local PostgreSQL to offer TLS (Debian's default)"
    );
    let cert: String = admin
        .query_one("SHOW ssl_cert_file", &[])
        .await
        .unwrap()
        .get(0);
    let settings = |host: &str, ca: &str| DatabaseSettings {
        url: SecretString::from(format!(
            "postgres://postgres@{host}:5432/{}?sslmode=require",
            db.name
        )),
        password: SecretString::from(String::new()),
        password_file: String::new(),
        tls_ca_file: ca.to_owned(),
        pool_size: 2,
        connect_timeout_ms: 3000,
        migrate_on_start: true,
        // The built-in bounds of every wait.
        ..history_service::config::Settings::read_from(None, Some(Default::default()))
            .expect("the built-in settings are valid")
            .database
    };
    let uses_tls = |client: tokio_postgres::Client| async move {
        let row = client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, bool>(0)
    };

    // sslmode=require: encrypted.
    let database = Database::from_settings(&settings("127.0.0.1", "")).unwrap();
    assert!(uses_tls(database.connect().await.unwrap()).await);
    // With the CA file, the certificate and the host name are checked: the server's
    // certificate names localhost, so 127.0.0.1 is refused and localhost accepted.
    let wrong_host = Database::from_settings(&settings("127.0.0.1", &cert)).unwrap();
    assert!(
        wrong_host.connect().await.is_err(),
        "verification must reject a host mismatch"
    );
    let verified = Database::from_settings(&settings("localhost", &cert)).unwrap();
    assert!(uses_tls(verified.connect().await.unwrap()).await);
    // The pool uses it too.
    let pool = verified.pool(2, Duration::from_secs(3));
    let conn = pool.get().await.unwrap();
    let row = conn
        .client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
    drop(conn);
    // A CA file that cannot be read is a configuration error naming its key.
    let err = Database::from_settings(&settings("localhost", "/nonexistent/ca.pem"))
        .err()
        .expect("an unreadable CA file is refused");
    assert!(err.to_string().contains("database.tls_ca_file"), "{err}");
}
