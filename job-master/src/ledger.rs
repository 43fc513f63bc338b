//! Dynamic data sharding with an auditable ledger (pure, no I/O).
//!
//! The training set `0..num_samples` is cut into shards of `shard_size` samples, once per epoch.
//! Workers lease one shard at a time and report it done once its samples are applied to the model.
//! A dead holder's lease returns to the front of the queue. Every completion is appended to a
//! history; [`ShardLedger::restore`] rolls the ledger back to a checkpoint's snapshot (the model
//! went back to that checkpoint, so the samples done since must be done again) and marks the
//! undone history entries as rolled back. [`ShardLedger::verify_exactly_once`] proves, per epoch,
//! that the committed completions tile `0..num_samples` exactly once.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

/// Who holds a lease: a process slot and the incarnation of it that asked.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Holder {
    pub role: String,
    pub index: u32,
    pub incarnation: u64,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} (incarnation {})",
            self.role, self.index, self.incarnation
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRange {
    pub id: u64,
    pub epoch: u32,
    pub start: u64,
    pub end: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum ShardState {
    Todo,
    Leased(Holder),
    Done,
}

/// One completion, as it happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    pub shard: u64,
    pub epoch: u32,
    pub start: u64,
    pub end: u64,
    pub by: Holder,
    /// Set when a restore to an earlier checkpoint undid this completion.
    pub rolled_back: bool,
}

/// What a checkpoint records of the data position: the shards done when it was taken.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerSnapshot {
    pub done: BTreeSet<u64>,
    /// Length of the completion history at the snapshot.
    pub history_len: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    Granted(ShardRange),
    /// Every remaining shard is leased to someone else.
    Wait,
    /// Every shard of every epoch is done.
    EndOfData,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("unknown shard {0}")]
    UnknownShard(u64),
    #[error("shard {shard} is not leased to {holder}")]
    NotLeased { shard: u64, holder: Holder },
    #[error("epoch {epoch}: {problem}")]
    NotExactlyOnce { epoch: u32, problem: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "LedgerRepr", try_from = "LedgerRepr")]
pub struct ShardLedger {
    num_samples: u64,
    shard_size: u64,
    epochs: u32,
    states: Vec<ShardState>,
    /// Shard ids waiting to be leased, in the order they will be handed out.
    queue: VecDeque<u64>,
    history: Vec<Completion>,
    done_count: u64,
}

impl ShardLedger {
    pub fn new(num_samples: u64, shard_size: u64, epochs: u32) -> Self {
        assert!(
            num_samples > 0 && shard_size > 0 && epochs > 0,
            "validated by the spec"
        );
        let total = num_samples.div_ceil(shard_size) * epochs as u64;
        Self {
            num_samples,
            shard_size,
            epochs,
            states: vec![ShardState::Todo; total as usize],
            queue: (0..total).collect(),
            history: Vec::new(),
            done_count: 0,
        }
    }

    pub fn shards_per_epoch(&self) -> u64 {
        self.num_samples.div_ceil(self.shard_size)
    }

    pub fn total_shards(&self) -> u64 {
        self.states.len() as u64
    }

    pub fn done_shards(&self) -> u64 {
        self.done_count
    }

    pub fn in_flight(&self) -> usize {
        self.states
            .iter()
            .filter(|s| matches!(s, ShardState::Leased(_)))
            .count()
    }

    pub fn is_complete(&self) -> bool {
        self.done_count == self.total_shards()
    }

    /// The epoch of the lowest shard not yet done (the epoch in progress).
    pub fn current_epoch(&self) -> u32 {
        let first = self.states.iter().position(|s| *s != ShardState::Done);
        match first {
            Some(i) => (i as u64 / self.shards_per_epoch()) as u32,
            None => self.epochs.saturating_sub(1),
        }
    }

    pub fn range(&self, id: u64) -> Result<ShardRange, LedgerError> {
        if id >= self.total_shards() {
            return Err(LedgerError::UnknownShard(id));
        }
        let per = self.shards_per_epoch();
        let start = (id % per) * self.shard_size;
        Ok(ShardRange {
            id,
            epoch: (id / per) as u32,
            start,
            end: (start + self.shard_size).min(self.num_samples),
        })
    }

    /// The shard `holder` holds now, if any.
    pub fn held_by(&self, holder: &Holder) -> Option<ShardRange> {
        self.states
            .iter()
            .position(|s| matches!(s, ShardState::Leased(h) if h == holder))
            .map(|id| self.range(id as u64).expect("own index"))
    }

