//! Every rule of the per-event transaction, proven against the scripted fake repository.

use chrono::DateTime;
use futures::executor::block_on;

use super::event::HistoryEvent;
use super::fake_repository::{Call, FakeError, FakeRepository, Step};
use super::outcome::{
    Outcome, Resolution, process_history_batch, process_history_once, write_history_batch,
};

fn event(event_id: &str, from: &str, to: &str, at: &str) -> HistoryEvent {
    HistoryEvent {
        event_id: event_id.into(),
        ticket_id: "ticket-42".into(),
        from_status: from.into(),
        to_status: to.into(),
        changed_at: DateTime::parse_from_rfc3339(at).unwrap(),
    }
}

fn seed_900() -> HistoryEvent {
    event(
        "event-ticket-900",
        "open",
        "resolved",
        "2026-10-03T08:00:00Z",
    )
}

fn seed_901() -> HistoryEvent {
    event(
        "event-ticket-901",
        "resolved",
        "closed",
        "2026-10-03T08:01:00Z",
    )
}

fn once(repo: &FakeRepository, event: &HistoryEvent) -> Outcome<FakeError> {
    block_on(process_history_once(repo, event))
}

fn rollbacks(calls: &[Call]) -> usize {
    calls.iter().filter(|call| **call == Call::Rollback).count()
}

/// The error inside an `Unknown` is the injected one itself: same token, same type, no wrapper.
fn assert_unknown_with(outcome: Outcome<FakeError>, injected: &FakeError) {
    match outcome {
        Outcome::Unknown(err) => assert_eq!(&err, injected, "the error must be passed through"),
        other => panic!("expected Unknown, got {other:?}"),
    }
}

#[test]
fn a_new_event_is_applied_with_begin_try_inbox_save_history_commit_and_no_rollback() {
    let repo = FakeRepository::new();
    assert_eq!(once(&repo, &seed_900()), Outcome::Applied);
    assert_eq!(
        repo.take_calls(),
        vec![
            Call::Begin,
            Call::TryInbox("event-ticket-900".into()),
            Call::SaveHistory("event-ticket-900".into()),
            Call::Commit,
        ]
    );
    assert_eq!(repo.inbox().len(), 1);
    assert_eq!(repo.history()["event-ticket-900"], seed_900());
}

#[test]
fn a_duplicate_is_already_applied_with_one_rollback_and_no_save_or_commit() {
    let repo = FakeRepository::new();
    once(&repo, &seed_900());
    repo.take_calls();
    assert_eq!(once(&repo, &seed_900()), Outcome::AlreadyApplied);
    assert_eq!(
        repo.take_calls(),
        vec![
            Call::Begin,
            Call::TryInbox("event-ticket-900".into()),
            Call::Rollback,
        ]
    );
    assert_eq!(repo.history().len(), 1);
}

#[test]
fn begin_failing_is_unknown_with_that_error_and_no_rollback() {
    let repo = FakeRepository::new();
    let injected = repo.fail_next(Step::Begin);
    assert_unknown_with(once(&repo, &seed_900()), &injected);
    assert_eq!(repo.take_calls(), vec![Call::Begin]);
    assert!(repo.inbox().is_empty());
}

#[test]
fn try_inbox_failing_is_unknown_with_that_error_and_one_rollback() {
    let repo = FakeRepository::new();
    let injected = repo.fail_next(Step::TryInbox);
    assert_unknown_with(once(&repo, &seed_900()), &injected);
    assert_eq!(
        repo.take_calls(),
        vec![
            Call::Begin,
            Call::TryInbox("event-ticket-900".into()),
            Call::Rollback,
        ]
    );
    assert!(repo.inbox().is_empty());
}

#[test]
fn save_history_failing_is_unknown_with_that_error_and_one_rollback_leaving_no_marker() {
    let repo = FakeRepository::new();
    let injected = repo.fail_next(Step::SaveHistory);
    assert_unknown_with(once(&repo, &seed_900()), &injected);
    assert_eq!(
        repo.take_calls(),
        vec![
            Call::Begin,
            Call::TryInbox("event-ticket-900".into()),
            Call::SaveHistory("event-ticket-900".into()),
            Call::Rollback,
        ]
    );
    assert!(repo.inbox().is_empty(), "the marker must be rolled back");
    assert!(repo.history().is_empty());
}

