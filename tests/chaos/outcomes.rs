//! Whether the instances' `Applied` outcomes are the applies the database holds, lifetime by
//! lifetime.
//!
//! Each lifetime of each instance (a start until its kill or stop) connects to PostgreSQL under
//! an `application_name` of its own, and the run's `inbox` has a column that takes it as its
//! default: every inbox marker names the lifetime whose transaction inserted it. A lifetime's
//! `Applied` outcomes are exactly its transactions that inserted a marker, less those whose
//! commit it could not confirm (counted `unknown`; their retry finds the event applied). So:
//! - a lifetime may never count more `Applied` than the markers it inserted — an outcome beyond
//!   them is an event it said it applied that it did not (applied twice, or not at all);
//! - a lifetime that stopped (its exit line gives its whole count) must count at least its
//!   markers less its `unknown` outcomes — fewer is an apply it did not report.
//!
//! A killed lifetime's count is its last scrape before the SIGKILL. What it applied after that
//! scrape is what its writers had under way: each writer's transaction in flight at the scrape,
//! and the next one it may have sent before the kill (one round trip: PostgreSQL commits it
//! though the client is gone). So a killed lifetime may insert at most that many markers beyond
//! its count (`in_flight`: twice the writers' batches), and never fewer than its `Applied`.
//! The check compares each lifetime with itself, so one lifetime's missing count cannot hide
//! another's extra one.

use std::collections::HashMap;

/// A lifetime's own count of its outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Claims {
    pub applied: u64,
    pub already_applied: u64,
    pub unknown: u64,
}

/// How a lifetime's count was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// From its exit line, after its last transaction: the whole count.
    AtExit(Claims),
    /// From its last scrape before a kill: what it counted up to then.
    BeforeKill(Claims),
    /// It was killed without answering the scrape, or stopped without its exit line.
    Missing,
}

/// One lifetime of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifetime {
    /// Its `application_name`, which its inbox markers carry.
    pub name: String,
    pub count: Count,
}

/// What the comparison found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OutcomeCheck {
    /// `Applied` outcomes beyond the markers their lifetime inserted, summed over lifetimes.
    pub applied_beyond_markers: u64,
    /// Markers a lifetime inserted and counted neither `Applied` nor `unknown`: beyond its
    /// count if it stopped, beyond its count and what it had in flight if it was killed.
    pub applied_unreported: u64,
    /// Lifetimes counted at exit, counted before a kill, and without a count.
    pub at_exit: usize,
    pub before_kill: usize,
    pub missing: usize,
    /// One line per lifetime that broke a rule, and per marker no lifetime of the run inserted.
    pub violations: Vec<String>,
    /// Each lifetime's count beside its markers, for the report.
    pub lifetimes: Vec<String>,
}

