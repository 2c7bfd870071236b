//! PostgreSQL's side of a phase: the CPU of the backends serving one database.

use std::time::Duration;

use super::report::PgCpu;
use crate::DevError;
use crate::cpu::{CpuTally, read_ticks};
use history_service::store::Database;

/// The backends connected to one database, found through `pg_stat_activity` from a session on
/// another database (so the observer is not among them).
pub(super) struct Backends {
    admin: tokio_postgres::Client,
    database: String,
    autovacuum: std::collections::HashSet<u32>,
}

impl Backends {
    pub(super) async fn connect(
        server: &tokio_postgres::Config,
        database: &tokio_postgres::Config,
    ) -> Result<Self, DevError> {
        let mut admin = server.clone();
        admin.dbname("postgres");
        Ok(Backends {
            admin: Database::plain(admin).connect().await?,
            database: database.get_dbname().unwrap_or_default().to_owned(),
            autovacuum: Default::default(),
        })
    }

    /// The backends' CPU ticks now (none if the server cannot be seen from here).
    pub(super) async fn ticks(&mut self) -> Vec<(u32, u64)> {
        let rows = self
            .admin
            .query(
                "SELECT pid, backend_type FROM pg_stat_activity WHERE datname = $1",
                &[&self.database],
            )
            .await
            .unwrap_or_default();
        let mut pids = Vec::with_capacity(rows.len());
        for row in rows {
            let pid = row.get::<_, i32>(0) as u32;
            if row
                .get::<_, Option<&str>>(1)
                .is_some_and(|kind| kind.starts_with("autovacuum"))
            {
                self.autovacuum.insert(pid);
            }
            pids.push(pid);
        }
        read_ticks(pids)
    }

    pub(super) fn cpu(&self, tally: &CpuTally) -> PgCpu {
        PgCpu {
            total: tally.spent(),
            autovacuum: tally.spent_by(|pid| self.autovacuum.contains(&pid)),
        }
    }

    /// Runs `work`, sampling the backends' CPU meanwhile (backends come and go: autovacuum
    /// workers, lazily connected pools).
    pub(super) async fn during<F: std::future::Future>(&mut self, work: F) -> (F::Output, PgCpu) {
        let mut tally = CpuTally::start(self.ticks().await);
        futures::pin_mut!(work);
        loop {
            tokio::select! {
                output = &mut work => {
                    tally.record(self.ticks().await);
                    return (output, self.cpu(&tally));
                }
                _ = actix_rt::time::sleep(Duration::from_millis(20)) => {
                    tally.record(self.ticks().await);
                }
            }
        }
    }
}
