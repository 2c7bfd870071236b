//! Retry backoff: wait `initial` after the first failure, twice as long after each further one,
//! never longer than `max`; a success starts over. Pure: it hands out delays and the caller
//! sleeps them, so the sequence is tested without waiting.

use std::time::Duration;

/// The delays between the attempts of one thing being retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay to wait after a failure. The first is `initial` as configured; each later one
    /// doubles the previous, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = delay.saturating_mul(2).min(self.max);
        delay
    }

    /// After a success: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn delays(backoff: &mut Backoff, count: usize) -> Vec<Duration> {
        (0..count).map(|_| backoff.next_delay()).collect()
    }

    #[test]
    fn doubles_from_initial_up_to_max_and_stays_there() {
        let mut backoff = Backoff::new(ms(100), ms(1000));
        assert_eq!(
            delays(&mut backoff, 7),
            [100, 200, 400, 800, 1000, 1000, 1000].map(ms)
        );
    }

    #[test]
    fn a_success_starts_over_from_initial() {
        let mut backoff = Backoff::new(ms(50), ms(10_000));
        delays(&mut backoff, 4);
        backoff.reset();
        assert_eq!(delays(&mut backoff, 3), [50, 100, 200].map(ms));
    }

    #[test]
    fn a_max_below_initial_caps_every_delay_after_the_first() {
        let mut backoff = Backoff::new(ms(500), ms(300));
        assert_eq!(delays(&mut backoff, 3), [500, 300, 300].map(ms));
    }

    #[test]
    fn a_huge_max_saturates_instead_of_overflowing() {
        let mut backoff = Backoff::new(Duration::MAX / 2 + ms(1), Duration::MAX);
        backoff.next_delay();
        assert_eq!(backoff.next_delay(), Duration::MAX);
        assert_eq!(backoff.next_delay(), Duration::MAX);
    }
}
