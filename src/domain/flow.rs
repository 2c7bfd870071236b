//! Which partitions the Kafka client fetches. The brake of a healthy backlog is not here: it is
//! the intake's wait for room in the budget, which leaves prefetched records in the client. A
//! pause is the exception, because it is costly — the client drops what it prefetched for the
//! partition and fetches it again later. A partition is paused for one of three reasons:
//!
//! - **its window is full**: a record at its head does not resolve (an event the database
//!   rejects, a slow batch), so its later records could only wait, taking budget that other
//!   partitions need;
//! - **the whole instance is paused**: the budget stayed full longer than the intake waits
//!   (the database is down or slow). No record may be taken then, but the client must still be
//!   polled to serve rebalances, and a poll returns records of every fetching partition;
//! - **it waits for its turn**: its record batches are too large for every backlogged
//!   partition to hold one in the budget at once, and others hold the seats
//!   ([`super::rotation`]).
//!
//! A partition fetches whenever neither holds: nothing here can leave a partition paused while
//! it has room and the instance has too. Pure: the caller applies the [`Changes`] to the client.

use std::collections::HashSet;
use std::hash::Hash;

/// Partitions to pause and to resume, in the order the decision made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes<K> {
    pub pause: Vec<K>,
    pub resume: Vec<K>,
}

impl<K> Default for Changes<K> {
    fn default() -> Self {
        Changes {
            pause: Vec::new(),
            resume: Vec::new(),
        }
    }
}

impl<K> Changes<K> {
    pub fn is_empty(&self) -> bool {
        self.pause.is_empty() && self.resume.is_empty()
    }
}

#[derive(Debug, Clone)]
pub struct FlowPolicy<K> {
    instance_paused: bool,
    /// Partitions whose window is full.
    full: HashSet<K>,
    /// Partitions waiting for a seat in the rotation.
    waiting: HashSet<K>,
    /// Partitions the client was told to pause, and not to resume since.
    paused: HashSet<K>,
}

