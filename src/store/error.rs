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
}

impl StoreError {
    /// The server's report, if the server answered with an error.
    pub fn db_error(&self) -> Option<&DbError> {
        match self {
            StoreError::Db(err) => err.as_db_error(),
            _ => None,
        }
    }
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
pub fn describe(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => describe_db(db),
        None => with_causes(err),
    }
}

/// An error and every cause under it, on one line; a PostgreSQL report among the causes is
/// given in full (a migration tool's own message often says no more than "db error").
pub fn with_causes(err: &dyn Error) -> String {
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