    /// Hands `holder` a shard. A holder that already holds one gets the same one again, so a
    /// retried request never leases two shards.
    pub fn lease(&mut self, holder: &Holder) -> LeaseOutcome {
        if let Some(held) = self.held_by(holder) {
            return LeaseOutcome::Granted(held);
        }
        match self.queue.pop_front() {
            Some(id) => {
                self.states[id as usize] = ShardState::Leased(holder.clone());
                LeaseOutcome::Granted(self.range(id).expect("queued ids are valid"))
            }
            None if self.is_complete() => LeaseOutcome::EndOfData,
            None => LeaseOutcome::Wait,
        }
    }

    /// Records that `holder` applied every sample of shard `id`.
    pub fn complete(&mut self, holder: &Holder, id: u64) -> Result<ShardRange, LedgerError> {
        let range = self.range(id)?;
        match &self.states[id as usize] {
            ShardState::Leased(h) if h == holder => {}
            _ => {
                return Err(LedgerError::NotLeased {
                    shard: id,
                    holder: holder.clone(),
                });
            }
        }
        self.states[id as usize] = ShardState::Done;
        self.done_count += 1;
        self.history.push(Completion {
            shard: id,
            epoch: range.epoch,
            start: range.start,
            end: range.end,
            by: holder.clone(),
            rolled_back: false,
        });
        Ok(range)
    }

    /// Returns every shard leased to any incarnation of `(role, index)` to the front of the
    /// queue, lowest id first. Returns the ids released.
    pub fn release(&mut self, role: &str, index: u32) -> Vec<u64> {
        let released: Vec<u64> = self
            .states
            .iter()
            .enumerate()
            .filter(
                |(_, s)| matches!(s, ShardState::Leased(h) if h.role == role && h.index == index),
            )
            .map(|(i, _)| i as u64)
            .collect();
        for &id in released.iter().rev() {
            self.states[id as usize] = ShardState::Todo;
            self.queue.push_front(id);
        }
        released
    }

    pub fn snapshot(&self) -> LedgerSnapshot {
        LedgerSnapshot {
            done: self
                .states
                .iter()
                .enumerate()
                .filter(|(_, s)| **s == ShardState::Done)
                .map(|(i, _)| i as u64)
                .collect(),
            history_len: self.history.len(),
        }
    }

    /// Rolls back to `snap`: shards done since are undone (and their completions marked rolled
    /// back), every lease is dropped, and the queue is rebuilt in id order.
    pub fn restore(&mut self, snap: &LedgerSnapshot) {
        for (i, s) in self.states.iter_mut().enumerate() {
            *s = if snap.done.contains(&(i as u64)) {
                ShardState::Done
            } else {
                ShardState::Todo
            };
        }
        for c in self.history.iter_mut().skip(snap.history_len) {
            c.rolled_back = true;
        }
        self.done_count = snap.done.len() as u64;
        self.queue = (0..self.total_shards())
            .filter(|i| !snap.done.contains(i))
            .collect();
    }

    pub fn history(&self) -> &[Completion] {
        &self.history
    }

    /// Committed (not rolled back) samples per epoch.
    pub fn samples_per_epoch(&self) -> BTreeMap<u32, u64> {
        let mut m = BTreeMap::new();
        for c in self.history.iter().filter(|c| !c.rolled_back) {
            *m.entry(c.epoch).or_insert(0) += c.end - c.start;
        }
        m
    }

    /// Proves that, for every epoch, the committed completions cover each training sample exactly
    /// once (when `complete` is true, also that nothing is missing).
    pub fn verify_exactly_once(&self, require_complete: bool) -> Result<(), LedgerError> {
        for epoch in 0..self.epochs {
            let mut ranges: Vec<(u64, u64)> = self
                .history
                .iter()
                .filter(|c| !c.rolled_back && c.epoch == epoch)
                .map(|c| (c.start, c.end))
                .collect();
            ranges.sort_unstable();
            let mut covered_to = 0u64;
            for (start, end) in ranges {
                if start < covered_to {
                    return Err(LedgerError::NotExactlyOnce {
                        epoch,
                        problem: format!("samples {start}..{} consumed twice", end.min(covered_to)),
                    });
                }
                if require_complete && start > covered_to {
                    return Err(LedgerError::NotExactlyOnce {
                        epoch,
                        problem: format!("samples {covered_to}..{start} never consumed"),
                    });
                }
                covered_to = end;
            }
            if require_complete && covered_to != self.num_samples {
                return Err(LedgerError::NotExactlyOnce {
                    epoch,
                    problem: format!("samples {covered_to}..{} never consumed", self.num_samples),
                });
            }
        }
        Ok(())
    }
}

