//! The History database: where it is (see [`super::target`]) and the ways of connecting to it,
//! one connection or a pool.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use super::error::StoreError;
use super::pool::{PgManager, PgPool};
use super::target::{PgTls, SessionLimits, describe_target};
use crate::config::{ConfigError, DatabaseSettings};

/// A database to connect to.
#[derive(Clone)]
pub struct Database {
    pub config: tokio_postgres::Config,
    pub tls: PgTls,
    /// The deadlines of pooled sessions (one connection of [`Database::connect`], for
    /// migrations and tools, has only the TCP bounds of `config`).
    pub limits: SessionLimits,
}

impl Database {
    /// A database reached without TLS.
    pub fn plain(config: tokio_postgres::Config) -> Self {
        Database {
            config,
            tls: PgTls::Plain,
            limits: SessionLimits::default(),
        }
    }

    /// The configured database, with TLS set up if its URL requires it.
    pub fn from_settings(settings: &DatabaseSettings) -> Result<Self, ConfigError> {
        let config = settings.postgres_config()?;
        let tls = PgTls::for_settings(settings, &config)?;
        Ok(Database {
            config,
            tls,
            limits: settings.session_limits(),
        })
    }

    /// `user@host:port/dbname`, for logs: never the password.
    pub fn target(&self) -> String {
        describe_target(&self.config)
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
            PgManager::new(self.config.clone(), self.tls.clone(), self.limits),
        )
    }
}

/// A pool on a database reached without TLS (tests and tools).
pub fn connect_pool(
    config: tokio_postgres::Config,
    size: u32,
    connect_timeout: Duration,
) -> PgPool {
    Database::plain(config).pool(size, connect_timeout)
}

async fn drive<T: std::future::Future<Output = Result<(), tokio_postgres::Error>>>(connection: T) {
    if let Err(err) = connection.await {
        tracing::debug!(error = %super::error::describe(&err), "database connection closed");
    }
}
