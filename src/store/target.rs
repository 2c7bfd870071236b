//! Where the History database is and how it is reached, read from the `database.*` settings:
//! the URL as tokio-postgres parses it, the password from `password_file` or `password`, and
//! TLS when the URL says `sslmode=require` (verified against `database.tls_ca_file` if one is
//! given, otherwise encrypted without verification, as libpq does for `require`).
//!
//! The configuration layer holds these settings as plain values and knows nothing of
//! PostgreSQL; they are parsed here, and `Settings::load` (in `app`) has them parsed at
//! start-up, so a bad URL or an unreadable password file fails there, naming its key.

use std::str::FromStr;
use std::time::Duration;

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use postgres_openssl::MakeTlsConnector;
use secrecy::ExposeSecret;
use tokio_postgres::config::SslMode;

use crate::config::{ConfigError, DatabaseSettings};

// Methods of the settings, defined in the layer that knows PostgreSQL so that the settings'
// own layer needs no PostgreSQL crate.
impl DatabaseSettings {
    /// The connection settings, with the password from `password_file` or `password` if set.
    pub fn postgres_config(&self) -> Result<tokio_postgres::Config, ConfigError> {
        // The parser's messages never echo option values, but the URL itself is never quoted.
        let mut config = tokio_postgres::Config::from_str(self.url.expose_secret())
            .map_err(|err| invalid("database.url", err.to_string()))?;
        if config.get_dbname().is_none() {
            return Err(invalid("database.url", "must name a database"));
        }
        if !self.password_file.is_empty() {
            let text = std::fs::read_to_string(&self.password_file).map_err(|err| {
                invalid(
                    "database.password_file",
                    format!("cannot read {}: {err}", self.password_file),
                )
            })?;
            config.password(text.trim_end_matches(['\r', '\n']));
        } else if !self.password.expose_secret().is_empty() {
            config.password(self.password.expose_secret());
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.connect_timeout());
        }
        // A peer that vanishes (a hung or failed-over server, a dropped route) is noticed by
        // the kernel: probes while idle, and a bound on unacknowledged data while busy.
        config
            .keepalives(true)
            .keepalives_idle(self.keepalives_idle())
            .keepalives_interval(self.keepalives_interval())
            .keepalives_retries(self.keepalives_retries)
            .tcp_user_timeout(self.tcp_user_timeout());
        Ok(config)
    }

    /// The deadlines of pooled sessions.
    pub fn session_limits(&self) -> SessionLimits {
        SessionLimits {
            statement_timeout: self.statement_timeout(),
            idle_in_transaction_timeout: self.idle_in_transaction_timeout(),
        }
    }

    /// The database's address for logs: host, port and name, never the user's password.
    pub fn display_target(&self) -> String {
        match self.postgres_config() {
            Ok(config) => describe_target(&config),
            Err(_) => "<invalid database.url>".to_owned(),
        }
    }
}

/// How long a pooled session may wait on the server, and the server on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// The deadline of one transaction, client side (`tokio::time::timeout` around all of it;
    /// the connection is then closed) and the server's `statement_timeout`.
    pub statement_timeout: Duration,
    /// The server's `idle_in_transaction_session_timeout`: a session its client left inside a
    /// transaction (frozen, gone) ends, and its locks with it.
    pub idle_in_transaction_timeout: Duration,
}

impl Default for SessionLimits {
    /// The defaults of `config/default.toml` (a test checks they agree).
    fn default() -> Self {
        SessionLimits {
            statement_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(60),
        }
    }
}

impl SessionLimits {
    /// The startup options that set the server's side of these limits.
    pub fn startup_options(&self) -> String {
        format!(
            "-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            self.statement_timeout.as_millis(),
            self.idle_in_transaction_timeout.as_millis()
        )
    }
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// `user@host:port/dbname` of a connection config, for logs and reports.
pub fn describe_target(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".to_owned());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}@{}:{}/{}",
        config.get_user().unwrap_or("?"),
        host,
        port,
        config.get_dbname().unwrap_or("?")
    )
}

/// How connections are secured.
#[derive(Clone)]
pub enum PgTls {
    /// Plain TCP (or a Unix socket): the URL does not require TLS.
    Plain,
    /// TLS, required by the URL.
    Tls(MakeTlsConnector),
}