/// The ledger as persisted: done and queued shard ids as ranges (they are mostly contiguous),
/// leases by id, and the history as tuples `[shard, role, index, incarnation, rolled_back]`;
/// shard ranges are derived from ids on load. Keeps every durable write small.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerRepr {
    num_samples: u64,
    shard_size: u64,
    epochs: u32,
    done: Vec<(u64, u64)>,
    queue: Vec<(u64, u64)>,
    leased: Vec<(u64, Holder)>,
    history: Vec<(u64, String, u32, u64, bool)>,
}

/// Consecutive runs of `ids` as half-open ranges, in the given order.
fn to_ranges(ids: impl IntoIterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for id in ids {
        match out.last_mut() {
            Some((_, end)) if *end == id => *end += 1,
            _ => out.push((id, id + 1)),
        }
    }
    out
}

impl From<ShardLedger> for LedgerRepr {
    fn from(l: ShardLedger) -> Self {
        let done = to_ranges(
            l.states
                .iter()
                .enumerate()
                .filter(|(_, s)| **s == ShardState::Done)
                .map(|(i, _)| i as u64),
        );
        let leased = l
            .states
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                ShardState::Leased(h) => Some((i as u64, h.clone())),
                _ => None,
            })
            .collect();
        LedgerRepr {
            num_samples: l.num_samples,
            shard_size: l.shard_size,
            epochs: l.epochs,
            done,
            queue: to_ranges(l.queue.iter().copied()),
            leased,
            history: l
                .history
                .into_iter()
                .map(|c| {
                    (
                        c.shard,
                        c.by.role,
                        c.by.index,
                        c.by.incarnation,
                        c.rolled_back,
                    )
                })
                .collect(),
        }
    }
}