#[test]
fn commit_failing_is_unknown_with_that_error_and_one_rollback() {
    let repo = FakeRepository::new();
    let injected = repo.fail_next(Step::Commit);
    assert_unknown_with(once(&repo, &seed_900()), &injected);
    assert_eq!(
        repo.take_calls(),
        vec![
            Call::Begin,
            Call::TryInbox("event-ticket-900".into()),
            Call::SaveHistory("event-ticket-900".into()),
            Call::Commit,
            Call::Rollback,
        ]
    );
    assert!(repo.inbox().is_empty());
}

#[test]
fn a_commit_whose_reply_is_lost_is_unknown_then_the_redelivery_is_already_applied() {
    let repo = FakeRepository::new();
    let injected = repo.apply_then_fail_next_commit();
    assert_unknown_with(once(&repo, &seed_900()), &injected);
    let calls = repo.take_calls();
    assert_eq!(calls.last(), Some(&Call::Rollback));
    assert_eq!(rollbacks(&calls), 1);

    assert_eq!(once(&repo, &seed_900()), Outcome::AlreadyApplied);
    assert_eq!(repo.inbox().len(), 1, "still one marker");
    assert_eq!(repo.history().len(), 1, "still one history row");
}

#[test]
fn a_failed_rollback_does_not_change_the_outcome() {
    let repo = FakeRepository::new();
    once(&repo, &seed_900());
    repo.fail_next(Step::Rollback);
    assert_eq!(once(&repo, &seed_900()), Outcome::AlreadyApplied);

    let injected = repo.fail_next(Step::TryInbox);
    repo.fail_next(Step::Rollback);
    assert_unknown_with(once(&repo, &seed_901()), &injected);
}

#[test]
fn the_seed_scenario_gives_two_markers_and_two_rows_for_one_ticket() {
    let repo = FakeRepository::new();
    assert_eq!(once(&repo, &seed_900()), Outcome::Applied);
    assert_eq!(once(&repo, &seed_900()), Outcome::AlreadyApplied);
    assert_eq!(once(&repo, &seed_901()), Outcome::Applied);
    assert_eq!(repo.inbox().len(), 2);
    let history = repo.history();
    assert_eq!(history.len(), 2);
    assert_eq!(history["event-ticket-901"], seed_901());
    assert!(history.values().all(|row| row.ticket_id == "ticket-42"));
}

#[test]
fn every_path_after_a_successful_begin_rolls_back_exactly_once_unless_committed() {
    // (scripted failure, whether the outcome is Applied)
    let cases: [(Option<Step>, bool); 4] = [
        (None, true),
        (Some(Step::TryInbox), false),
        (Some(Step::SaveHistory), false),
        (Some(Step::Commit), false),
    ];
    for (failure, applied) in cases {
        let repo = FakeRepository::new();
        if let Some(step) = failure {
            repo.fail_next(step);
        }
        let outcome = once(&repo, &seed_900());
        let calls = repo.take_calls();
        let committed = applied && calls.contains(&Call::Commit);
        assert_eq!(outcome == Outcome::Applied, committed, "{failure:?}");
        let expected_rollbacks = usize::from(!committed);
        assert_eq!(
            rollbacks(&calls),
            expected_rollbacks,
            "{failure:?}: {calls:?}"
        );
        if committed {
            let commit_at = calls.iter().position(|c| *c == Call::Commit).unwrap();
            assert_eq!(
                commit_at,
                calls.len() - 1,
                "nothing may follow a confirmed commit"
            );
        }
    }
}

#[test]
fn a_batch_of_new_events_is_applied_in_one_transaction() {
    let repo = FakeRepository::new();
    let (a, b) = (seed_900(), seed_901());
    let outcome = block_on(process_history_batch(&repo, &[&a, &b]));
    assert_eq!(outcome, Ok(vec![Resolution::Applied, Resolution::Applied]));
    assert_eq!(
        repo.take_calls(),
        vec![
            Call::Begin,
            Call::TryInboxBatch(vec!["event-ticket-900".into(), "event-ticket-901".into()]),
            Call::SaveHistoryBatch(vec!["event-ticket-900".into(), "event-ticket-901".into()]),
            Call::Commit,
        ]
    );
}

#[test]
fn a_batch_with_one_event_id_twice_applies_the_first_and_marks_the_rest_already_applied() {
    let repo = FakeRepository::new();
    let (a, b) = (seed_900(), seed_901());
    let outcome = block_on(process_history_batch(&repo, &[&a, &b, &a, &a]));
    assert_eq!(
        outcome,
        Ok(vec![
            Resolution::Applied,
            Resolution::Applied,
            Resolution::AlreadyApplied,
            Resolution::AlreadyApplied,
        ])
    );
    let calls = repo.take_calls();
    assert_eq!(
        calls[1],
        Call::TryInboxBatch(vec!["event-ticket-900".into(), "event-ticket-901".into()]),
        "ids are claimed once each"
    );
    assert_eq!(repo.history().len(), 2);
}

