//! Retry backoff and batch linger on tokio's paused clock: the pure types decide, the runtime's
//! timers wait, and virtual time shows exactly when each attempt and each write happens.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use history_service::domain::backoff::Backoff;
use history_service::domain::linger::{Decision, Linger};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::mpsc;
use tokio::time::{Instant, advance, sleep, sleep_until};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Retries `attempt` until it succeeds, sleeping what the backoff says between attempts; returns
/// when each attempt started, since the first.
async fn retry(backoff: &mut Backoff, mut attempt: impl FnMut() -> bool) -> Vec<Duration> {
    let start = Instant::now();
    let mut started = Vec::new();
    loop {
        started.push(start.elapsed());
        if attempt() {
            backoff.reset();
            return started;
        }
        sleep(backoff.next_delay()).await;
    }
}

fn failing(times: usize) -> impl FnMut() -> bool {
    let mut left = times;
    move || {
        if left == 0 {
            return true;
        }
        left -= 1;
        false
    }
}

/// A backoff whose draws are known in advance: `expected` is a twin with the same seed, so a
/// test can ask what each delay will be and check that the loop waited exactly that.
fn seeded(initial: Duration, max: Duration, seed: u64) -> (Backoff, Backoff) {
    let backoff = Backoff::with_jitter(initial, max, SmallRng::seed_from_u64(seed));
    (backoff.clone(), backoff)
}

/// When each attempt starts, since the first, if every wait is the delay `twin` draws next.
fn schedule(twin: &mut Backoff, failures: usize) -> Vec<Duration> {
    let mut at = Duration::ZERO;
    let mut started = vec![at];
    for _ in 0..failures {
        at += twin.next_delay();
        started.push(at);
    }
    started
}

#[tokio::test(start_paused = true)]
async fn a_retry_loop_waits_jittered_delays_under_doubling_ceilings_capped_at_max() {
    for seed in 0..20 {
        let (mut backoff, mut twin) = seeded(ms(100), ms(1000), seed);
        let started = retry(&mut backoff, failing(6)).await;
        assert_eq!(started, schedule(&mut twin, 6), "seed {seed}");
        // Each wait lies under its ceiling: 100, 200, 400, 800, 1000, 1000 ms.
        let waits: Vec<Duration> = started.windows(2).map(|w| w[1] - w[0]).collect();
        for (wait, ceiling) in waits.iter().zip([100, 200, 400, 800, 1000, 1000].map(ms)) {
            assert!(
                *wait <= ceiling,
                "seed {seed}: waited {wait:?} over {ceiling:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_success_the_next_failure_draws_under_initial_again() {
    // Over many seeds the first wait after a success is never above `initial`, though the
    // ceiling had grown to 400 ms: without the reset some of them would be.
    for seed in 0..50 {
        let (mut backoff, _) = seeded(ms(50), ms(10_000), seed);
        retry(&mut backoff, failing(3)).await;
        let started = retry(&mut backoff, failing(2)).await;
        assert!(started[1] <= ms(50), "seed {seed}: {started:?}");
        assert!(
            started[2] - started[1] <= ms(100),
            "seed {seed}: {started:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_does_not_start_a_moment_before_its_delay() {
    let (backoff, mut twin) = seeded(ms(100), ms(1000), 11);
    let first = twin.next_delay();
    let second = twin.next_delay();
    assert!(
        first > ms(1) && second > ms(1),
        "pick a seed whose draws leave a moment before them: {first:?} {second:?}"
    );
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let retrying = tokio::spawn(async move {
        let mut backoff = backoff;
        retry(&mut backoff, move || {
            counted.fetch_add(1, Ordering::SeqCst) == 2
        })
        .await
    });
    let settle = || async {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    };
    let moment = ms(1);
    settle().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    advance(first - moment).await;
    settle().await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        1,
        "retried before {first:?}"
    );
    advance(moment).await;
    settle().await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "not retried at {first:?}"
    );
    advance(second - moment).await;
    settle().await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "retried before {:?}",
        first + second
    );
    advance(moment).await;
    assert_eq!(
        retrying.await.unwrap(),
        [Duration::ZERO, first, first + second]
    );
}

/// `gather_all`, given a minute of virtual time: a linger that never writes fails the test
/// instead of hanging it.
async fn gather(
    jobs: mpsc::UnboundedReceiver<()>,
    batch_max: usize,
    linger: Duration,
) -> Vec<(Duration, usize)> {
    tokio::time::timeout(Duration::from_secs(60), gather_all(jobs, batch_max, linger))
        .await
        .expect("jobs were left unwritten")
}

/// A writer's gathering loop as the DbWriter runs it: each job that arrives and each timer that
/// fires asks the linger what to do. Returns each write as (when, since the start; jobs written).
async fn gather_all(
    mut jobs: mpsc::UnboundedReceiver<()>,
    batch_max: usize,
    linger: Duration,
) -> Vec<(Duration, usize)> {
    let start = Instant::now();
    let mut linger = Linger::new(batch_max, linger);
    let mut gathered = 0;
    let mut deadline = None;
    let mut writes = Vec::new();
    let mut open = true;
    while open || gathered > 0 {
        let timer = async {
            match deadline {
                Some(deadline) => sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            job = jobs.recv(), if open => match job {
                Some(()) => gathered += 1,
                None => open = false,
            },
            () = timer => {}
        }
        deadline = None;
        loop {
            match linger.decide(gathered, Instant::now()) {
                Decision::WriteNow => {
                    let taken = gathered.min(batch_max);
                    writes.push((start.elapsed(), taken));
                    gathered -= taken;
                    linger.taken();
                }
                Decision::WaitUntil(at) => {
                    deadline = Some(at);
                    break;
                }
                Decision::Idle => break,
            }
        }
    }
    writes
}

/// Sends one job at each of these times since the start, then closes the channel.
fn arrivals(times: &[u64]) -> mpsc::UnboundedReceiver<()> {
    let (sender, receiver) = mpsc::unbounded_channel();
    let start = Instant::now();
    let times = times.to_vec();
    tokio::spawn(async move {
        for at in times {
            sleep_until(start + ms(at)).await;
            sender.send(()).unwrap();
        }
    });
    receiver
}

#[tokio::test(start_paused = true)]
async fn a_trickle_is_written_when_its_first_job_has_lingered() {
    let writes = gather(arrivals(&[0, 2, 3, 20]), 100, ms(10)).await;
    assert_eq!(writes, [(ms(10), 3), (ms(30), 1)]);
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_is_written_when_it_fills_not_at_the_deadline() {
    let writes = gather(arrivals(&[0, 1, 2, 4]), 3, ms(10)).await;
    assert_eq!(writes, [(ms(2), 3), (ms(14), 1)]);
}

#[tokio::test(start_paused = true)]
async fn without_linger_every_job_is_written_as_it_arrives() {
    let writes = gather(arrivals(&[0, 5, 7]), 100, Duration::ZERO).await;
    assert_eq!(writes, [(ms(0), 1), (ms(5), 1), (ms(7), 1)]);
}
