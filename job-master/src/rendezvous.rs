//! Rendezvous (pure, no I/O; time is an input in milliseconds).
//!
//! * [`RoundRendezvous`] for allreduce jobs: members join; a round closes as soon as the expected
//!   number (capped at `max`) is there, or, once `min` are there, when the last-call window has
//!   passed; while members the master launched are still on their way (a platform such as Ray
//!   takes seconds to start one), last call waits for them up to `launch_wait_ms`. A closed
//!   round admits the largest multiple of `node_unit` that fits, lowest indices first; the
//!   others wait for the next round. Each member gets rank (by index, but a lead the master
//!   names for one round first), world size and the peers.
//! * [`PsCluster`] for ps jobs: a versioned cluster spec that PS and workers join and leave
//!   independently; a worker is ready once every PS has an address.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub index: u32,
    pub incarnation: u64,
    pub addr: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Round {
    pub number: u64,
    /// Members in rank order (sorted by index, but a lead the master named first:
    /// [`RoundRendezvous::lead_next`]).
    pub members: Vec<Member>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinOutcome {
    Ready {
        round: u64,
        rank: u32,
        world_size: u32,
        peers: Vec<String>,
    },
    Waiting {
        reason: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundRendezvous {
    pub min: u32,
    pub max: u32,
    pub node_unit: u32,
    pub last_call_ms: u64,
    /// How many members the master has launched and expects to join.
    pub expected: u32,
    /// Members the master has launched that have not joined yet: starting, registering, or
    /// on their way to the rendezvous (set by the master before each join and tick).
    #[serde(default)]
    pub launching: u32,
    /// How long last call waits for members still on their way.
    #[serde(default)]
    pub launch_wait_ms: u64,
    waiting: BTreeMap<u32, Member>,
    min_reached_at_ms: Option<u64>,
    current: Option<Round>,
    next_round: u64,
    /// The member to rank 0 in the next round closed, when it is in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lead: Option<u32>,
}

impl RoundRendezvous {
    pub fn new(min: u32, max: u32, node_unit: u32, last_call_ms: u64, expected: u32) -> Self {
        Self {
            min,
            max,
            node_unit: node_unit.max(1),
            last_call_ms,
            expected,
            launching: 0,
            launch_wait_ms: 0,
            waiting: BTreeMap::new(),
            min_reached_at_ms: None,
            current: None,
            next_round: 0,
            lead: None,
        }
    }

    /// Member `index` leads (is rank 0 of) the next round closed, when it is in it; the others
    /// follow by index. For that one round only.
    pub fn lead_next(&mut self, index: u32) {
        self.lead = Some(index);
    }

    pub fn current(&self) -> Option<&Round> {
        self.current.as_ref()
    }

    /// Whether member `index` waits for the next round or is in the current one.
    pub fn has_joined(&self, index: u32) -> bool {
        self.waiting.contains_key(&index)
            || self
                .current
                .as_ref()
                .is_some_and(|r| r.members.iter().any(|m| m.index == index))
    }

    /// When members wait outside the current round that a new round could take in (it would be
    /// larger, within `max` and a multiple of `node_unit`): the current round's number and the
    /// waiting members' indices.
    pub fn late_joiners(&self) -> Option<(u64, Vec<u32>)> {
        let round = self.current.as_ref()?;
        let now = round.members.len() as u32;
        let could =
            ((now + self.waiting.len() as u32).min(self.max) / self.node_unit) * self.node_unit;
        (could > now).then(|| (round.number, self.waiting.keys().copied().collect()))
    }

    /// The number the next closed round will carry.
    pub fn next_round_number(&self) -> u64 {
        self.next_round
    }

    /// Ends the current round (a member failed or the size must change): everyone rejoins.
    pub fn invalidate(&mut self) {
        self.current = None;
        self.waiting.clear();
        self.min_reached_at_ms = None;
    }

    /// `member` asks to join at time `now_ms`.
    pub fn join(&mut self, member: Member, now_ms: u64) -> JoinOutcome {
        if let Some(out) = self.view(&member) {
            return out;
        }
        self.waiting.insert(member.index, member.clone());
        self.try_close(now_ms);
        self.view(&member).unwrap_or_else(|| JoinOutcome::Waiting {
            reason: self.waiting_reason(),
        })
    }

    /// Closes a round if the rules allow it now (also called on a timer for last call).
    pub fn try_close(&mut self, now_ms: u64) -> bool {
        if self.current.is_some() {
            return false;
        }
        let n = self.waiting.len() as u32;
        if n >= self.min {
            self.min_reached_at_ms.get_or_insert(now_ms);
        } else {
            self.min_reached_at_ms = None;
        }
        let target = self.expected.clamp(self.min, self.max);
        let window = if self.launching > 0 {
            self.last_call_ms.max(self.launch_wait_ms)
        } else {
            self.last_call_ms
        };
        let last_call_over = self
            .min_reached_at_ms
            .is_some_and(|t| now_ms.saturating_sub(t) >= window);
        if !(n >= target || last_call_over) {
            return false;
        }
        let size = (n.min(self.max) / self.node_unit) * self.node_unit;
        if size < self.min || size == 0 {
            return false;
        }
        let mut members: Vec<Member> = self.waiting.values().take(size as usize).cloned().collect();
        if let Some(lead) = self.lead.take()
            && let Some(p) = members.iter().position(|m| m.index == lead)
        {
            members[..=p].rotate_right(1);
        }
        for m in &members {
            self.waiting.remove(&m.index);
        }
        self.current = Some(Round {
            number: self.next_round,
            members,
        });
        self.next_round += 1;
        self.min_reached_at_ms = None;
        true
    }

    fn view(&self, member: &Member) -> Option<JoinOutcome> {
        let round = self.current.as_ref()?;
        let rank = round
            .members
            .iter()
            .position(|m| m.index == member.index && m.incarnation == member.incarnation)?;
        Some(JoinOutcome::Ready {
            round: round.number,
            rank: rank as u32,
            world_size: round.members.len() as u32,
            peers: round.members.iter().map(|m| m.addr.clone()).collect(),
        })
    }

    fn waiting_reason(&self) -> String {
        match &self.current {
            Some(r) => format!(
                "round {} is closed with {} members (max {}, node_unit {}); waiting for the next round",
                r.number,
                r.members.len(),
                self.max,
                self.node_unit
            ),
            None => format!(
                "{} of {} expected members have joined (min {})",
                self.waiting.len(),
                self.expected.clamp(self.min, self.max),
                self.min
            ),
        }
    }
}

/// The PS job's cluster spec: every PS and worker address, versioned.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PsCluster {
    /// Bumped by every change of a PS or worker address.
    pub version: u64,
    /// Bumped only when the PS set (count or an address) changes: a worker using another PS-set
    /// version must switch before it pushes again.
    #[serde(default)]
    pub ps_version: u64,
    pub expected_ps: u32,
    pub ps: BTreeMap<u32, String>,
    pub workers: BTreeMap<u32, String>,
}

impl PsCluster {
    pub fn new(expected_ps: u32) -> Self {
        Self {
            expected_ps,
            ..Self::default()
        }
    }

    pub fn set_ps(&mut self, index: u32, addr: String) {
        if self.ps.insert(index, addr.clone()).as_ref() != Some(&addr) {
            self.version += 1;
            self.ps_version += 1;
        }
    }

    pub fn remove_ps(&mut self, index: u32) {
        if self.ps.remove(&index).is_some() {
            self.version += 1;
            self.ps_version += 1;
        }
    }

    pub fn set_worker(&mut self, index: u32, addr: String) {
        if self.workers.insert(index, addr.clone()).as_ref() != Some(&addr) {
            self.version += 1;
        }
    }

    pub fn remove_worker(&mut self, index: u32) {
        if self.workers.remove(&index).is_some() {
            self.version += 1;
        }
    }

    /// Every expected PS has an address.
    pub fn ps_complete(&self) -> bool {
        (0..self.expected_ps).all(|i| self.ps.contains_key(&i))
    }

    pub fn ps_addrs(&self) -> Vec<String> {
        self.ps.values().cloned().collect()
    }

    pub fn worker_addrs(&self) -> Vec<String> {
        self.workers.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(index: u32) -> Member {
        Member {
            index,
            incarnation: 1,
            addr: format!("127.0.0.1:{}", 9000 + index),
        }
    }

    #[test]
    fn closes_as_soon_as_the_expected_members_join() {
        let mut r = RoundRendezvous::new(1, 4, 1, 60_000, 3);
        assert!(matches!(r.join(m(2), 0), JoinOutcome::Waiting { .. }));
        assert!(matches!(r.join(m(0), 1), JoinOutcome::Waiting { .. }));
        let JoinOutcome::Ready {
            rank,
            world_size,
            peers,
            round,
        } = r.join(m(1), 2)
        else {
            panic!()
        };
        assert_eq!((round, rank, world_size), (0, 1, 3));
        assert_eq!(peers[2], "127.0.0.1:9002");
        // Earlier joiners see the closed round on their next poll, ranked by index.
        assert!(matches!(
            r.join(m(2), 3),
            JoinOutcome::Ready { rank: 2, .. }
        ));
    }

    #[test]
    fn a_lead_named_for_the_next_round_is_its_rank_0_and_only_its() {
        let mut r = RoundRendezvous::new(1, 4, 1, 60_000, 3);
        r.lead_next(2);
        for i in [0, 1, 2] {
            r.join(m(i), 0);
        }
        let order = |r: &RoundRendezvous| -> Vec<u32> {
            r.current()
                .unwrap()
                .members
                .iter()
                .map(|m| m.index)
                .collect()
        };
        assert_eq!(order(&r), vec![2, 0, 1]);
        assert!(matches!(
            r.join(m(2), 1),
            JoinOutcome::Ready { rank: 0, .. }
        ));
        r.invalidate();
        for i in [0, 1, 2] {
            r.join(m(i), 2);
        }
        assert_eq!(order(&r), vec![0, 1, 2], "one round only");
        // A lead that is not in the round changes nothing.
        r.invalidate();
        r.lead_next(7);
        for i in [0, 1, 2] {
            r.join(m(i), 3);
        }
        assert_eq!(order(&r), vec![0, 1, 2]);
    }

    #[test]
    fn last_call_closes_with_min_and_node_unit_trims_the_rest() {
        let mut r = RoundRendezvous::new(2, 8, 2, 1_000, 8);
        for i in 0..3 {
            r.join(m(i), 0);
        }
        assert!(!r.try_close(999));
        assert!(r.try_close(1_000));
        assert_eq!(r.current().unwrap().members.len(), 2);
        let JoinOutcome::Waiting { reason } = r.join(m(2), 1_001) else {
            panic!()
        };
        assert!(reason.contains("node_unit 2"), "{reason}");
    }

    #[test]
    fn last_call_waits_for_members_still_launching() {
        let mut r = RoundRendezvous::new(1, 4, 1, 1_000, 4);
        r.launch_wait_ms = 30_000;
        r.launching = 1;
        for i in 0..3 {
            r.join(m(i), 0);
        }
        // A slow platform: the fourth is on its way, so last call does not close without it.
        assert!(!r.try_close(1_000));
        assert!(!r.try_close(29_999));
        r.launching = 0;
        assert!(matches!(
            r.join(m(3), 2_500),
            JoinOutcome::Ready { world_size: 4, .. }
        ));
        // One that never arrives holds the round only up to launch_wait_ms.
        let mut r = RoundRendezvous::new(1, 4, 1, 1_000, 4);
        r.launch_wait_ms = 30_000;
        r.launching = 1;
        r.join(m(0), 0);
        assert!(!r.try_close(29_999));
        assert!(r.try_close(30_000));
        assert_eq!(r.current().unwrap().members.len(), 1);
    }

    #[test]
    fn a_new_incarnation_must_rejoin_after_invalidate() {
        let mut r = RoundRendezvous::new(2, 2, 1, 0, 2);
        r.join(m(0), 0);
        r.join(m(1), 0);
        r.invalidate();
        let mut again = m(0);
        again.incarnation = 2;
        assert!(matches!(
            r.join(again.clone(), 5),
            JoinOutcome::Waiting { .. }
        ));
        let mut other = m(1);
        other.incarnation = 2;
        assert!(matches!(
            r.join(other, 5),
            JoinOutcome::Ready { round: 1, .. }
        ));
        assert!(matches!(
            r.join(again, 6),
            JoinOutcome::Ready {
                round: 1,
                rank: 0,
                ..
            }
        ));
    }

    #[test]
    fn ps_cluster_version_moves_only_on_change() {
        let mut c = PsCluster::new(2);
        c.set_ps(0, "a".into());
        assert!(!c.ps_complete());
        c.set_ps(1, "b".into());
        c.set_ps(1, "b".into());
        assert!(c.ps_complete());
        assert_eq!(c.version, 2);
        c.set_worker(0, "w".into());
        c.remove_worker(0);
        assert_eq!(c.version, 4);
    }

    proptest! {
        /// A closed round always respects min, max and node_unit, ranks are dense and unique.
        #[test]
        fn rounds_respect_bounds(min in 1u32..4, extra in 0u32..4, unit in 1u32..3,
                                 joins in proptest::collection::vec((0u32..10, 0u64..5_000), 1..40)) {
            let max = ((min + extra).div_ceil(unit)) * unit;
            let mut r = RoundRendezvous::new(min, max, unit, 1_000, max);
            for (idx, t) in joins {
                let _ = r.join(m(idx), t);
                if let Some(round) = r.current() {
                    let n = round.members.len() as u32;
                    prop_assert!(n >= min && n <= max && n.is_multiple_of(unit));
                    let mut idx: Vec<u32> = round.members.iter().map(|m| m.index).collect();
                    idx.dedup();
                    prop_assert_eq!(idx.len() as u32, n);
                }
            }
        }
    }
}