#[test]
fn a_repeat_within_a_batch_is_compared_with_the_row_the_batch_wrote_and_an_unread_row_is_unknown() {
    let repo = FakeRepository::new();
    once(&repo, &seed_900());
    let b = seed_901();
    let mut b_again = seed_901();
    b_again.to_status = "Closed".into();
    let a = seed_900();
    let written = block_on(write_history_batch(&repo, &[&b, &a, &b_again])).unwrap();
    assert_eq!(
        written.resolutions,
        vec![
            Resolution::Applied,
            Resolution::AlreadyApplied,
            Resolution::AlreadyApplied,
        ]
    );
    // The fake claims markers without reading rows: the stored row of the earlier event is not
    // known; the repeat's is the one this batch wrote, the first 901.
    assert_eq!(written.stored, vec![None, None, Some(seed_901())]);
    assert_ne!(written.stored[2].as_ref(), Some(&b_again));
}

#[test]
fn a_batch_mixing_stored_and_new_events_saves_only_the_new_ones() {
    let repo = FakeRepository::new();
    once(&repo, &seed_900());
    repo.take_calls();
    let (a, b) = (seed_900(), seed_901());
    let outcome = block_on(process_history_batch(&repo, &[&a, &b]));
    assert_eq!(
        outcome,
        Ok(vec![Resolution::AlreadyApplied, Resolution::Applied])
    );
    assert_eq!(
        repo.take_calls()[2],
        Call::SaveHistoryBatch(vec!["event-ticket-901".into()])
    );
}

#[test]
fn a_batch_of_only_duplicates_is_rolled_back_without_save_or_commit() {
    let repo = FakeRepository::new();
    once(&repo, &seed_900());
    repo.take_calls();
    let a = seed_900();
    let outcome = block_on(process_history_batch(&repo, &[&a, &a]));
    assert_eq!(
        outcome,
        Ok(vec![Resolution::AlreadyApplied, Resolution::AlreadyApplied])
    );
    assert_eq!(
        repo.take_calls(),
        vec![
            Call::Begin,
            Call::TryInboxBatch(vec!["event-ticket-900".into()]),
            Call::Rollback,
        ]
    );
}

#[test]
fn a_failing_batch_is_unknown_for_every_event_with_the_very_error_and_one_rollback() {
    for step in [Step::TryInbox, Step::SaveHistory, Step::Commit] {
        let repo = FakeRepository::new();
        let injected = repo.fail_next(step);
        let (a, b) = (seed_900(), seed_901());
        let outcome = block_on(process_history_batch(&repo, &[&a, &b]));
        assert_eq!(outcome, Err(injected), "{step:?}");
        let calls = repo.take_calls();
        assert_eq!(rollbacks(&calls), 1, "{step:?}: {calls:?}");
        assert_eq!(calls.last(), Some(&Call::Rollback));
        assert!(repo.inbox().is_empty());
    }
}

#[test]
fn a_batch_whose_begin_fails_is_unknown_without_rollback() {
    let repo = FakeRepository::new();
    let injected = repo.fail_next(Step::Begin);
    let a = seed_900();
    assert_eq!(block_on(process_history_batch(&repo, &[&a])), Err(injected));
    assert_eq!(repo.take_calls(), vec![Call::Begin]);
}

#[test]
fn a_batch_whose_commit_reply_is_lost_resolves_as_already_applied_on_redelivery() {
    let repo = FakeRepository::new();
    let injected = repo.apply_then_fail_next_commit();
    let (a, b) = (seed_900(), seed_901());
    assert_eq!(
        block_on(process_history_batch(&repo, &[&a, &b])),
        Err(injected)
    );
    assert_eq!(
        block_on(process_history_batch(&repo, &[&a, &b])),
        Ok(vec![Resolution::AlreadyApplied, Resolution::AlreadyApplied])
    );
    assert_eq!(repo.history().len(), 2);
}

#[test]
fn an_empty_batch_touches_nothing() {
    let repo = FakeRepository::new();
    assert_eq!(block_on(process_history_batch(&repo, &[])), Ok(vec![]));
    assert!(repo.take_calls().is_empty());
}
