//! The decoder on the hot path: one call per fetched record.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use history_service::domain::HistoryEvent;

const LIMIT: usize = 65536;

fn decode(c: &mut Criterion) {
    let valid = br#"{"event_id":"bench-0badc0de-123456","ticket_id":"ticket-4242","from_status":"in_progress","to_status":"resolved","changed_at":"2026-10-01T00:00:00.000Z"}"#;
    let extra = br#"{"schema":2,"event_id":"bench-0badc0de-123456","source":{"service":"tickets","region":"eu-1"},"ticket_id":"ticket-4242","from_status":"in_progress","to_status":"resolved","changed_at":"2026-10-01T00:00:00.000+02:00","actor":"agent-7"}"#;
    let poison = br#"{"event_id":"bench-1","ticket_id":"t","from_status":"open","changed_at":"2026-10-03T08:00:00Z"}"#;
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(1));
    group.bench_function("valid_event", |b| {
        b.iter(|| HistoryEvent::decode(Some(black_box(&valid[..])), LIMIT).unwrap())
    });
    group.bench_function("valid_event_with_unknown_fields", |b| {
        b.iter(|| HistoryEvent::decode(Some(black_box(&extra[..])), LIMIT).unwrap())
    });
    group.bench_function("missing_field", |b| {
        b.iter(|| HistoryEvent::decode(Some(black_box(&poison[..])), LIMIT).unwrap_err())
    });
    group.bench_function("not_json", |b| {
        b.iter(|| HistoryEvent::decode(Some(black_box(&b"ticket moved"[..])), LIMIT).unwrap_err())
    });
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
