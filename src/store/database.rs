//! Where the History database is and how to reach it: the connection settings and, when the
//! URL says `sslmode=require`, TLS (verified against `database.tls_ca_file` if one is given,
//! otherwise encrypted without verification, as libpq does for `require`).

use std::time::Duration;

use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use postgres_openssl::MakeTlsConnector;
use tokio_postgres::config::SslMode;
use tokio_postgres::{Client, NoTls};

use super::pool::{PgManager, PgPool, StoreError};
use crate::config::{ConfigError, DatabaseSettings};

/// How connections are secured.
#[derive(Clone)]
pub enum PgTls {
    /// Plain TCP (or a Unix socket): the URL does not require TLS.
    Plain,
    /// TLS, required by the URL.
    Tls(MakeTlsConnector),
}

/// A database to connect to.
#[derive(Clone)]
pub struct Database {
    pub config: tokio_postgres::Config,
    pub tls: PgTls,
}

impl Database {
    /// A database reached without TLS.
    pub fn plain(config: tokio_postgres::Config) -> Self {
        Database {
            config,
            tls: PgTls::Plain,
        }
    }

    /// The configured database, with TLS set up if its URL requires it.
    pub fn from_settings(settings: &DatabaseSettings) -> Result<Self, ConfigError> {
        let config = settings.postgres_config()?;
        let tls = if config.get_ssl_mode() == SslMode::Require {
            let invalid = |reason: String| ConfigError::Invalid {
                key: "database.tls_ca_file",
                reason,
            };
            let mut builder = SslConnector::builder(SslMethod::tls_client())
                .map_err(|err| invalid(format!("cannot set up TLS: {err}")))?;
            if settings.tls_ca_file.is_empty() {
                builder.set_verify(SslVerifyMode::NONE);
            } else {
                builder.set_ca_file(&settings.tls_ca_file).map_err(|err| {
                    invalid(format!("cannot load {}: {err}", settings.tls_ca_file))
                })?;
                builder.set_verify(SslVerifyMode::PEER);
            }
            PgTls::Tls(MakeTlsConnector::new(builder.build()))
        } else {
            PgTls::Plain
        };
        Ok(Database { config, tls })
    }

    /// `user@host:port/dbname`, for logs: never the password.
    pub fn target(&self) -> String {
        crate::config::describe_target(&self.config)
    }

    /// One connection outside any pool (migrations, verify, tools).
    pub async fn connect(&self) -> Result<Client, StoreError> {
        let client = match &self.tls {
            PgTls::Plain => {
                let (client, connection) = self.config.connect(NoTls).await?;
                tokio::spawn(drive(connection));
                client
            }
            PgTls::Tls(tls) => {
                let (client, connection) = self.config.connect(tls.clone()).await?;
                tokio::spawn(drive(connection));
                client
            }
        };
        Ok(client)
    }

    /// A pool that connects lazily: the service starts (not ready) while the database is down.
    pub fn pool(&self, size: u32, connect_timeout: Duration) -> PgPool {
        let builder = bb8::Pool::builder()
            .max_size(size)
            .min_idle(Some(0))
            .connection_timeout(connect_timeout)
            // No test query on every checkout: it is a round trip per transaction, and a dead
            // connection shows up anyway — as a failed (Unknown, retried) transaction, after
            // which the pool drops it as broken.
            .test_on_check_out(false);
        PgPool::build(
            builder,
            PgManager::new(self.config.clone(), self.tls.clone()),
        )
    }
}

async fn drive<T: std::future::Future<Output = Result<(), tokio_postgres::Error>>>(connection: T) {
    if let Err(err) = connection.await {
        tracing::debug!(error = %super::error::describe(&err), "database connection closed");
    }
}
