//! Retry backoff and batch linger on tokio's paused clock: the pure types decide, the runtime's
//! timers wait, and virtual time shows exactly when each attempt and each write happens.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use history_service::domain::backoff::Backoff;
use history_service::domain::linger::{Decision, Linger};
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

#[tokio::test(start_paused = true)]
async fn a_retry_loop_waits_doubling_delays_capped_at_max() {
    let mut backoff = Backoff::new(ms(100), ms(1000));
    let started = retry(&mut backoff, failing(6)).await;
    // Waits of 100, 200, 400, 800, 1000, 1000 ms.
    assert_eq!(started, [0, 100, 300, 700, 1500, 2500, 3500].map(ms));
}

#[tokio::test(start_paused = true)]
async fn after_a_success_the_next_failure_waits_initial_again() {
    let mut backoff = Backoff::new(ms(50), ms(10_000));
    retry(&mut backoff, failing(3)).await;
    let started = retry(&mut backoff, failing(2)).await;
    assert_eq!(started, [0, 50, 150].map(ms));
}

#[tokio::test(start_paused = true)]
async fn a_retry_does_not_start_a_moment_before_its_delay() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let retrying = tokio::spawn(async move {
        let mut backoff = Backoff::new(ms(100), ms(1000));
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
    settle().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    advance(ms(99)).await;
    settle().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 1, "retried before 100 ms");
    advance(ms(1)).await;
    settle().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "not retried at 100 ms");
    advance(ms(199)).await;
    settle().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "retried before 300 ms");
    advance(ms(1)).await;
    assert_eq!(retrying.await.unwrap(), [0, 100, 300].map(ms));
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
