//! The offset window: one track and one resolve per record.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use history_service::offsets::OffsetWindow;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

const RECORDS: i64 = 10_000;

fn window(c: &mut Criterion) {
    let mut group = c.benchmark_group("offset_window");
    group.throughput(Throughput::Elements(RECORDS as u64));
    group.bench_function("track_then_resolve_in_order", |b| {
        b.iter(|| {
            let mut window = OffsetWindow::new();
            for offset in 0..RECORDS {
                window.track(offset);
            }
            for offset in 0..RECORDS {
                window.resolve(offset, 0).unwrap();
            }
            black_box(window.position())
        })
    });
    // Writers finish batches out of order: resolutions arrive shuffled within a window of 2,000.
    let mut order: Vec<i64> = (0..RECORDS).collect();
    let mut rng = SmallRng::seed_from_u64(7);
    for chunk in order.chunks_mut(2000) {
        chunk.shuffle(&mut rng);
    }
    group.bench_function("resolve_shuffled_within_2000", |b| {
        b.iter_batched(
            || {
                let mut window = OffsetWindow::new();
                for offset in 0..RECORDS {
                    window.track(offset);
                }
                window
            },
            |mut window| {
                for &offset in &order {
                    window.resolve(offset, 0).unwrap();
                }
                black_box(window.position())
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, window);
criterion_main!(benches);
