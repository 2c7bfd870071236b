//! A throwaway database per test on the local PostgreSQL server: created with a unique name,
//! optionally migrated, dropped (with its connections) when dropped.

use std::str::FromStr;

use history_service::store::{self, PgPool};

/// The server tests use; override with `HISTORY_TEST_DATABASE_URL` (no database name needed).
pub fn base_url() -> String {
    std::env::var("HISTORY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

/// The test server's TCP address (for a proxy to forward to); `None` when it is reached
/// through a Unix socket.
pub fn server_address() -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let config = base_config();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => {
            (host.as_str(), port).to_socket_addrs().ok()?.next()
        }
        _ => None,
    }
}

fn base_config() -> tokio_postgres::Config {
    tokio_postgres::Config::from_str(&base_url()).expect("HISTORY_TEST_DATABASE_URL is not a URL")
}

/// A database of its own, created empty and dropped (with its connections) when dropped.
pub struct TestDb {
    pub name: String,
    pub config: tokio_postgres::Config,
}

impl TestDb {
    /// An empty database with a unique name.
    pub async fn create() -> TestDb {
        let name = format!("history_test_{:016x}", rand::random::<u64>());
        let admin = admin_client().await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("cannot create a test database: is PostgreSQL running?");
        let mut config = base_config();
        config.dbname(&name);
        TestDb { name, config }
    }

    /// A database with the service's schema applied.
    pub async fn migrated() -> TestDb {
        let db = TestDb::create().await;
        let mut client = db.client().await;
        store::migrate::run_migrations(&mut client).await.unwrap();
        db
    }

    pub fn url(&self) -> String {
        format!("{}/{}", base_url().trim_end_matches('/'), self.name)
    }

    /// [`TestDb::url`] with the server's address replaced by `via` (a proxy in front of it).
    pub fn url_via(&self, via: std::net::SocketAddr) -> String {
        let mut url = url::Url::parse(&self.url()).expect("HISTORY_TEST_DATABASE_URL is a URL");
        url.set_host(Some(&via.ip().to_string()))
            .expect("the URL takes a host");
        url.set_port(Some(via.port()))
            .expect("the URL takes a port");
        url.to_string()
    }

    /// Slows every write transaction of history rows by `seconds` (a statement-level trigger
    /// sleeping inside it), so that a drain lasts long enough for what a test does during it.
    pub async fn slow_each_write(&self, seconds: f64) {
        self.client()
            .await
            .batch_execute(&format!(
                "CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END $$;
                 CREATE TRIGGER slow_write AFTER INSERT ON history_events
                 FOR EACH STATEMENT EXECUTE FUNCTION slow_write();"
            ))
            .await
            .unwrap();
    }

    /// Undoes [`TestDb::slow_each_write`]: writes go at the database's pace again.
    pub async fn unslow_writes(&self) {
        self.client()
            .await
            .batch_execute("DROP TRIGGER slow_write ON history_events")
            .await
            .unwrap();
    }

    /// How many sessions of this database wait for a lock now: a write held up in the database
    /// by another session.
    pub async fn lock_waiters(&self) -> i64 {
        self.client()
            .await
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        store::migrate::connect(&self.config).await.unwrap()
    }

    pub fn pool(&self, size: u32) -> PgPool {
        store::connect_pool(self.config.clone(), size, std::time::Duration::from_secs(5))
    }

    /// Makes every history row cost `seconds` inside its transaction (a trigger sleeping): a
    /// slow disk, or a trigger of the user's own.
    pub async fn slow_history_rows(&self, seconds: f64) {
        self.client()
            .await
            .batch_execute(&format!(
                "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN PERFORM pg_sleep({seconds}); RETURN NEW; END $$;
                 CREATE TRIGGER slow_row BEFORE INSERT ON history_events
                 FOR EACH ROW EXECUTE FUNCTION slow_row();"
            ))
            .await
            .unwrap();
    }

    pub async fn count(&self, table: &str) -> i64 {
        self.client()
            .await
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap()
            .get(0)
    }

    /// Ends every session on this database but the caller's.
    pub async fn terminate_backends(&self) -> i64 {
        admin_client()
            .await
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&self.name],
            )
            .await
            .unwrap()
            .len() as i64
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs outside any runtime guarantee, so the DROP gets a thread and runtime of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let admin = admin_client().await;
                let _ = admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await;
            });
        })
        .join();
    }
}

/// A session on the server's `postgres` database, for creating and dropping databases.
pub async fn admin_client() -> tokio_postgres::Client {
    let mut config = base_config();
    config.dbname("postgres");
    store::migrate::connect(&config)
        .await
        .expect("cannot connect to PostgreSQL: is it running?")
}