/// Compares each lifetime's count with `markers`, the inbox markers by the `application_name`
/// that inserted them; a killed lifetime may have applied up to `in_flight` events after its
/// last count.
pub fn check(
    lifetimes: &[Lifetime],
    markers: &HashMap<String, u64>,
    in_flight: u64,
) -> OutcomeCheck {
    let mut found = OutcomeCheck::default();
    for lifetime in lifetimes {
        let inserted = markers.get(&lifetime.name).copied().unwrap_or(0);
        found.lifetimes.push(format!(
            "{}: {:?}, inbox markers {inserted}",
            lifetime.name, lifetime.count
        ));
        let (claims, unseen) = match lifetime.count {
            Count::AtExit(claims) => {
                found.at_exit += 1;
                (claims, 0)
            }
            Count::BeforeKill(claims) => {
                found.before_kill += 1;
                (claims, in_flight)
            }
            Count::Missing => {
                found.missing += 1;
                continue;
            }
        };
        if claims.applied > inserted {
            found.applied_beyond_markers += claims.applied - inserted;
            found.violations.push(format!(
                "lifetime {}: {} Applied outcomes, but its transactions inserted {inserted} inbox \
                 markers",
                lifetime.name, claims.applied
            ));
        }
        let accounted = claims.applied + claims.unknown + unseen;
        if inserted > accounted {
            found.applied_unreported += inserted - accounted;
            found.violations.push(format!(
                "lifetime {}: its transactions inserted {inserted} inbox markers, but it counted \
                 {} Applied and {} unknown{}",
                lifetime.name,
                claims.applied,
                claims.unknown,
                if unseen > 0 {
                    format!(" before its kill, with at most {unseen} more in flight")
                } else {
                    String::new()
                }
            ));
        }
    }
    for (name, count) in markers {
        if !lifetimes.iter().any(|lifetime| &lifetime.name == name) {
            found.violations.push(format!(
                "{count} inbox markers inserted under application_name {name:?}, no lifetime of \
                 this run"
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(applied: u64, unknown: u64) -> Claims {
        Claims {
            applied,
            already_applied: 0,
            unknown,
        }
    }

    fn lifetime(name: &str, count: Count) -> Lifetime {
        Lifetime {
            name: name.into(),
            count,
        }
    }

    fn markers(of: &[(&str, u64)]) -> HashMap<String, u64> {
        of.iter().map(|(name, n)| ((*name).into(), *n)).collect()
    }

    #[test]
    fn counts_that_match_their_markers_are_clean() {
        let lifetimes = [
            lifetime("a", Count::BeforeKill(claims(90, 0))),
            lifetime("b", Count::AtExit(claims(200, 3))),
        ];
        // a applied 10 more after its last scrape; b's 3 unknown commits had committed.
        let found = check(&lifetimes, &markers(&[("a", 100), ("b", 203)]), 10);
        assert_eq!(found.violations, Vec::<String>::new());
        assert_eq!((found.at_exit, found.before_kill, found.missing), (1, 1, 0));
    }

    #[test]
    fn one_lifetimes_extra_applied_is_not_hidden_by_anothers_missing_count() {
        // In all: 100 counted for 100 markers. The aggregate check of before passed this.
        let lifetimes = [
            lifetime("killed", Count::BeforeKill(claims(40, 0))),
            lifetime("stopped", Count::AtExit(claims(60, 0))),
        ];
        let found = check(&lifetimes, &markers(&[("killed", 50), ("stopped", 50)]), 10);
        assert_eq!(found.applied_beyond_markers, 10);
        assert_eq!(found.violations.len(), 1, "{:?}", found.violations);
    }

    #[test]
    fn too_few_applies_are_caught_beyond_what_a_killed_lifetime_had_in_flight() {
        let found = check(
            &[lifetime("stopped", Count::AtExit(claims(95, 2)))],
            &markers(&[("stopped", 100)]),
            10,
        );
        assert_eq!(found.applied_unreported, 3);
        // Killed: the 3 may have been in flight at the scrape, and 10 may be.
        let killed = [lifetime("killed", Count::BeforeKill(claims(95, 2)))];
        let found = check(&killed, &markers(&[("killed", 107)]), 10);
        assert_eq!(found.violations, Vec::<String>::new());
        assert_eq!((found.applied_unreported, found.before_kill), (0, 1));
        let found = check(&killed, &markers(&[("killed", 108)]), 10);
        assert_eq!(found.applied_unreported, 1);
        assert!(
            found.violations[0].contains("in flight"),
            "{:?}",
            found.violations
        );
    }

    #[test]
    fn markers_of_no_lifetime_and_lifetimes_without_a_count_are_reported() {
        let found = check(
            &[lifetime("gone", Count::Missing)],
            &markers(&[("gone", 5), ("stranger", 1)]),
            10,
        );
        assert_eq!(found.missing, 1);
        assert_eq!(found.violations.len(), 1, "{:?}", found.violations);
        assert!(found.violations[0].contains("stranger"));
    }
}
