//! Failures talking to the History database, and the one way they are put into words: with
//! what the server said (severity, SQLSTATE, message, detail, hint, constraint) or, when it
//! was never reached, the whole cause chain. `tokio_postgres::Error` alone says "db error".

use std::error::Error;

use tokio_postgres::error::DbError;

/// Any failure talking to the History database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection within the pool's timeout: the database is down or unreachable.
    #[error("no database connection available: {0}")]
    Unavailable(String),
    /// Not a `source`: the text already carries the server's reason and the causes, and
    /// chain printers (`anyhow`'s `{:#}`) would repeat them.
    #[error("database error: {}", describe(.0))]
    Db(tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Migration(String),
    /// The work did not end within its deadline (`database.statement_timeout_ms`): it was
    /// abandoned and its connection closed. Whether the server applied it is unknown.
    #[error(
        "no answer from the database within {} ms (database.statement_timeout_ms): abandoned, \
         its connection closed",
        .0.as_millis()
    )]
    TimedOut(std::time::Duration),
}

impl StoreError {
    /// The server's report, if the server answered with an error.
    pub fn db_error(&self) -> Option<&DbError> {
        match self {
            StoreError::Db(err) => err.as_db_error(),
            _ => None,
        }
    }

    /// Whether the work ran out of time: our deadline expired, or the server cancelled the
    /// statement (SQLSTATE 57014, `statement_timeout`, which is set to the same deadline).
    pub fn is_deadline(&self) -> bool {
        match self {
            StoreError::TimedOut(_) => true,
            _ => self
                .db_error()
                .is_some_and(|db| db.code().code() == "57014"),
        }
    }

    /// Whether the failure says the session, not the work, is bad, so that retrying on it (or
    /// on any session opened before it) is pointless: a deadline expired (a hung server or
    /// network), or the server reported its own state — class 25 (a read-only session: a standby
    /// or a demoted primary), 57P (shutting down, crashed, not accepting connections yet) or 53
    /// (out of resources, too many connections).
    pub fn is_session_fault(&self) -> bool {
        match self {
            StoreError::TimedOut(_) => true,
            _ => self
                .db_error()
                .is_some_and(|db| is_server_state(db.code().code())),
        }
    }
}

/// SQLSTATEs that describe the server's state rather than the statement's.
pub(crate) fn is_server_state(sqlstate: &str) -> bool {
    sqlstate.starts_with("25") || sqlstate.starts_with("57P") || sqlstate.starts_with("53")
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(err: tokio_postgres::Error) -> Self {
        StoreError::Db(err)
    }
}

impl From<bb8::RunError<tokio_postgres::Error>> for StoreError {
    fn from(err: bb8::RunError<tokio_postgres::Error>) -> Self {
        match err {
            bb8::RunError::User(err) => StoreError::Db(err),
            bb8::RunError::TimedOut => {
                StoreError::Unavailable("timed out waiting for a connection".to_owned())
            }
        }
    }
}

/// A database error on one line: the server's report if it answered, else the error and its
/// causes (`error connecting to server: Connection refused (os error 111)`).
pub(crate) fn describe(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => describe_db(db),
        None => with_causes(err),
    }
}

/// An error and every cause under it, on one line; a PostgreSQL report among the causes is
/// given in full (a migration tool's own message often says no more than "db error").
pub(crate) fn with_causes(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let db = cause.downcast_ref::<tokio_postgres::Error>().map_or_else(
            || cause.downcast_ref::<DbError>(),
            tokio_postgres::Error::as_db_error,
        );
        text.push_str(": ");
        if let Some(db) = db {
            text.push_str(&describe_db(db));
            break;
        }
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `ERROR 42P01: relation "history_events" does not exist`, with the detail, hint, constraint
/// and context when the server gave them.
fn describe_db(db: &DbError) -> String {
    let mut text = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    let extras = [
        ("detail", db.detail()),
        ("hint", db.hint()),
        ("constraint", db.constraint()),
        ("context", db.where_()),
    ];
    for (name, value) in extras {
        if let Some(value) = value {
            text.push_str(&format!("; {name}: {}", value.replace('\n', " ")));
        }
    }
    text.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_shutdown_and_resource_states_are_server_states() {
        for sqlstate in [
            "25006", "25P02", "57P01", "57P02", "57P03", "53300", "53100",
        ] {
            assert!(is_server_state(sqlstate), "{sqlstate}");
        }
        // A constraint, a bad value, a missing table, a deadlock, a cancelled statement: about
        // the work, not the session.
        for sqlstate in ["23505", "22001", "42P01", "40P01", "57014", "08006"] {
            assert!(!is_server_state(sqlstate), "{sqlstate}");
        }
        assert!(StoreError::TimedOut(std::time::Duration::from_secs(1)).is_session_fault());
        assert!(!StoreError::Unavailable("down".into()).is_session_fault());
    }
}
