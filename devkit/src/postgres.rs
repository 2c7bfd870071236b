//! A PostgreSQL for the demo and the benchmark: the configured server if it answers (its
//! database created if missing), otherwise — when the PostgreSQL binaries are installed — a
//! throwaway cluster in a temporary directory, removed when dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tracing::info;

use history_service::store::migrate;

#[derive(Debug, thiserror::Error)]
pub enum DevPostgresError {
    #[error(
        "PostgreSQL does not answer at {target} and no PostgreSQL binaries were found to start a \
         throwaway cluster (looked in /usr/lib/postgresql/*/bin and PATH)"
    )]
    Unavailable { target: String },
    #[error("throwaway PostgreSQL cluster: {0}")]
    Throwaway(String),
    #[error(transparent)]
    Store(#[from] history_service::store::StoreError),
}

/// The database the demo uses, and the throwaway cluster behind it, if any.
pub struct DevDatabase {
    pub config: tokio_postgres::Config,
    /// The URL to use instead of the configured one (a throwaway cluster's).
    pub url_override: Option<String>,
    pub throwaway: Option<ThrowawayCluster>,
}

/// Uses the configured server, or starts a throwaway one; creates the database if missing.
pub async fn prepare(config: &tokio_postgres::Config) -> Result<DevDatabase, DevPostgresError> {
    let mut admin = config.clone();
    admin.dbname("postgres");
    admin.connect_timeout(Duration::from_secs(3));
    let (config, throwaway) = match migrate::connect(&admin).await {
        Ok(_) => (config.clone(), None),
        Err(_) => {
            let target = history_service::store::describe_target(config);
            let bin = find_binaries().ok_or(DevPostgresError::Unavailable {
                target: target.clone(),
            })?;
            info!(%target, "PostgreSQL does not answer: starting a throwaway cluster");
            let cluster = ThrowawayCluster::start(&bin, &[])?;
            let mut local = tokio_postgres::Config::new();
            local
                .host_path(&cluster.dir)
                .port(cluster.port)
                .user("postgres")
                .dbname(config.get_dbname().unwrap_or("history"));
            (local, Some(cluster))
        }
    };
    if migrate::create_database_if_missing(&history_service::store::Database::plain(config.clone()))
        .await?
    {
        info!(database = %history_service::store::describe_target(&config), "database created");
    }
    let url_override = throwaway
        .as_ref()
        .map(|cluster| cluster.url(config.get_dbname().unwrap_or("history")));
    Ok(DevDatabase {
        config,
        url_override,
        throwaway,
    })
}

fn find_binaries() -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().or_else(|| {
        std::env::var_os("PATH")
            .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("initdb").is_file()))
    })
}

/// A PostgreSQL cluster in a temporary directory, listening only on a Unix socket there: no
/// TCP port to find free (PostgreSQL binds its sockets itself and takes none handed over, so a
/// port picked for it could be taken before it binds). Stopped and deleted on drop.
pub struct ThrowawayCluster {
    /// Its directory: the data, the log, and the socket.
    pub dir: PathBuf,
    /// The port in the socket's name (`.s.PGSQL.<port>`); nothing listens on it over TCP.
    pub port: u16,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
}

impl ThrowawayCluster {
    /// Starts a cluster with the newest PostgreSQL binaries installed, with extra server
    /// settings (`name=value`, as for `postgres -c`).
    pub fn start_installed(settings: &[&str]) -> Result<Self, DevPostgresError> {
        let bin = find_binaries().ok_or(DevPostgresError::Unavailable {
            target: "a throwaway cluster".into(),
        })?;
        Self::start(&bin, settings)
    }

    /// The URL of a database on this cluster: its socket directory as the host,
    /// percent-encoded (`postgres://postgres@%2Ftmp%2Fhistory-pg-…:5432/dbname`).
    pub fn url(&self, dbname: &str) -> String {
        let dir = self.dir.display().to_string();
        let host = percent_encoding::utf8_percent_encode(&dir, percent_encoding::NON_ALPHANUMERIC);
        format!("postgres://postgres@{host}:{}/{dbname}", self.port)
    }

    /// The path of its Unix socket (`<dir>/.s.PGSQL.<port>`), for a proxy to forward to.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join(format!(".s.PGSQL.{}", self.port))
    }

    /// Restarts the server (a fast shutdown: sessions are cut, committed work is kept).
    pub fn restart(&self) -> Result<(), DevPostgresError> {
        let data = self.dir.join("data").display().to_string();
        // The log file again: without it the server would write to (and hold open) our pipe.
        let log = self.dir.join("log").display().to_string();
        self.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-m", "fast", "-w", "restart"],
        )
    }

    fn start(bin: &Path, settings: &[&str]) -> Result<Self, DevPostgresError> {
        let fail = |what: &str, err: &dyn std::fmt::Display| {
            DevPostgresError::Throwaway(format!("{what}: {err}"))
        };
        // PostgreSQL refuses to run as root: run it as the `postgres` user then.
        let run_as = if unsafe { libc::geteuid() } == 0 {
            Some(postgres_user().ok_or_else(|| {
                DevPostgresError::Throwaway("running as root and no `postgres` user exists".into())
            })?)
        } else {
            None
        };
        let dir = std::env::temp_dir().join(format!("history-pg-{}", rand::random::<u64>()));
        std::fs::create_dir(&dir).map_err(|e| fail("create its directory", &e))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| fail("hand its directory to postgres", &e))?;
        }
        // Only the socket's name: the directory is the cluster's own.
        let port = 5432;
        let cluster = ThrowawayCluster {
            dir,
            port,
            bin: bin.to_path_buf(),
            run_as,
        };
        let data = cluster.dir.join("data");
        cluster.run(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        let mut options = format!(
            "-p {port} -k {} -c listen_addresses='' -c fsync=off",
            cluster.dir.display()
        );
        for setting in settings {
            options.push_str(&format!(" -c {setting}"));
        }
        cluster.run(
            "pg_ctl",
            &[
                "-D",
                &data.display().to_string(),
                "-o",
                &options,
                "-l",
                &cluster.dir.join("log").display().to_string(),
                "-w",
                "start",
            ],
        )?;
        Ok(cluster)
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), DevPostgresError> {
        let mut command = Command::new(self.bin.join(program));
        command.args(args).current_dir(&self.dir);
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        let output = command
            .output()
            .map_err(|e| DevPostgresError::Throwaway(format!("{program}: {e}")))?;
        if !output.status.success() {
            return Err(DevPostgresError::Throwaway(format!(
                "{program} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(())
    }
}

impl Drop for ThrowawayCluster {
    fn drop(&mut self) {
        let data = self.dir.join("data").display().to_string();
        let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn postgres_user() -> Option<(u32, u32)> {
    let name = std::ffi::CString::new("postgres").ok()?;
    // SAFETY: getpwnam returns a pointer to static storage or null; it is read at once.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return None;
    }
    let entry = unsafe { &*entry };
    Some((entry.pw_uid, entry.pw_gid))
}
