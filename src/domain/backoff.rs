//! Retry backoff with full jitter: after the n-th failure in a row the delay is drawn uniformly
//! from zero to a ceiling that starts at `initial`, doubles with each further failure and never
//! exceeds `max`; a success starts over. The draw is what keeps the writers of every replica,
//! failing together when the database goes away, from retrying together in step when it comes
//! back (AWS's "full jitter": the retries spread over the whole ceiling). Pure apart from its
//! random source: it hands out delays and the caller sleeps them, so the sequence is tested
//! without waiting, and with a seeded source exactly.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The delays between the attempts of one thing being retried.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    ceiling: Duration,
    jitter: SmallRng,
}

impl Backoff {
    /// Draws from the operating system's entropy: two backoffs never share a schedule.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self::with_jitter(initial, max, SmallRng::from_os_rng())
    }

    /// Draws from `jitter`, for tests that need the sequence exactly.
    pub fn with_jitter(initial: Duration, max: Duration, jitter: SmallRng) -> Self {
        Backoff {
            initial,
            max,
            ceiling: initial,
            jitter,
        }
    }

    /// The delay to wait after a failure: uniform between zero and the current ceiling (the
    /// first is `initial` as configured; each later one doubles the previous, up to `max`).
    /// Drawn in whole milliseconds (the timers' resolution: a finer draw would be rounded up
    /// by the timer anyway), in nanoseconds only under a ceiling shorter than one.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.next_ceiling();
        if ceiling < Duration::from_millis(1) {
            let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
            return Duration::from_nanos(self.jitter.random_range(0..=nanos));
        }
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(self.jitter.random_range(0..=millis))
    }

    /// The ceiling the next delay is drawn under, moving the schedule on.
    fn next_ceiling(&mut self) -> Duration {
        let ceiling = self.ceiling;
        self.ceiling = ceiling.saturating_mul(2).min(self.max);
        ceiling
    }

    /// After a success: the next failure draws under `initial` again.
    pub fn reset(&mut self) {
        self.ceiling = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn ceilings(backoff: &mut Backoff, count: usize) -> Vec<Duration> {
        (0..count).map(|_| backoff.next_ceiling()).collect()
    }

    fn seeded(initial: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff::with_jitter(initial, max, SmallRng::seed_from_u64(seed))
    }

    #[test]
    fn the_ceiling_doubles_from_initial_up_to_max_and_stays_there() {
        let mut backoff = Backoff::new(ms(100), ms(1000));
        assert_eq!(
            ceilings(&mut backoff, 7),
            [100, 200, 400, 800, 1000, 1000, 1000].map(ms)
        );
    }

    #[test]
    fn a_success_starts_over_from_initial() {
        let mut backoff = Backoff::new(ms(50), ms(10_000));
        ceilings(&mut backoff, 4);
        backoff.reset();
        assert_eq!(ceilings(&mut backoff, 3), [50, 100, 200].map(ms));
    }

    #[test]
    fn a_max_below_initial_caps_every_ceiling_after_the_first() {
        let mut backoff = Backoff::new(ms(500), ms(300));
        assert_eq!(ceilings(&mut backoff, 3), [500, 300, 300].map(ms));
    }

    #[test]
    fn a_huge_max_saturates_instead_of_overflowing() {
        let mut backoff = Backoff::new(Duration::MAX / 2 + ms(1), Duration::MAX);
        backoff.next_delay();
        assert_eq!(backoff.next_ceiling(), Duration::MAX);
        assert!(backoff.next_delay() <= Duration::MAX);
    }

    #[test]
    fn every_delay_lies_under_its_ceiling_and_the_draws_spread_over_all_of_it() {
        let mut backoff = seeded(ms(100), ms(1000), 7);
        let mut at_the_cap = Vec::new();
        for _ in 0..2000 {
            let delay = backoff.next_delay();
            assert!(delay <= ms(1000), "{delay:?}");
            at_the_cap.push(delay);
        }
        // Past the first four failures every draw is under the 1 s cap: uniform over it.
        let tail = &at_the_cap[4..];
        let mean = tail.iter().sum::<Duration>() / tail.len() as u32;
        assert!(mean > ms(450) && mean < ms(550), "mean {mean:?}");
        assert!(tail.iter().any(|d| *d < ms(100)));
        assert!(tail.iter().any(|d| *d > ms(900)));
    }

    #[test]
    fn two_backoffs_failing_together_do_not_retry_in_step() {
        // Two writers whose database went away at the same moment: without jitter both would
        // wait 100, 200, 400, … ms and hit the returning server together on every attempt.
        let mut first = Backoff::new(ms(100), ms(10_000));
        let mut second = Backoff::new(ms(100), ms(10_000));
        let (mut at_first, mut at_second) = (Duration::ZERO, Duration::ZERO);
        let mut together = 0;
        for _ in 0..10 {
            at_first += first.next_delay();
            at_second += second.next_delay();
            if at_first.abs_diff(at_second) < ms(1) {
                together += 1;
            }
        }
        assert!(
            together < 3,
            "{together} of 10 retries within a millisecond of each other"
        );
    }
}
