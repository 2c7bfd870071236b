//! The validating decoder: a record's bytes become a [`HistoryEvent`] only through
//! [`HistoryEvent::decode`]. Anything else yields a [`DecodeError`] that names the field and the
//! reason: that is what the dead-letter table stores.

use std::borrow::Cow;
use std::fmt;

use chrono::DateTime;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::event::{HistoryEvent, storable_instant};

/// Longest accepted `event_id` and `ticket_id`, in characters. Identifiers in the Ticket service
/// are short (UUIDs, `event-ticket-900`); anything far longer is a producer bug, not data.
pub const MAX_ID_CHARS: usize = 256;
/// Longest accepted status name, in characters.
pub const MAX_STATUS_CHARS: usize = 64;
/// Longest accepted `changed_at` text; RFC 3339 with nanoseconds and an offset is 35 characters.
pub const MAX_TIMESTAMP_CHARS: usize = 64;

/// The payload fields the decoder knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    EventId,
    TicketId,
    FromStatus,
    ToStatus,
    ChangedAt,
}

impl Field {
    pub const ALL: [Field; 5] = [
        Field::EventId,
        Field::TicketId,
        Field::FromStatus,
        Field::ToStatus,
        Field::ChangedAt,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Field::EventId => "event_id",
            Field::TicketId => "ticket_id",
            Field::FromStatus => "from_status",
            Field::ToStatus => "to_status",
            Field::ChangedAt => "changed_at",
        }
    }

    fn from_key(key: &str) -> Option<Field> {
        // A match rather than a search of `ALL`: compared by length first, once per key of
        // every record. `names_are_their_keys` keeps the two lists the same.
        Some(match key {
            "event_id" => Field::EventId,
            "ticket_id" => Field::TicketId,
            "from_status" => Field::FromStatus,
            "to_status" => Field::ToStatus,
            "changed_at" => Field::ChangedAt,
            _ => return None,
        })
    }

    fn max_chars(self) -> usize {
        match self {
            Field::EventId | Field::TicketId => MAX_ID_CHARS,
            Field::FromStatus | Field::ToStatus => MAX_STATUS_CHARS,
            Field::ChangedAt => MAX_TIMESTAMP_CHARS,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a record is not a valid event. Every variant is permanent: redelivering the same bytes
/// gives the same error, so such a record is dead-lettered rather than retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record has no payload (null value or tombstone)")]
    NullPayload,
    #[error("payload is {size} bytes, over the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("payload is not valid UTF-8: {detail}")]
    NotUtf8 { detail: String },
    #[error("payload is not valid JSON: {detail}")]
    NotJson { detail: String },
    #[error("payload is JSON {found}, not an object")]
    NotObject { found: &'static str },
    #[error("field `{field}` is missing")]
    MissingField { field: Field },
    #[error("field `{field}` appears more than once")]
    DuplicateField { field: Field },
    #[error("field `{field}` must be a string, found {found}")]
    WrongType { field: Field, found: &'static str },
    #[error("field `{field}` is empty")]
    EmptyField { field: Field },
    #[error("field `{field}` is {chars} characters long, over the limit of {limit}")]
    TooLong {
        field: Field,
        chars: usize,
        limit: usize,
    },
    #[error("field `{field}` contains a control character")]
    ControlCharacter { field: Field },
    #[error("field `changed_at` is not an RFC 3339 timestamp with an offset: {detail}")]
    BadTimestamp { detail: String },
}

impl DecodeError {
    /// Every [`DecodeError::code`], for tools that take a code (`dead-letters --reason`).
    pub const CODES: [&'static str; 12] = [
        "null_payload",
        "too_large",
        "not_utf8",
        "not_json",
        "not_object",
        "missing_field",
        "duplicate_field",
        "wrong_type",
        "empty_field",
        "too_long",
        "control_character",
        "bad_timestamp",
    ];

    /// A short, stable label for metrics and for the `reason_code` column.
    pub fn code(&self) -> &'static str {
        match self {
            DecodeError::NullPayload => "null_payload",
            DecodeError::TooLarge { .. } => "too_large",
            DecodeError::NotUtf8 { .. } => "not_utf8",
            DecodeError::NotJson { .. } => "not_json",
            DecodeError::NotObject { .. } => "not_object",
            DecodeError::MissingField { .. } => "missing_field",
            DecodeError::DuplicateField { .. } => "duplicate_field",
            DecodeError::WrongType { .. } => "wrong_type",
            DecodeError::EmptyField { .. } => "empty_field",
            DecodeError::TooLong { .. } => "too_long",
            DecodeError::ControlCharacter { .. } => "control_character",
            DecodeError::BadTimestamp { .. } => "bad_timestamp",
        }
    }

    /// The payload field the error is about, if it is about one.
    pub fn field(&self) -> Option<Field> {
        match self {
            DecodeError::MissingField { field }
            | DecodeError::DuplicateField { field }
            | DecodeError::WrongType { field, .. }
            | DecodeError::EmptyField { field }
            | DecodeError::TooLong { field, .. }
            | DecodeError::ControlCharacter { field } => Some(*field),
            DecodeError::BadTimestamp { .. } => Some(Field::ChangedAt),
            _ => None,
        }
    }
}

impl HistoryEvent {
    /// Decodes and validates one record value. `payload` is `None` for a tombstone.
    ///
    /// Unknown fields are ignored, so producers may add fields without breaking this consumer.
    pub fn decode(payload: Option<&[u8]>, max_payload_bytes: usize) -> Result<Self, DecodeError> {
        let bytes = payload.ok_or(DecodeError::NullPayload)?;
        if bytes.len() > max_payload_bytes {
            return Err(DecodeError::TooLarge {
                size: bytes.len(),
                limit: max_payload_bytes,
            });
        }
        let text = std::str::from_utf8(bytes).map_err(|err| DecodeError::NotUtf8 {
            detail: err.to_string(),
        })?;
        let mut deserializer = serde_json::Deserializer::from_str(text);
        // A payload that is not an event object is reported as such even when text follows it.
        let raw = match JsonVisitor::PAYLOAD
            .deserialize(&mut deserializer)
            .map_err(classify_json_error)?
        {
            Json::Payload(raw) => (*raw)?,
            other => {
                return Err(DecodeError::NotObject {
                    found: other.found(),
                });
            }
        };
        deserializer.end().map_err(|err| DecodeError::NotJson {
            detail: err.to_string(),
        })?;
        raw.validate()
    }
}

/// The string fields as found in the payload, before validation; slots follow [`Field::index`].
#[derive(Default)]
struct RawPayload<'de> {
    fields: [Option<Cow<'de, str>>; 5],
}

impl RawPayload<'_> {
    fn validate(self) -> Result<HistoryEvent, DecodeError> {
        let [event_id, ticket_id, from_status, to_status, changed_at] = self.fields;
        let event_id = checked_text(Field::EventId, event_id)?.into_owned();
        let ticket_id = checked_text(Field::TicketId, ticket_id)?.into_owned();
        let from_status = checked_text(Field::FromStatus, from_status)?.into_owned();
        let to_status = checked_text(Field::ToStatus, to_status)?.into_owned();
        // Parsed where it lies: only the instant is kept.
        let changed_at_text = checked_text(Field::ChangedAt, changed_at)?;
        let changed_at = DateTime::parse_from_rfc3339(&changed_at_text)
            .map(storable_instant)
            .map_err(|err| DecodeError::BadTimestamp {
                detail: format!("{err} in {changed_at_text:?}"),
            })?;
        Ok(HistoryEvent {
            event_id,
            ticket_id,
            from_status,
            to_status,
            changed_at,
        })
    }
}

fn checked_text(field: Field, value: Option<Cow<'_, str>>) -> Result<Cow<'_, str>, DecodeError> {
    let value = value.ok_or(DecodeError::MissingField { field })?;
    if is_printable_ascii(value.as_bytes()) {
        check_printable_ascii(field, &value)?;
    } else {
        check_any_text(field, &value)?;
    }
    Ok(value)
}

/// Whether every byte is printable ASCII (space to tilde). Without an early exit, so that it
/// compiles to vector instructions: this runs on every field of every record.
fn is_printable_ascii(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .fold(true, |all, &byte| all & (byte.wrapping_sub(b' ') < 0x5f))
}

/// [`check_any_text`] for printable ASCII, the usual text: a character per byte, no control
/// character, and the only whitespace is the space.
fn check_printable_ascii(field: Field, value: &str) -> Result<(), DecodeError> {
    if value.bytes().all(|byte| byte == b' ') {
        return Err(DecodeError::EmptyField { field });
    }
    let limit = field.max_chars();
    if value.len() > limit {
        return Err(DecodeError::TooLong {
            field,
            chars: value.len(),
            limit,
        });
    }
    Ok(())
}

/// A field's text checks, character by character.
fn check_any_text(field: Field, value: &str) -> Result<(), DecodeError> {
    if value.trim().is_empty() {
        return Err(DecodeError::EmptyField { field });
    }
    let limit = field.max_chars();
    // Byte length bounds the character count from above, so the count is only paid for long text.
    if value.len() > limit {
        let chars = value.chars().count();
        if chars > limit {
            return Err(DecodeError::TooLong {
                field,
                chars,
                limit,
            });
        }
    }
    // PostgreSQL `text` cannot hold NUL, and control characters in identifiers are producer bugs.
    if value.chars().any(char::is_control) {
        return Err(DecodeError::ControlCharacter { field });
    }
    Ok(())
}

/// Errors serde itself raises are syntax errors: type errors are reported by the visitor.
fn classify_json_error(err: serde_json::Error) -> DecodeError {
    DecodeError::NotJson {
        detail: err.to_string(),
    }
}

/// What the decoder needs to know of a JSON value: a string's text, the payload object's known
/// fields, or, for anything else, the kind of value found (as the error messages name it).
enum Json<'de> {
    Text(Cow<'de, str>),
    /// Boxed: every value the visitor returns is this enum, and most are small.
    Payload(Box<Result<RawPayload<'de>, DecodeError>>),
    Other(&'static str),
}

impl Json<'_> {
    /// The kind of value, as the error messages name it.
    fn found(&self) -> &'static str {
        match self {
            Json::Text(_) => "a string",
            Json::Payload(_) => "an object",
            Json::Other(found) => found,
        }
    }
}

/// The one visitor of the decoder, for the payload, its keys and its known fields' values.
/// Only the payload's own object is read field by field (`payload`); any object nested in it
/// is skipped, as are arrays, so that a syntax error later in them still surfaces as `NotJson`.
#[derive(Clone, Copy)]
struct JsonVisitor {
    payload: bool,
}

impl JsonVisitor {
    const PAYLOAD: JsonVisitor = JsonVisitor { payload: true };
    const NESTED: JsonVisitor = JsonVisitor { payload: false };
}

impl<'de> DeserializeSeed<'de> for JsonVisitor {
    type Value = Json<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Json<'de>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::Text(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Json<'de>, E> {
        Ok(Json::Text(Cow::Owned(v.to_owned())))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Json<'de>, E> {
        Ok(Json::Other("null"))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Json<'de>, E> {
        Ok(Json::Other("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Json<'de>, E> {
        Ok(Json::Other("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Json<'de>, E> {
        Ok(Json::Other("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Json<'de>, E> {
        Ok(Json::Other("a number"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Json::Other("an array"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        if self.payload {
            return read_payload(map).map(|payload| Json::Payload(Box::new(payload)));
        }
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Json::Other("an object"))
    }
}

/// Reads the payload object's known fields; unknown ones are skipped whatever their type. The
/// first field error wins, but the object is read to its end so that a later syntax error is
/// still reported as one.
fn read_payload<'de, A: MapAccess<'de>>(
    mut map: A,
) -> Result<Result<RawPayload<'de>, DecodeError>, A::Error> {
    let mut raw = RawPayload::default();
    let mut first_error = None;
    while let Some(key) = map.next_key_seed(JsonVisitor::NESTED)? {
        // JSON keys are strings; the visitor sees nothing else here.
        let field = match key {
            Json::Text(key) => Field::from_key(&key),
            _ => None,
        };
        let Some(field) = field else {
            map.next_value::<IgnoredAny>()?;
            continue;
        };
        let value = map.next_value_seed(JsonVisitor::NESTED)?;
        if first_error.is_some() {
            continue;
        }
        let slot = &mut raw.fields[field.index()];
        match value {
            _ if slot.is_some() => first_error = Some(DecodeError::DuplicateField { field }),
            Json::Text(text) => *slot = Some(text),
            other => {
                first_error = Some(DecodeError::WrongType {
                    field,
                    found: other.found(),
                })
            }
        }
    }
    Ok(match first_error {
        Some(err) => Err(err),
        None => Ok(raw),
    })
}

#[cfg(test)]
mod tests {
    use chrono::FixedOffset;

    use super::*;

    const LIMIT: usize = 64 * 1024;

    fn decode(text: &str) -> Result<HistoryEvent, DecodeError> {
        HistoryEvent::decode(Some(text.as_bytes()), LIMIT)
    }

    const SEED_900: &str = r#"{"event_id":"event-ticket-900","ticket_id":"ticket-42","from_status":"open","to_status":"resolved","changed_at":"2026-10-03T08:00:00Z"}"#;

    #[test]
    fn decodes_the_seed_event() {
        let event = decode(SEED_900).unwrap();
        assert_eq!(event.event_id, "event-ticket-900");
        assert_eq!(event.ticket_id, "ticket-42");
        assert_eq!(event.from_status, "open");
        assert_eq!(event.to_status, "resolved");
        assert_eq!(event.changed_at.to_rfc3339(), "2026-10-03T08:00:00+00:00");
    }

    #[test]
    fn ignores_unknown_fields_of_any_type() {
        let text = r#"{"schema":2,"event_id":"e","nested":{"a":[1,2,{"b":null}]},"ticket_id":"t","from_status":"a","to_status":"b","changed_at":"2026-10-03T08:00:00+02:00","extra":"x"}"#;
        let event = decode(text).unwrap();
        assert_eq!(event.changed_at.offset().local_minus_utc(), 7200);
    }

    #[test]
    fn decodes_escaped_strings() {
        let text = r#"{"event_id":"ev\u00e9nt","ticket_id":"t\"1","from_status":"a","to_status":"b","changed_at":"2026-10-03T08:00:00Z"}"#;
        let event = decode(text).unwrap();
        assert_eq!(event.event_id, "evént");
        assert_eq!(event.ticket_id, "t\"1");
    }

    #[test]
    fn rejects_a_tombstone() {
        assert_eq!(
            HistoryEvent::decode(None, LIMIT),
            Err(DecodeError::NullPayload)
        );
    }

    #[test]
    fn rejects_an_oversized_payload_before_parsing_it() {
        let err = HistoryEvent::decode(Some(&[b'x'; 100]), 99).unwrap_err();
        assert_eq!(
            err,
            DecodeError::TooLarge {
                size: 100,
                limit: 99
            }
        );
    }

    #[test]
    fn rejects_bytes_that_are_not_utf8() {
        let err = HistoryEvent::decode(Some(b"{\"event_id\":\"\xff\"}"), LIMIT).unwrap_err();
        assert_eq!(err.code(), "not_utf8");
    }

    #[test]
    fn rejects_text_that_is_not_json() {
        for text in [
            "",
            "not json",
            "{\"event_id\":",
            "{} trailing",
            "{\"a\":1,}",
        ] {
            assert_eq!(decode(text).unwrap_err().code(), "not_json", "{text:?}");
        }
    }

    #[test]
    fn rejects_json_that_is_not_an_object() {
        for (text, found) in [
            ("null", "null"),
            ("true", "a boolean"),
            ("42", "a number"),
            ("-1.5", "a number"),
            ("\"event\"", "a string"),
            ("[1, 2]", "an array"),
        ] {
            assert_eq!(
                decode(text),
                Err(DecodeError::NotObject { found }),
                "{text}"
            );
        }
    }

    #[test]
    fn names_the_missing_field() {
        let text = r#"{"event_id":"e","ticket_id":"t","from_status":"a","changed_at":"2026-10-03T08:00:00Z"}"#;
        let err = decode(text).unwrap_err();
        assert_eq!(
            err,
            DecodeError::MissingField {
                field: Field::ToStatus
            }
        );
        assert_eq!(err.to_string(), "field `to_status` is missing");
        assert_eq!(err.field(), Some(Field::ToStatus));
    }

    #[test]
    fn names_the_field_of_the_wrong_type() {
        let text = r#"{"event_id":900,"ticket_id":"t","from_status":"a","to_status":"b","changed_at":"2026-10-03T08:00:00Z"}"#;
        assert_eq!(
            decode(text),
            Err(DecodeError::WrongType {
                field: Field::EventId,
                found: "a number"
            })
        );
        let text = r#"{"event_id":"e","ticket_id":null,"from_status":"a","to_status":"b","changed_at":"2026-10-03T08:00:00Z"}"#;
        assert_eq!(
            decode(text),
            Err(DecodeError::WrongType {
                field: Field::TicketId,
                found: "null"
            })
        );
    }

    #[test]
    fn rejects_empty_and_blank_fields() {
        for value in ["", "   ", "\t"] {
            let text = format!(
                r#"{{"event_id":"e","ticket_id":"t","from_status":"{}","to_status":"b","changed_at":"2026-10-03T08:00:00Z"}}"#,
                value.replace('\t', "\\t")
            );
            assert_eq!(
                decode(&text),
                Err(DecodeError::EmptyField {
                    field: Field::FromStatus
                })
            );
        }
    }

    #[test]
    fn rejects_too_long_fields_and_counts_characters_not_bytes() {
        let at_limit = "é".repeat(MAX_ID_CHARS);
        let text = format!(
            r#"{{"event_id":"{at_limit}","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"2026-10-03T08:00:00Z"}}"#
        );
        assert!(decode(&text).is_ok());
        let over = "x".repeat(MAX_STATUS_CHARS + 1);
        let text = format!(
            r#"{{"event_id":"e","ticket_id":"t","from_status":"a","to_status":"{over}","changed_at":"2026-10-03T08:00:00Z"}}"#
        );
        assert_eq!(
            decode(&text),
            Err(DecodeError::TooLong {
                field: Field::ToStatus,
                chars: MAX_STATUS_CHARS + 1,
                limit: MAX_STATUS_CHARS
            })
        );
    }

    #[test]
    fn rejects_nul_and_control_characters() {
        let text = r#"{"event_id":"e\u0000","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"2026-10-03T08:00:00Z"}"#;
        assert_eq!(
            decode(text),
            Err(DecodeError::ControlCharacter {
                field: Field::EventId
            })
        );
    }

    #[test]
    fn rejects_a_duplicated_field() {
        let text = r#"{"event_id":"e","event_id":"f","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"2026-10-03T08:00:00Z"}"#;
        assert_eq!(
            decode(text),
            Err(DecodeError::DuplicateField {
                field: Field::EventId
            })
        );
    }

    #[test]
    fn rejects_timestamps_without_offset_or_invalid() {
        for stamp in [
            "2026-10-03T08:00:00",
            "2026-10-03",
            "yesterday",
            "2026-13-03T08:00:00Z",
            "1696320000",
        ] {
            let text = format!(
                r#"{{"event_id":"e","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"{stamp}"}}"#
            );
            let err = decode(&text).unwrap_err();
            assert_eq!(err.code(), "bad_timestamp", "{stamp}");
            assert_eq!(err.field(), Some(Field::ChangedAt));
        }
    }

    fn changed_at(stamp: &str) -> DateTime<FixedOffset> {
        let text = format!(
            r#"{{"event_id":"e","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"{stamp}"}}"#
        );
        decode(&text).unwrap().changed_at
    }

    #[test]
    fn truncates_sub_microsecond_digits_towards_the_past() {
        for (stamp, stored) in [
            (
                "2026-10-03T08:00:00.123456789Z",
                "2026-10-03T08:00:00.123456+00:00",
            ),
            (
                "2026-10-03T08:00:00.999999999+02:00",
                "2026-10-03T08:00:00.999999+02:00",
            ),
            ("1969-07-20T20:17:40.0000005Z", "1969-07-20T20:17:40+00:00"),
            ("2026-10-03T08:00:00.5Z", "2026-10-03T08:00:00.500+00:00"),
        ] {
            assert_eq!(changed_at(stamp).to_rfc3339(), stored, "{stamp}");
        }
    }

    #[test]
    fn folds_a_leap_second_into_the_next_minute_keeping_the_offset() {
        assert_eq!(
            changed_at("2026-12-31T23:59:60Z").to_rfc3339(),
            "2027-01-01T00:00:00+00:00"
        );
        assert_eq!(
            changed_at("2026-12-31T18:59:60.25-05:00").to_rfc3339(),
            "2026-12-31T19:00:00.250-05:00"
        );
        assert_eq!(
            changed_at("2026-12-31T23:59:60Z"),
            changed_at("2027-01-01T00:00:00Z")
        );
    }

    #[test]
    fn equal_instants_in_other_offsets_are_the_same_event() {
        let text = |stamp: &str| {
            format!(
                r#"{{"event_id":"e","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"{stamp}"}}"#
            )
        };
        assert_eq!(
            decode(&text("2026-10-03T10:00:00.1234567+02:00")).unwrap(),
            decode(&text("2026-10-03T08:00:00.123456Z")).unwrap()
        );
        assert_ne!(
            decode(&text("2026-10-03T08:00:00.123457Z")).unwrap(),
            decode(&text("2026-10-03T08:00:00.123456Z")).unwrap()
        );
    }

    #[test]
    fn reports_a_syntax_error_after_a_bad_field_as_not_json() {
        let text = r#"{"event_id":5,"ticket_id":"t" "#;
        assert_eq!(decode(text).unwrap_err().code(), "not_json");
    }

    #[test]
    fn names_are_their_keys() {
        for field in Field::ALL {
            assert_eq!(Field::from_key(field.name()), Some(field));
        }
        assert_eq!(Field::from_key("event_Id"), None);
    }

    /// Text near every edge the checks draw: blanks, controls (ASCII and not), the printable
    /// range's ends, multi-byte characters, lengths around each limit.
    fn edgy_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let character = prop_oneof![
            4 => (0x20u8..0x7f).prop_map(char::from),
            2 => Just(' '),
            1 => prop::sample::select(vec!['\0', '\t', '\n', '\x1f', '\x7f', '\u{85}', '\u{a0}', '\u{2003}', 'é', '€', '😀']),
        ];
        prop_oneof![
            prop::collection::vec(character.clone(), 0..8),
            prop::collection::vec(character, 60..70),
            (250usize..262).prop_map(|len| vec!['a'; len]),
            (250usize..262).prop_map(|len| vec!['é'; len]),
        ]
        .prop_map(|chars| chars.into_iter().collect())
    }

    proptest::proptest! {
        /// The printable-ASCII path is a shortcut: for every text it takes, it decides as the
        /// check character by character does.
        #[test]
        fn printable_ascii_is_checked_as_any_text_is(text in edgy_text()) {
            for field in Field::ALL {
                let by_chars = check_any_text(field, &text);
                match is_printable_ascii(text.as_bytes()) {
                    true => proptest::prop_assert_eq!(check_printable_ascii(field, &text), by_chars),
                    false => proptest::prop_assert!(
                        text.bytes().any(|byte| !(b' '..=b'~').contains(&byte)),
                        "{text:?} is printable ASCII"
                    ),
                }
            }
        }
    }
}
