//! The decoder against arbitrary input: never a panic, always a typed error or a valid event.

use proptest::prelude::*;

use super::decode::{DecodeError, Field, MAX_ID_CHARS, MAX_STATUS_CHARS};
use super::event::HistoryEvent;

const LIMIT: usize = 4096;

/// A decoded event satisfies every rule the decoder promises.
fn assert_valid(event: &HistoryEvent) {
    for (text, limit) in [
        (&event.event_id, MAX_ID_CHARS),
        (&event.ticket_id, MAX_ID_CHARS),
        (&event.from_status, MAX_STATUS_CHARS),
        (&event.to_status, MAX_STATUS_CHARS),
    ] {
        assert!(!text.trim().is_empty());
        assert!(text.chars().count() <= limit);
        assert!(!text.chars().any(char::is_control));
    }
}

fn check(bytes: Option<&[u8]>) {
    match HistoryEvent::decode(bytes, LIMIT) {
        Ok(event) => assert_valid(&event),
        Err(err) => {
            // Every error has a stable code and a message; field errors name their field.
            assert!(!err.code().is_empty());
            assert!(!err.to_string().is_empty());
            if let Some(field) = err.field() {
                assert!(err.to_string().contains(field.name()) || field == Field::ChangedAt);
            }
        }
    }
}

/// JSON values of every type, including strings that are almost valid field values.
fn json_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| f.to_string()),
        ".{0,80}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        Just("\"2026-10-03T08:00:00Z\"".to_owned()),
        Just("\"2026-10-03T08:00:00\"".to_owned()),
        Just("\"\"".to_owned()),
        Just("\"  \"".to_owned()),
        Just("\"ticket-42\"".to_owned()),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec(("[a-z_]{1,12}", inner), 0..4).prop_map(|entries| {
                let body: Vec<String> = entries
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("{{{}}}", body.join(","))
            }),
        ]
    })
}

/// Objects with the event's own keys, each missing, duplicated or of any type.
fn event_like_object() -> impl Strategy<Value = String> {
    let keys = [
        "event_id",
        "ticket_id",
        "from_status",
        "to_status",
        "changed_at",
        "extra",
    ];
    prop::collection::vec((prop::sample::select(keys.to_vec()), json_value()), 0..8).prop_map(
        |entries| {
            let body: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect();
            format!("{{{}}}", body.join(","))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        check(Some(&bytes));
    }

    #[test]
    fn arbitrary_json_never_panics(text in json_value()) {
        check(Some(text.as_bytes()));
    }

    #[test]
    fn event_like_objects_decode_or_name_what_is_wrong(text in event_like_object()) {
        check(Some(text.as_bytes()));
    }

    #[test]
    fn truncated_valid_payloads_are_not_json(cut in 1usize..130) {
        let text = r#"{"event_id":"event-ticket-900","ticket_id":"ticket-42","from_status":"open","to_status":"resolved","changed_at":"2026-10-03T08:00:00Z"}"#;
        let cut = cut.min(text.len() - 1);
        let err = HistoryEvent::decode(Some(&text.as_bytes()[..cut]), LIMIT).unwrap_err();
        prop_assert!(matches!(err, DecodeError::NotJson { .. }), "{err:?}");
    }
}

/// An RFC 3339 timestamp of any precision up to nanoseconds, any offset, leap seconds included.
fn rfc3339_timestamp() -> impl Strategy<Value = String> {
    (
        0u32..10_000,
        1u32..=12,
        1u32..=28,
        0u32..24,
        0u32..60,
        0u32..=60,
        prop::option::of((1usize..=9, 0u64..1_000_000_000)),
        prop::option::of((-23i32..=23, 0u32..60)),
    )
        .prop_map(|(year, month, day, hour, minute, second, fraction, offset)| {
            let fraction = fraction
                .map(|(digits, nanos)| format!(".{:09}", nanos)[..=digits].to_owned())
                .unwrap_or_default();
            let offset = match offset {
                None => "Z".to_owned(),
                Some((h, m)) => format!("{}{:02}:{m:02}", if h < 0 { '-' } else { '+' }, h.abs()),
            };
            format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}{fraction}{offset}")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// The decoded `changed_at` is what a `timestamptz` holds: whole microseconds, no leap
    /// second, at most one microsecond before the written instant (so never in another second
    /// unless it was a leap second), and decoding it again as written changes nothing.
    #[test]
    fn decoded_timestamps_are_storable_and_stable(stamp in rfc3339_timestamp()) {
        let payload = format!(
            r#"{{"event_id":"e","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"{stamp}"}}"#
        );
        let event = HistoryEvent::decode(Some(payload.as_bytes()), LIMIT);
        prop_assert!(event.is_ok(), "{}: {:?}", stamp, event);
        let event = event.unwrap();
        let written = chrono::DateTime::parse_from_rfc3339(&stamp).unwrap();
        let nanos = event.changed_at.timestamp_subsec_nanos();
        prop_assert!(nanos < 1_000_000_000, "{stamp}: leap second kept");
        prop_assert_eq!(nanos % 1000, 0, "{}: below a microsecond", stamp);
        prop_assert_eq!(event.changed_at.offset(), written.offset());
        let written_nanos = i128::from(written.timestamp()) * 1_000_000_000
            + i128::from(written.timestamp_subsec_nanos());
        let stored_nanos = i128::from(event.changed_at.timestamp()) * 1_000_000_000
            + i128::from(nanos);
        prop_assert!((0..1000).contains(&(written_nanos - stored_nanos)), "{}", stamp);
        let again = format!(
            r#"{{"event_id":"e","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"{}"}}"#,
            event.changed_at.to_rfc3339()
        );
        prop_assert_eq!(HistoryEvent::decode(Some(again.as_bytes()), LIMIT).unwrap(), event);
    }
}