impl TryFrom<LedgerRepr> for ShardLedger {
    type Error = String;
    fn try_from(r: LedgerRepr) -> Result<Self, String> {
        if r.num_samples == 0 || r.shard_size == 0 || r.epochs == 0 {
            return Err("a ledger needs samples, a shard size and epochs".into());
        }
        let mut l = ShardLedger::new(r.num_samples, r.shard_size, r.epochs);
        let total = l.total_shards();
        let check = |id: u64| {
            if id < total {
                Ok(id)
            } else {
                Err(format!("shard {id} is out of range (total {total})"))
            }
        };
        l.states.iter_mut().for_each(|s| *s = ShardState::Todo);
        for (a, b) in r.done {
            for id in a..b {
                l.states[check(id)? as usize] = ShardState::Done;
            }
        }
        for (id, h) in r.leased {
            l.states[check(id)? as usize] = ShardState::Leased(h);
        }
        l.done_count = l.states.iter().filter(|s| **s == ShardState::Done).count() as u64;
        l.queue = r.queue.into_iter().flat_map(|(a, b)| a..b).collect();
        for &id in &l.queue {
            check(id)?;
        }
        l.history = r
            .history
            .into_iter()
            .map(|(shard, role, index, incarnation, rolled_back)| {
                let range = l.range(shard).map_err(|e| e.to_string())?;
                Ok(Completion {
                    shard,
                    epoch: range.epoch,
                    start: range.start,
                    end: range.end,
                    by: Holder {
                        role,
                        index,
                        incarnation,
                    },
                    rolled_back,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(index: u32, inc: u64) -> Holder {
        Holder {
            role: "worker".into(),
            index,
            incarnation: inc,
        }
    }

    #[test]
    fn last_shard_is_short_and_epochs_repeat_the_ranges() {
        let l = ShardLedger::new(10, 4, 2);
        assert_eq!(l.total_shards(), 6);
        assert_eq!(
            l.range(2).unwrap(),
            ShardRange {
                id: 2,
                epoch: 0,
                start: 8,
                end: 10
            }
        );
        assert_eq!(
            l.range(3).unwrap(),
            ShardRange {
                id: 3,
                epoch: 1,
                start: 0,
                end: 4
            }
        );
        assert_eq!(l.range(6), Err(LedgerError::UnknownShard(6)));
    }

    #[test]
    fn a_retried_lease_returns_the_shard_already_held() {
        let mut l = ShardLedger::new(10, 4, 1);
        let a = l.lease(&h(0, 1));
        assert_eq!(l.lease(&h(0, 1)), a);
        assert_eq!(l.in_flight(), 1);
    }

    #[test]
    fn a_dead_holders_shard_is_leased_again_and_counted_once() {
        let mut l = ShardLedger::new(8, 4, 1);
        let LeaseOutcome::Granted(s0) = l.lease(&h(0, 1)) else {
            panic!()
        };
        let LeaseOutcome::Granted(s1) = l.lease(&h(1, 1)) else {
            panic!()
        };
        assert_eq!(l.lease(&h(2, 1)), LeaseOutcome::Wait);
        l.complete(&h(1, 1), s1.id).unwrap();
        assert_eq!(l.release("worker", 0), vec![s0.id]);
        // The old incarnation cannot complete it any more.
        assert!(l.complete(&h(0, 1), s0.id).is_err());
        let LeaseOutcome::Granted(again) = l.lease(&h(0, 2)) else {
            panic!()
        };
        assert_eq!(again, s0);
        l.complete(&h(0, 2), s0.id).unwrap();
        assert_eq!(l.lease(&h(0, 2)), LeaseOutcome::EndOfData);
        l.verify_exactly_once(true).unwrap();
    }

    #[test]
    fn restore_undoes_completions_after_the_snapshot() {
        let mut l = ShardLedger::new(8, 2, 1);
        let LeaseOutcome::Granted(a) = l.lease(&h(0, 1)) else {
            panic!()
        };
        l.complete(&h(0, 1), a.id).unwrap();
        let snap = l.snapshot();
        let LeaseOutcome::Granted(b) = l.lease(&h(0, 1)) else {
            panic!()
        };
        l.complete(&h(0, 1), b.id).unwrap();
        let LeaseOutcome::Granted(_) = l.lease(&h(1, 1)) else {
            panic!()
        };
        l.restore(&snap);
        assert_eq!(l.done_shards(), 1);
        assert_eq!(l.in_flight(), 0);
        assert!(l.history()[1].rolled_back);
        while let LeaseOutcome::Granted(s) = l.lease(&h(2, 1)) {
            l.complete(&h(2, 1), s.id).unwrap();
        }
        assert!(l.is_complete());
        l.verify_exactly_once(true).unwrap();
        assert_eq!(l.samples_per_epoch()[&0], 8);
    }

    #[test]
    fn the_persisted_form_is_compact_and_round_trips() {
        let mut l = ShardLedger::new(100_000, 10, 3);
        for i in 0..500 {
            let w = h(i % 4, 1);
            let LeaseOutcome::Granted(s) = l.lease(&w) else {
                panic!()
            };
            l.complete(&w, s.id).unwrap();
        }
        let _ = l.lease(&h(7, 2));
        l.release("worker", 0);
        let json = serde_json::to_string(&l).unwrap();
        assert!(
            json.len() < 25_000,
            "{} bytes for 30,000 shards and 500 completions",
            json.len()
        );
        let back: ShardLedger = serde_json::from_str(&json).unwrap();
        assert_eq!(back, l);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Lease(u32),
        Complete(u32),
        Kill(u32),
        Snapshot,
        Restore,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..4).prop_map(Op::Lease),
            4 => (0u32..4).prop_map(Op::Complete),
            1 => (0u32..4).prop_map(Op::Kill),
            1 => Just(Op::Snapshot),
            1 => Just(Op::Restore),
        ]
    }

    proptest! {
        /// Whatever mix of leases, completions, deaths and rollbacks happens, the committed
        /// history never covers a sample twice, and draining the rest completes every epoch.
        #[test]
        fn no_sample_lost_or_repeated(n in 1u64..60, size in 1u64..9, epochs in 1u32..3,
                                      ops in proptest::collection::vec(op(), 0..200)) {
            let mut l = ShardLedger::new(n, size, epochs);
            let mut inc = [1u64; 4];
            let mut held: [Option<u64>; 4] = [None; 4];
            let mut snap = l.snapshot();
            for o in ops {
                match o {
                    Op::Lease(w) => if let LeaseOutcome::Granted(s) = l.lease(&h(w, inc[w as usize])) {
                        held[w as usize] = Some(s.id);
                    },
                    Op::Complete(w) => if let Some(id) = held[w as usize].take() {
                        l.complete(&h(w, inc[w as usize]), id).unwrap();
                    },
                    Op::Kill(w) => {
                        l.release("worker", w);
                        held[w as usize] = None;
                        inc[w as usize] += 1;
                    }
                    Op::Snapshot => snap = l.snapshot(),
                    Op::Restore => {
                        l.restore(&snap);
                        held = [None; 4];
                        for i in inc.iter_mut() { *i += 1; }
                    }
                }
                prop_assert!(l.verify_exactly_once(false).is_ok());
            }
            for w in 0..4 {
                if let Some(id) = held[w] { l.complete(&h(w as u32, inc[w]), id).unwrap(); }
            }
            while let LeaseOutcome::Granted(s) = l.lease(&h(9, 1)) {
                l.complete(&h(9, 1), s.id).unwrap();
            }
            prop_assert!(l.is_complete());
            prop_assert!(l.verify_exactly_once(true).is_ok());
            let per_epoch = l.samples_per_epoch();
            prop_assert!(per_epoch.values().all(|&s| s == n));
        }
    }
}