impl PgTls {
    /// What `config` (parsed from `settings`) asks for: TLS set up if its URL requires it.
    pub fn for_settings(
        settings: &DatabaseSettings,
        config: &tokio_postgres::Config,
    ) -> Result<Self, ConfigError> {
        if config.get_ssl_mode() != SslMode::Require {
            return Ok(PgTls::Plain);
        }
        let invalid = |reason: String| invalid("database.tls_ca_file", reason);
        let mut builder = SslConnector::builder(SslMethod::tls_client())
            .map_err(|err| invalid(format!("cannot set up TLS: {err}")))?;
        if settings.tls_ca_file.is_empty() {
            builder.set_verify(SslVerifyMode::NONE);
        } else {
            builder
                .set_ca_file(&settings.tls_ca_file)
                .map_err(|err| invalid(format!("cannot load {}: {err}", settings.tls_ca_file)))?;
            builder.set_verify(SslVerifyMode::PEER);
        }
        Ok(PgTls::Tls(MakeTlsConnector::new(builder.build())))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::config::Settings;

    /// The built-in database settings with these environment overrides, as the configuration
    /// layer reads them (it does not parse the URL).
    fn database(pairs: &[(&str, &str)]) -> DatabaseSettings {
        let environment = pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        Settings::read_from(None, Some(environment))
            .expect("valid settings")
            .database
    }

    fn url(url: &str) -> DatabaseSettings {
        database(&[("HISTORY__DATABASE__URL", url)])
    }

    fn invalid_key(result: Result<tokio_postgres::Config, ConfigError>) -> &'static str {
        match result {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected an invalid key, got {other:?}"),
        }
    }

    #[test]
    fn the_target_names_user_host_port_and_database() {
        let settings = url("postgres://app@db.internal:6432/hist");
        assert_eq!(settings.display_target(), "app@db.internal:6432/hist");
        assert_eq!(
            describe_target(&settings.postgres_config().unwrap()),
            "app@db.internal:6432/hist"
        );
    }

    #[test]
    fn a_url_that_does_not_parse_or_names_no_database_is_named() {
        let bad_port = url("postgres://u@h:notaport/db");
        assert_eq!(invalid_key(bad_port.postgres_config()), "database.url");
        assert_eq!(bad_port.display_target(), "<invalid database.url>");
        let no_database = url("postgres://u@h:5432");
        assert_eq!(invalid_key(no_database.postgres_config()), "database.url");
    }

    #[test]
    fn the_password_never_appears_in_errors_or_the_target() {
        for bad in [
            "postgres://user:s3cr3tpw@host:notaport/db",
            "postgres://user:s3cr3tpw@host:5432",
            "postgres://user:s3cr3tpw@host:5432/db?sslmode=bogus",
            "not a url s3cr3tpw",
        ] {
            let err = url(bad).postgres_config().unwrap_err();
            assert!(
                !format!("{err} {err:?}").contains("s3cr3tpw"),
                "{bad}: {err}"
            );
        }
        let settings = url("postgres://user:s3cr3tpw@host:5432/db");
        let shown = format!("{settings:?} {}", settings.display_target());
        assert!(!shown.contains("s3cr3tpw"), "{shown}");
    }

    #[test]
    fn the_password_can_come_from_a_variable_or_a_file() {
        let settings = database(&[("HISTORY__DATABASE__PASSWORD", "frompassword")]);
        let config = settings.postgres_config().unwrap();
        assert_eq!(config.get_password(), Some(&b"frompassword"[..]));

        let path = std::env::temp_dir().join(format!(
            "history-password-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        writeln!(std::fs::File::create(&path).unwrap(), "fromfile").unwrap();
        let shown = path.display().to_string();
        let settings = database(&[
            ("HISTORY__DATABASE__PASSWORD", "frompassword"),
            ("HISTORY__DATABASE__PASSWORD_FILE", &shown),
        ]);
        let config = settings.postgres_config().unwrap();
        assert_eq!(config.get_password(), Some(&b"fromfile"[..]));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_tcp_bounds_and_session_limits_come_from_the_settings() {
        let defaults = database(&[]);
        assert_eq!(defaults.session_limits(), SessionLimits::default());
        let config = defaults.postgres_config().unwrap();
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(10));
        assert_eq!(
            config.get_keepalives_interval(),
            Some(Duration::from_secs(2))
        );
        assert_eq!(config.get_keepalives_retries(), Some(3));
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&Duration::from_secs(10))
        );

        let settings = database(&[
            ("HISTORY__DATABASE__STATEMENT_TIMEOUT_MS", "2500"),
            ("HISTORY__DATABASE__IDLE_IN_TRANSACTION_TIMEOUT_MS", "7000"),
        ]);
        let limits = settings.session_limits();
        assert_eq!(limits.statement_timeout, Duration::from_millis(2500));
        assert_eq!(
            limits.startup_options(),
            "-c statement_timeout=2500 -c idle_in_transaction_session_timeout=7000"
        );
    }

    #[test]
    fn an_unreadable_password_file_is_named() {
        let settings = database(&[(
            "HISTORY__DATABASE__PASSWORD_FILE",
            "/nonexistent/history-password",
        )]);
        assert_eq!(
            invalid_key(settings.postgres_config()),
            "database.password_file"
        );
    }
}