impl<K> Default for FlowPolicy<K> {
    fn default() -> Self {
        FlowPolicy {
            instance_paused: false,
            full: HashSet::new(),
            waiting: HashSet::new(),
            paused: HashSet::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> FlowPolicy<K> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_instance_paused(&self) -> bool {
        self.instance_paused
    }

    pub fn is_paused(&self, partition: &K) -> bool {
        self.paused.contains(partition)
    }

    fn wants_pause(&self, partition: &K) -> bool {
        self.instance_paused || self.full.contains(partition) || self.waiting.contains(partition)
    }

    /// Brings the client's state of `partition` in line with the reasons.
    fn settle(&mut self, partition: &K, changes: &mut Changes<K>) {
        let paused = self.paused.contains(partition);
        match (self.wants_pause(partition), paused) {
            (true, false) => {
                self.paused.insert(partition.clone());
                changes.pause.push(partition.clone());
            }
            (false, true) => {
                self.paused.remove(partition);
                changes.resume.push(partition.clone());
            }
            _ => {}
        }
    }

    /// A partition was assigned. Its window is new, so only the instance can hold it; it is
    /// resumed explicitly either way, since the client may keep a pause of an earlier
    /// assignment of the same partition.
    pub fn assigned(&mut self, partition: K) -> Changes<K> {
        self.full.remove(&partition);
        self.waiting.remove(&partition);
        let mut changes = Changes::default();
        if self.instance_paused {
            self.settle(&partition, &mut changes);
        } else {
            self.paused.remove(&partition);
            changes.resume.push(partition);
        }
        changes
    }

    /// A partition left this process: nothing about it is kept.
    pub fn revoked(&mut self, partition: &K) {
        self.full.remove(partition);
        self.waiting.remove(partition);
        self.paused.remove(partition);
    }

    /// The partition's window filled: its records can only wait.
    pub fn window_full(&mut self, partition: K) -> Changes<K> {
        let mut changes = Changes::default();
        self.full.insert(partition.clone());
        self.settle(&partition, &mut changes);
        changes
    }

    /// The partition's window drained (to half): it may fetch again.
    pub fn window_drained(&mut self, partition: &K) -> Changes<K> {
        let mut changes = Changes::default();
        if self.full.remove(partition) {
            self.settle(partition, &mut changes);
        }
        changes
    }

    /// The partition waits for a seat in the rotation: it stops fetching.
    pub fn wait_turn(&mut self, partition: K) -> Changes<K> {
        let mut changes = Changes::default();
        self.waiting.insert(partition.clone());
        self.settle(&partition, &mut changes);
        changes
    }

    /// The partition's turn came (or it left the rotation): it fetches unless another reason
    /// holds it.
    pub fn take_turn(&mut self, partition: &K) -> Changes<K> {
        let mut changes = Changes::default();
        if self.waiting.remove(partition) {
            self.settle(partition, &mut changes);
        }
        changes
    }

    pub fn is_waiting(&self, partition: &K) -> bool {
        self.waiting.contains(partition)
    }

    /// The budget stayed full: every partition in `assigned` stops fetching, so that the client
    /// can be polled for rebalances without handing out records.
    pub fn pause_instance<'a>(&mut self, assigned: impl IntoIterator<Item = &'a K>) -> Changes<K>
    where
        K: 'a,
    {
        self.instance_paused = true;
        let mut changes = Changes::default();
        for partition in assigned {
            self.settle(partition, &mut changes);
        }
        changes
    }

    /// The budget has room again: every paused partition whose window is not full fetches.
    pub fn resume_instance(&mut self) -> Changes<K> {
        self.instance_paused = false;
        let mut changes = Changes::default();
        let paused: Vec<K> = self.paused.iter().cloned().collect();
        for partition in paused {
            self.settle(&partition, &mut changes);
        }
        changes
    }

    /// The client handed out a record of `partition` while the instance was paused (assigned
    /// after the pause): the record is kept, and the partition paused with the others.
    pub fn fetched_while_paused(&mut self, partition: K) -> Changes<K> {
        let mut changes = Changes::default();
        if self.instance_paused {
            self.settle(&partition, &mut changes);
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pause(partitions: &[u8]) -> Changes<u8> {
        Changes {
            pause: partitions.to_vec(),
            resume: Vec::new(),
        }
    }

    fn resume(partitions: &[u8]) -> Changes<u8> {
        Changes {
            pause: Vec::new(),
            resume: partitions.to_vec(),
        }
    }

    #[test]
    fn a_full_window_pauses_its_partition_alone_until_it_drains() {
        let mut flow = FlowPolicy::new();
        flow.assigned(1);
        flow.assigned(2);
        assert_eq!(flow.window_full(1), pause(&[1]));
        assert_eq!(flow.window_full(1), Changes::default(), "already paused");
        assert!(!flow.is_paused(&2));
        assert_eq!(flow.window_drained(&1), resume(&[1]));
        assert_eq!(flow.window_drained(&1), Changes::default());
    }

    #[test]
    fn the_instance_pause_holds_every_partition_and_its_end_keeps_full_windows_paused() {
        let mut flow = FlowPolicy::new();
        for p in [1, 2, 3] {
            flow.assigned(p);
        }
        flow.window_full(2);
        let mut paused = flow.pause_instance(&[1, 2, 3]).pause;
        paused.sort();
        assert_eq!(paused, vec![1, 3]);
        assert_eq!(
            flow.window_drained(&2),
            Changes::default(),
            "the instance still holds it"
        );
        flow.window_full(3);
        let mut resumed = flow.resume_instance().resume;
        resumed.sort();
        assert_eq!(resumed, vec![1, 2], "3's window is full");
    }

    #[test]
    fn a_partition_assigned_during_the_instance_pause_is_paused_and_resumed_with_it() {
        let mut flow = FlowPolicy::new();
        flow.pause_instance(&[]);
        assert_eq!(flow.assigned(7), pause(&[7]));
        assert_eq!(flow.resume_instance(), resume(&[7]));
    }

    #[test]
    fn a_record_fetched_during_the_instance_pause_pauses_its_partition() {
        let mut flow = FlowPolicy::new();
        flow.assigned(1);
        flow.pause_instance(&[1]);
        assert_eq!(flow.fetched_while_paused(4), pause(&[4]));
        assert_eq!(flow.fetched_while_paused(4), Changes::default());
        assert_eq!(flow.fetched_while_paused(1), Changes::default());
        let mut resumed = flow.resume_instance().resume;
        resumed.sort();
        assert_eq!(resumed, vec![1, 4]);
    }

    #[test]
    fn a_partition_waiting_for_its_turn_stays_paused_through_the_instance_pause_and_its_window() {
        let mut flow = FlowPolicy::new();
        flow.assigned(1);
        flow.assigned(2);
        assert_eq!(flow.wait_turn(1), pause(&[1]));
        assert_eq!(flow.wait_turn(1), Changes::default());
        flow.pause_instance(&[1, 2]);
        assert_eq!(flow.resume_instance(), resume(&[2]), "1 still waits");
        flow.window_full(1);
        assert_eq!(flow.take_turn(&1), Changes::default(), "its window is full");
        assert_eq!(flow.window_drained(&1), resume(&[1]));
        assert_eq!(flow.take_turn(&2), Changes::default(), "2 never waited");
    }

    #[test]
    fn a_reassigned_partition_fetches_again_whatever_held_its_earlier_assignment() {
        let mut flow = FlowPolicy::new();
        flow.assigned(1);
        flow.window_full(1);
        flow.revoked(&1);
        assert_eq!(flow.assigned(1), resume(&[1]));
        assert!(!flow.is_paused(&1));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Assign(u8),
        Revoke(u8),
        Full(u8),
        Drained(u8),
        PauseInstance,
        ResumeInstance,
        FetchedWhilePaused(u8),
        WaitTurn(u8),
        TakeTurn(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        let partition = 0u8..6;
        prop_oneof![
            partition.clone().prop_map(Step::Assign),
            partition.clone().prop_map(Step::Revoke),
            partition.clone().prop_map(Step::Full),
            partition.clone().prop_map(Step::Drained),
            Just(Step::PauseInstance),
            Just(Step::ResumeInstance),
            partition.clone().prop_map(Step::FetchedWhilePaused),
            partition.clone().prop_map(Step::WaitTurn),
            partition.prop_map(Step::TakeTurn),
        ]
    }

    proptest! {
        /// Replaying the changes on a model of the client, after every step each assigned
        /// partition is paused exactly when its window is full, it waits for its turn or the
        /// instance is paused: no
        /// partition idles while it and the instance have room, and none fetches past a reason
        /// to stop.
        #[test]
        fn the_client_fetches_exactly_the_partitions_with_no_reason_to_stop(
            steps in proptest::collection::vec(step(), 0..80)
        ) {
            let mut flow = FlowPolicy::new();
            let mut client_paused: HashSet<u8> = HashSet::new();
            let mut assigned: HashSet<u8> = HashSet::new();
            let mut full: HashSet<u8> = HashSet::new();
            let mut waiting: HashSet<u8> = HashSet::new();
            let mut instance = false;
            for step in steps {
                let changes = match step {
                    Step::Assign(p) => {
                        assigned.insert(p);
                        full.remove(&p);
                        waiting.remove(&p);
                        flow.assigned(p)
                    }
                    Step::Revoke(p) => {
                        assigned.remove(&p);
                        full.remove(&p);
                        waiting.remove(&p);
                        client_paused.remove(&p);
                        flow.revoked(&p);
                        Changes::default()
                    }
                    Step::Full(p) if assigned.contains(&p) => {
                        full.insert(p);
                        flow.window_full(p)
                    }
                    Step::Drained(p) if assigned.contains(&p) => {
                        full.remove(&p);
                        flow.window_drained(&p)
                    }
                    Step::PauseInstance => {
                        instance = true;
                        let list: Vec<u8> = assigned.iter().copied().collect();
                        flow.pause_instance(&list)
                    }
                    Step::ResumeInstance => {
                        instance = false;
                        flow.resume_instance()
                    }
                    Step::FetchedWhilePaused(p) if assigned.contains(&p) => {
                        flow.fetched_while_paused(p)
                    }
                    Step::WaitTurn(p) if assigned.contains(&p) => {
                        waiting.insert(p);
                        flow.wait_turn(p)
                    }
                    Step::TakeTurn(p) if assigned.contains(&p) => {
                        waiting.remove(&p);
                        flow.take_turn(&p)
                    }
                    _ => Changes::default(),
                };
                for p in changes.pause {
                    prop_assert!(client_paused.insert(p), "paused twice: {}", p);
                }
                for p in changes.resume {
                    client_paused.remove(&p);
                }
                for p in &assigned {
                    let should = instance || full.contains(p) || waiting.contains(p);
                    prop_assert_eq!(client_paused.contains(p), should, "partition {}", p);
                }
            }
        }
    }
}
