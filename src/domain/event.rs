//! The ticket status event: what a Kafka record becomes once `decode` has validated it, so
//! every event past that boundary is known to be storable.

use chrono::{DateTime, FixedOffset};

/// One logical ticket status transition, validated.
///
/// Equality is the content comparison behind conflicting duplicates: every field equal, and
/// `changed_at` the same instant whatever offset it was written with (chrono compares the
/// instants; the database keeps only the instant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEvent {
    pub event_id: String,
    pub ticket_id: String,
    pub from_status: String,
    pub to_status: String,
    pub changed_at: DateTime<FixedOffset>,
}

/// The instant PostgreSQL will store for `changed_at`, keeping the offset it was written with.
///
/// A `timestamptz` holds whole microseconds and has no leap seconds, so the decoder settles
/// both here, once: the event past the decoder is exactly what the database stores and reads
/// back, and a byte-identical redelivery compares equal to the stored row.
/// - Digits below the microsecond are truncated (towards the past): the value never moves into
///   the next second, and tokio-postgres, which sends microseconds, then has nothing left to
///   drop. (PostgreSQL rounds such text itself; the service sends binary values, not text.)
/// - A leap second (`23:59:60.x`) folds into the first second of the next minute
///   (`00:00:00.x`), as PostgreSQL does with such text input.
///
/// Neither loses information the projection needs: producers' clocks are not that precise,
/// and the order of a ticket's events is their Kafka order, not their timestamps.
pub fn storable_instant(changed_at: DateTime<FixedOffset>) -> DateTime<FixedOffset> {
    // `timestamp_micros` counts a leap second's extra nanoseconds into the next second and
    // drops the sub-microsecond digits (flooring: the sub-second part is never negative).
    DateTime::from_timestamp_micros(changed_at.timestamp_micros())
        .map(|utc| utc.with_timezone(changed_at.offset()))
        // Unreachable for RFC 3339 input (years 0000-9999 are in range); kept total anyway.
        .unwrap_or(changed_at)
}
