//! A scripted, in-memory repository that records every call, for proving the outcome rules.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::event::HistoryEvent;
use super::outcome::{HistoryRepository, HistoryTransaction};

/// One call made on the repository or its transaction, with its argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Call {
    Begin,
    TryInbox(String),
    TryInboxBatch(Vec<String>),
    SaveHistory(String),
    SaveHistoryBatch(Vec<String>),
    Commit,
    Rollback,
}

/// The step a scripted failure is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Step {
    Begin,
    TryInbox,
    SaveHistory,
    Commit,
    Rollback,
}

/// An injected failure. Each carries a unique token, so a test can tell the very error it
/// injected from any other with the same text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("injected failure #{token} at {step:?}")]
pub(super) struct FakeError {
    pub token: u64,
    pub step: Step,
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

impl FakeError {
    pub(super) fn new(step: Step) -> Self {
        FakeError {
            token: NEXT_TOKEN.fetch_add(1, Ordering::Relaxed),
            step,
        }
    }
}

enum Script {
    /// The step fails and changes nothing.
    Fail(FakeError),
    /// Commit only: the pair is applied, then the reply is "lost" and the error returned.
    ApplyThenFail(FakeError),
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    inbox: HashSet<String>,
    history: HashMap<String, HistoryEvent>,
    scripts: HashMap<Step, VecDeque<Script>>,
}

impl State {
    fn scripted(&mut self, step: Step) -> Option<Script> {
        self.scripts.get_mut(&step).and_then(VecDeque::pop_front)
    }

    fn fail_if_scripted(&mut self, step: Step) -> Result<(), FakeError> {
        match self.scripted(step) {
            Some(Script::Fail(err)) | Some(Script::ApplyThenFail(err)) => Err(err),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Default)]
pub(super) struct FakeRepository {
    state: Arc<Mutex<State>>,
}

impl FakeRepository {
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// The next call of `step` fails with the returned error and changes nothing.
    pub(super) fn fail_next(&self, step: Step) -> FakeError {
        let err = FakeError::new(step);
        self.push_script(step, Script::Fail(err.clone()));
        err
    }

    /// The next Commit applies the pending pair(s), then returns the error (a lost reply).
    pub(super) fn apply_then_fail_next_commit(&self) -> FakeError {
        let err = FakeError::new(Step::Commit);
        self.push_script(Step::Commit, Script::ApplyThenFail(err.clone()));
        err
    }

    fn push_script(&self, step: Step, script: Script) {
        let mut state = self.state.lock().unwrap();
        state.scripts.entry(step).or_default().push_back(script);
    }

    /// Every call so far, in order; clears the log.
    pub(super) fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.state.lock().unwrap().calls)
    }

    pub(super) fn inbox(&self) -> HashSet<String> {
        self.state.lock().unwrap().inbox.clone()
    }

    pub(super) fn history(&self) -> HashMap<String, HistoryEvent> {
        self.state.lock().unwrap().history.clone()
    }

    fn record(&self, call: Call) -> std::sync::MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap();
        state.calls.push(call);
        state
    }
}

impl HistoryRepository for FakeRepository {
    type Error = FakeError;
    type Tx = FakeTx;

    async fn begin(&self) -> Result<FakeTx, FakeError> {
        self.record(Call::Begin).fail_if_scripted(Step::Begin)?;
        Ok(FakeTx {
            repository: self.clone(),
            pending_inbox: Vec::new(),
            pending_history: Vec::new(),
        })
    }
}

/// Writes become visible to other transactions only on Commit, as in PostgreSQL.
pub(super) struct FakeTx {
    repository: FakeRepository,
    pending_inbox: Vec<String>,
    pending_history: Vec<HistoryEvent>,
}

impl FakeTx {
    fn claim(&mut self, state: &State, event_id: &str) -> bool {
        let taken =
            state.inbox.contains(event_id) || self.pending_inbox.iter().any(|id| id == event_id);
        if !taken {
            self.pending_inbox.push(event_id.to_owned());
        }
        !taken
    }

    fn stage_history(&mut self, state: &State, event: &HistoryEvent) {
        // The schema's foreign key: a history row needs a marker.
        assert!(
            state.inbox.contains(&event.event_id) || self.pending_inbox.contains(&event.event_id),
            "history row for {} without an inbox marker",
            event.event_id
        );
        self.pending_history.push(event.clone());
    }

    fn apply(&mut self, state: &mut State) {
        state.inbox.extend(self.pending_inbox.drain(..));
        for event in self.pending_history.drain(..) {
            let previous = state.history.insert(event.event_id.clone(), event);
            assert!(previous.is_none(), "second history row for one event_id");
        }
    }
}

impl HistoryTransaction for FakeTx {
    type Error = FakeError;

    async fn try_inbox(&mut self, event_id: &str) -> Result<bool, FakeError> {
        let repository = self.repository.clone();
        let mut state = repository.record(Call::TryInbox(event_id.to_owned()));
        state.fail_if_scripted(Step::TryInbox)?;
        Ok(self.claim(&state, event_id))
    }

    async fn try_inbox_batch(&mut self, event_ids: &[&str]) -> Result<Vec<bool>, FakeError> {
        let repository = self.repository.clone();
        let ids = event_ids.iter().map(|id| id.to_string()).collect();
        let mut state = repository.record(Call::TryInboxBatch(ids));
        state.fail_if_scripted(Step::TryInbox)?;
        Ok(event_ids.iter().map(|id| self.claim(&state, id)).collect())
    }

    async fn save_history(&mut self, event: &HistoryEvent) -> Result<(), FakeError> {
        let repository = self.repository.clone();
        let mut state = repository.record(Call::SaveHistory(event.event_id.clone()));
        state.fail_if_scripted(Step::SaveHistory)?;
        self.stage_history(&state, event);
        Ok(())
    }

    async fn save_history_batch(&mut self, events: &[&HistoryEvent]) -> Result<(), FakeError> {
        let repository = self.repository.clone();
        let ids = events.iter().map(|event| event.event_id.clone()).collect();
        let mut state = repository.record(Call::SaveHistoryBatch(ids));
        state.fail_if_scripted(Step::SaveHistory)?;
        for event in events {
            self.stage_history(&state, event);
        }
        Ok(())
    }

    async fn commit(&mut self) -> Result<(), FakeError> {
        let repository = self.repository.clone();
        let mut state = repository.record(Call::Commit);
        match state.scripted(Step::Commit) {
            Some(Script::Fail(err)) => Err(err),
            Some(Script::ApplyThenFail(err)) => {
                self.apply(&mut state);
                Err(err)
            }
            None => {
                self.apply(&mut state);
                Ok(())
            }
        }
    }

    async fn rollback(&mut self) -> Result<(), FakeError> {
        let repository = self.repository.clone();
        let mut state = repository.record(Call::Rollback);
        self.pending_inbox.clear();
        self.pending_history.clear();
        state.fail_if_scripted(Step::Rollback)
    }
}
