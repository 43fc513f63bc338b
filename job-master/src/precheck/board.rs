//! The pre-run check's bookkeeping (pure): the steps every node goes through, the groups of each
//! all-reduce round, and the verdict.
//!
//! Step 0 is each node's matmul. Round 1 (step 1) pairs the nodes whose matmul passed in
//! order; round 2 pairs each node that failed round 1 or sat it out with the fastest that
//! passed, then the rest slowest with fastest (DLRover's node check re-pairs the same way). With
//! an odd count one node sits a round out. A node is **faulty** when its matmul failed or it
//! failed every round it took part in (a link that fails with every peer is this node's); a
//! **straggler** when its matmul took at least `ratio` times the median of the other nodes', or
//! when each round it took part in (and could be compared in) took at least `ratio` times the
//! median of the other groups'.

use vocab::report::{NodeHealth, PrecheckNode, PrecheckRecord, PrecheckRound};

/// The rounds of all-reduce after the matmul.
pub const ROUNDS: u32 = 2;

#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Waiting,
    Passed(f64),
    Failed(String),
}

#[derive(Clone, Debug)]
struct Node {
    name: String,
    matmul: Outcome,
    store: String,
    cuda: bool,
    /// Per round (index `round - 1`): its group (itself included) and its outcome; `None`: sat
    /// out.
    rounds: Vec<Option<(Vec<usize>, Outcome)>>,
    /// Its process ended (or never started) before the check was done, and why.
    gone: Option<String>,
    /// ... because the platform found no room for it there: nothing is known against it.
    unplaced: bool,
}

/// What a node's process does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// The step is not over: wait.
    Wait,
    Done,
    /// Sit round `step` out.
    SitOut {
        step: u32,
    },
    Round {
        step: u32,
        rank: u32,
        world: u32,
        store: String,
        backend: &'static str,
    },
}

/// One step's report from a node's process.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub node: u32,
    pub step: u32,
    pub ok: bool,
    pub millis: f64,
    pub store: String,
    pub cuda: bool,
    pub error: String,
}

#[derive(Debug)]
pub struct Board {
    nodes: Vec<Node>,
    /// The step being waited for; `ROUNDS + 1` once the check is over.
    step: u32,
    ratio: f64,
}

impl Board {
    pub fn new(names: Vec<String>, ratio: f64) -> Board {
        Board {
            nodes: names
                .into_iter()
                .map(|name| Node {
                    name,
                    matmul: Outcome::Waiting,
                    store: String::new(),
                    cuda: false,
                    rounds: Vec::new(),
                    gone: None,
                    unplaced: false,
                })
                .collect(),
            step: 0,
            ratio,
        }
    }

    pub fn step(&self) -> u32 {
        self.step
    }

    pub fn done(&self) -> bool {
        self.step > ROUNDS
    }

    fn outcome_mut(&mut self, node: usize, step: u32) -> Option<&mut Outcome> {
        let n = &mut self.nodes[node];
        if step == 0 {
            Some(&mut n.matmul)
        } else {
            n.rounds
                .get_mut(step as usize - 1)
                .and_then(|r| r.as_mut())
                .map(|(_, o)| o)
        }
    }

    /// Takes a node's report. A report of a step already over (its time ran out) is ignored;
    /// one of a step not begun, or of a node outside the check, is refused.
    pub fn report(&mut self, r: &Report) -> Result<(), String> {
        let node = r.node as usize;
        if node >= self.nodes.len() {
            return Err(format!(
                "node {} is not in this check of {} nodes",
                r.node,
                self.nodes.len()
            ));
        }
        if r.step > self.step {
            return Err(format!(
                "step {} has not begun (the check is at step {})",
                r.step, self.step
            ));
        }
        if r.step < self.step {
            return Ok(());
        }
        if r.step == 0 {
            self.nodes[node].store = r.store.clone();
            self.nodes[node].cuda = r.cuda;
        }
        let outcome = if r.ok {
            Outcome::Passed(r.millis.max(0.0))
        } else if r.error.is_empty() {
            Outcome::Failed("failed without saying why".into())
        } else {
            Outcome::Failed(r.error.clone())
        };
        if let Some(o) = self.outcome_mut(node, r.step)
            && *o == Outcome::Waiting
        {
            *o = outcome;
        }
        Ok(())
    }

    /// A node's process ended (or could not start) before the check was done: every step it
    /// still owes fails with `why`.
    pub fn lost(&mut self, node: usize, why: &str) {
        let step = self.step;
        if self.done() || node >= self.nodes.len() {
            return;
        }
        if let Some(o) = self.outcome_mut(node, step)
            && *o == Outcome::Waiting
        {
            *o = Outcome::Failed(why.to_string());
        }
        let n = &mut self.nodes[node];
        if n.matmul == Outcome::Waiting {
            n.matmul = Outcome::Failed(why.to_string());
        }
        n.gone.get_or_insert_with(|| why.to_string());
    }

    /// A node's process could not be placed (no room on the node): the node stays out of the
    /// check, unchecked rather than faulty.
    pub fn unplaced(&mut self, node: usize, why: &str) {
        if self.done() || node >= self.nodes.len() {
            return;
        }
        self.lost(node, why);
        self.nodes[node].unplaced = true;
    }

    /// Whether every node has answered the current step.
    pub fn all_reported(&self) -> bool {
        !self.done()
            && (0..self.nodes.len()).all(|i| self.outcome(i, self.step) != Some(&Outcome::Waiting))
    }

    fn outcome(&self, node: usize, step: u32) -> Option<&Outcome> {
        let n = &self.nodes[node];
        if step == 0 {
            Some(&n.matmul)
        } else {
            n.rounds
                .get(step as usize - 1)
                .and_then(|r| r.as_ref())
                .map(|(_, o)| o)
        }
    }

    /// Ends the current step (a node yet to answer fails it with `why`) and lays out the next.
    pub fn advance(&mut self, why: &str) {
        if self.done() {
            return;
        }
        for i in 0..self.nodes.len() {
            if let Some(o) = self.outcome_mut(i, self.step)
                && *o == Outcome::Waiting
            {
                *o = Outcome::Failed(why.to_string());
            }
        }
        self.step += 1;
        if self.done() {
            return;
        }
        let groups = if self.step == 1 {
            self.first_pairs()
        } else {
            self.second_pairs()
        };
        for n in &mut self.nodes {
            n.rounds.push(None);
        }
        for g in groups {
            for &i in &g {
                *self.nodes[i].rounds.last_mut().expect("pushed") =
                    Some((g.clone(), Outcome::Waiting));
            }
        }
        // A round nobody can take part in is over at once.
        if self.all_reported() {
            self.advance(why);
        }
    }

    fn matmul_passed(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                matches!(self.nodes[i].matmul, Outcome::Passed(_)) && self.nodes[i].gone.is_none()
            })
            .collect()
    }

    fn first_pairs(&self) -> Vec<Vec<usize>> {
        self.matmul_passed()
            .chunks_exact(2)
            .map(|c| c.to_vec())
            .collect()
    }

    fn second_pairs(&self) -> Vec<Vec<usize>> {
        let mut passed: Vec<(usize, f64)> = Vec::new();
        let mut unproven = Vec::new();
        for i in self.matmul_passed() {
            match self.outcome(i, 1) {
                Some(Outcome::Passed(ms)) => passed.push((i, *ms)),
                _ => unproven.push(i),
            }
        }
        passed.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let mut passed: std::collections::VecDeque<usize> =
            passed.into_iter().map(|(i, _)| i).collect();
        let mut groups = Vec::new();
        let mut left = Vec::new();
        for u in unproven {
            match passed.pop_front() {
                Some(p) => groups.push(vec![u, p]),
                None => left.push(u),
            }
        }
        while passed.len() >= 2 {
            let fast = passed.pop_front().expect("two left");
            let slow = passed.pop_back().expect("two left");
            groups.push(vec![slow, fast]);
        }
        left.extend(passed);
        groups.extend(self.pair_anew(left));
        groups
    }

    /// Pairs `nodes` in order, each with the first one left that was not its partner in
    /// round 1 (so two nodes whose first round failed are not put together again).
    fn pair_anew(&self, mut nodes: Vec<usize>) -> Vec<Vec<usize>> {
        let partner = |i: usize| match self.nodes[i].rounds.first() {
            Some(Some((group, _))) => group.clone(),
            _ => Vec::new(),
        };
        let mut groups = Vec::new();
        while nodes.len() >= 2 {
            let a = nodes.remove(0);
            let before = partner(a);
            let b = nodes.iter().position(|n| !before.contains(n)).unwrap_or(0);
            groups.push(vec![a, nodes.remove(b)]);
        }
        groups
    }

    /// What `node` does next, given the step it reported last.
    pub fn next(&self, node: usize, reported: u32) -> Next {
        if reported >= self.step {
            return Next::Wait;
        }
        if self.done() {
            return Next::Done;
        }
        let step = self.step;
        match self.nodes[node].rounds.get(step as usize - 1) {
            Some(Some((group, _))) => {
                let rank = group.iter().position(|&i| i == node).expect("in its group");
                let nccl = group.iter().all(|&i| self.nodes[i].cuda);
                Next::Round {
                    step,
                    rank: rank as u32,
                    world: group.len() as u32,
                    store: self.nodes[group[0]].store.clone(),
                    backend: if nccl { "nccl" } else { "gloo" },
                }
            }
            _ => Next::SitOut { step },
        }
    }

    /// The verdict, once done: each node's health and figures.
    pub fn verdict(&self, elapsed_ms: u64) -> PrecheckRecord {
        PrecheckRecord {
            elapsed_ms,
            nodes: (0..self.nodes.len()).map(|i| self.judge(i)).collect(),
        }
    }

    fn judge(&self, i: usize) -> PrecheckNode {
        let n = &self.nodes[i];
        let rounds: Vec<PrecheckRound> = n
            .rounds
            .iter()
            .enumerate()
            .filter_map(|(r, g)| g.as_ref().map(|g| (r as u32 + 1, g)))
            .map(|(round, (group, o))| PrecheckRound {
                round,
                peers: group
                    .iter()
                    .filter(|&&p| p != i)
                    .map(|&p| self.nodes[p].name.clone())
                    .collect(),
                allreduce_ms: match o {
                    Outcome::Passed(ms) => Some(*ms),
                    _ => None,
                },
                error: match o {
                    Outcome::Failed(e) => e.clone(),
                    _ => String::new(),
                },
            })
            .collect();
        let mut out = PrecheckNode {
            node: n.name.clone(),
            health: NodeHealth::Healthy,
            matmul_ms: match n.matmul {
                Outcome::Passed(ms) => Some(ms),
                _ => None,
            },
            rounds,
            why: String::new(),
        };
        if n.unplaced {
            out.health = NodeHealth::Unchecked;
            out.why = n.gone.clone().unwrap_or_default();
            return out;
        }
        if let Outcome::Failed(e) = &n.matmul {
            out.health = NodeHealth::Faulty;
            out.why = format!("its matmul failed: {e}");
            return out;
        }
        if let Some(why) = &n.gone {
            out.health = NodeHealth::Faulty;
            out.why = format!("its check ended before the check was done: {why}");
            return out;
        }
        if !out.rounds.is_empty() && out.rounds.iter().all(|r| r.allreduce_ms.is_none()) {
            out.health = NodeHealth::Faulty;
            let fails: Vec<String> = out
                .rounds
                .iter()
                .map(|r| format!("with {}: {}", r.peers.join(", "), r.error))
                .collect();
            out.why = format!("every all-reduce failed ({})", fails.join("; "));
            return out;
        }
        if let Some(why) = self.slow(i) {
            out.health = NodeHealth::Straggler;
            out.why = why;
        }
        out
    }

    /// Why node `i` is a straggler, if it is one.
    fn slow(&self, i: usize) -> Option<String> {
        let mine = match self.nodes[i].matmul {
            Outcome::Passed(ms) => ms,
            _ => return None,
        };
        let others: Vec<f64> = (0..self.nodes.len())
            .filter(|&j| j != i)
            .filter_map(|j| match self.nodes[j].matmul {
                Outcome::Passed(ms) => Some(ms),
                _ => None,
            })
            .collect();
        if let Some(m) = median(others)
            && mine >= self.ratio * m
        {
            return Some(format!(
                "its matmul took {mine:.1} ms, {:.2}x the other nodes' median {m:.1} ms",
                mine / m.max(1e-9)
            ));
        }
        // Each round it was in, against the groups it was not in.
        let mut slow = Vec::new();
        for (r, g) in self.nodes[i].rounds.iter().enumerate() {
            let Some((group, Outcome::Passed(ms))) = g else {
                continue;
            };
            let others: Vec<f64> = (0..self.nodes.len())
                .filter(|j| !group.contains(j))
                .filter_map(|j| match self.nodes[j].rounds.get(r) {
                    Some(Some((_, Outcome::Passed(ms)))) => Some(*ms),
                    _ => None,
                })
                .collect();
            if let Some(m) = median(others) {
                if *ms < self.ratio * m {
                    return None;
                }
                slow.push(format!("round {}: {ms:.1} ms against {m:.1} ms", r + 1));
            }
        }
        (!slow.is_empty()).then(|| {
            format!(
                "its all-reduce was slow in every round it was in ({})",
                slow.join(", ")
            )
        })
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board(n: usize) -> Board {
        Board::new((0..n).map(|i| format!("10.0.0.{i}")).collect(), 2.0)
    }

    fn matmul(b: &mut Board, times: &[Option<f64>]) {
        for (i, t) in times.iter().enumerate() {
            b.report(&Report {
                node: i as u32,
                step: 0,
                ok: t.is_some(),
                millis: t.unwrap_or(0.0),
                store: format!("10.0.0.{i}:900{i}"),
                error: if t.is_none() {
                    "CUDA error".into()
                } else {
                    String::new()
                },
                ..Default::default()
            })
            .unwrap();
        }
        assert!(b.all_reported());
        b.advance("no answer");
    }

    /// Plays a round: each group passes with the slowest member's time unless a member is
    /// broken.
    fn round(b: &mut Board, speed: &[f64], broken: &[usize]) {
        let step = b.step();
        for i in 0..speed.len() {
            match b.next(i, step - 1) {
                Next::Round { .. } => {
                    let group = b.nodes[i].rounds[step as usize - 1].clone().unwrap().0;
                    let bad = group.iter().any(|g| broken.contains(g));
                    let ms = group.iter().map(|&g| speed[g]).fold(0.0, f64::max);
                    b.report(&Report {
                        node: i as u32,
                        step,
                        ok: !bad,
                        millis: ms,
                        error: if bad {
                            "connection reset".into()
                        } else {
                            String::new()
                        },
                        ..Default::default()
                    })
                    .unwrap();
                }
                Next::SitOut { .. } => {}
                other => panic!("node {i} at step {step}: {other:?}"),
            }
        }
        assert!(b.all_reported() || broken.iter().any(|&i| speed[i] < 0.0));
        b.advance("no answer");
    }

    fn health(r: &PrecheckRecord) -> Vec<NodeHealth> {
        r.nodes.iter().map(|n| n.health).collect()
    }

    use NodeHealth::{Faulty as F, Healthy as H, Straggler as S};

    #[test]
    fn healthy_nodes_pass_two_rounds_paired_differently() {
        let mut b = board(4);
        matmul(&mut b, &[Some(10.0), Some(11.0), Some(10.5), Some(9.0)]);
        assert_eq!(b.first_pairs(), vec![vec![0, 1], vec![2, 3]]);
        let speed = [5.0, 5.0, 6.0, 6.0];
        round(&mut b, &speed, &[]);
        // Slowest of round 1 (2, 3) with the fastest (0, 1).
        assert_eq!(b.second_pairs(), vec![vec![3, 0], vec![2, 1]]);
        round(&mut b, &speed, &[]);
        assert!(b.done());
        assert_eq!(b.next(0, 2), Next::Done);
        let v = b.verdict(1234);
        assert_eq!(health(&v), vec![H, H, H, H]);
        assert_eq!(v.nodes[0].rounds.len(), 2);
        assert_eq!(v.nodes[0].rounds[1].peers, vec!["10.0.0.3".to_string()]);
    }

    #[test]
    fn a_node_whose_link_fails_with_every_peer_is_faulty_and_its_peers_are_not() {
        let mut b = board(4);
        matmul(&mut b, &[Some(10.0); 4]);
        let speed = [5.0; 4];
        round(&mut b, &speed, &[1]);
        // The failed pair's members go first, each with a node that passed.
        assert_eq!(b.second_pairs(), vec![vec![0, 2], vec![1, 3]]);
        round(&mut b, &speed, &[1]);
        let v = b.verdict(0);
        assert_eq!(health(&v), vec![H, F, H, H]);
        assert!(
            v.nodes[1].why.contains("every all-reduce failed"),
            "{:?}",
            v.nodes[1]
        );
        assert!(
            v.nodes[1].why.contains("connection reset"),
            "{:?}",
            v.nodes[1]
        );
    }

    #[test]
    fn with_three_nodes_the_one_that_sat_out_is_checked_in_the_second_round() {
        let mut b = board(3);
        matmul(&mut b, &[Some(10.0); 3]);
        assert_eq!(b.next(2, 0), Next::SitOut { step: 1 });
        let speed = [5.0; 3];
        round(&mut b, &speed, &[2]);
        assert_eq!(b.second_pairs(), vec![vec![2, 0]]);
        round(&mut b, &speed, &[2]);
        assert_eq!(health(&b.verdict(0)), vec![H, H, F]);
    }

    #[test]
    fn with_no_round_passed_the_second_pairs_nodes_that_were_not_paired_before() {
        // Node 1 is broken; round 1 pairs it with 0 and 2 sits out, both fail.
        let mut b = board(3);
        matmul(&mut b, &[Some(10.0); 3]);
        round(&mut b, &[5.0; 3], &[1]);
        assert_eq!(b.second_pairs(), vec![vec![0, 2]]);
        round(&mut b, &[5.0; 3], &[1]);
        assert_eq!(health(&b.verdict(0)), vec![H, F, H]);
    }

    #[test]
    fn a_failed_matmul_or_a_node_that_never_answers_is_faulty() {
        let mut b = board(3);
        b.report(&Report {
            node: 0,
            step: 0,
            ok: true,
            millis: 10.0,
            ..Default::default()
        })
        .unwrap();
        b.report(&Report {
            node: 1,
            step: 0,
            ok: false,
            error: "CUDA error: an illegal memory access".into(),
            ..Default::default()
        })
        .unwrap();
        assert!(!b.all_reported());
        b.lost(2, "its process exited with status 1");
        b.advance("no answer in 120 s");
        // Only one node left to pair: both rounds are over at once.
        assert!(b.done());
        let v = b.verdict(0);
        assert_eq!(health(&v), vec![H, F, F]);
        assert!(v.nodes[1].why.contains("illegal memory access"));
        assert!(v.nodes[2].why.contains("exited with status 1"));
    }

    #[test]
    fn a_node_with_no_room_for_its_check_is_unchecked_and_left_out_of_the_rounds() {
        let mut b = board(3);
        b.unplaced(1, "no room there for it: 1 GPU(s)");
        for i in [0, 2] {
            b.report(&Report {
                node: i,
                step: 0,
                ok: true,
                millis: 10.0,
                ..Default::default()
            })
            .unwrap();
        }
        assert!(b.all_reported());
        b.advance("no answer");
        assert_eq!(
            b.next(0, 0),
            Next::Round {
                step: 1,
                rank: 0,
                world: 2,
                store: String::new(),
                backend: "gloo",
            }
        );
        round(&mut b, &[5.0; 3], &[]);
        round(&mut b, &[5.0; 3], &[]);
        let v = b.verdict(0);
        assert_eq!(health(&v), vec![H, NodeHealth::Unchecked, H]);
        assert!(v.nodes[1].why.contains("no room"), "{:?}", v.nodes[1]);
        assert_eq!(v.unhealthy().count(), 0);
    }

    #[test]
    fn a_slow_node_is_a_straggler_by_its_matmul_or_by_every_round_it_is_in() {
        let mut b = board(4);
        matmul(&mut b, &[Some(10.0), Some(10.0), Some(25.0), Some(11.0)]);
        let speed = [5.0, 5.0, 5.0, 5.0];
        round(&mut b, &speed, &[]);
        round(&mut b, &speed, &[]);
        let v = b.verdict(0);
        assert_eq!(health(&v), vec![H, H, S, H]);
        assert!(v.nodes[2].why.contains("2.50x"), "{}", v.nodes[2].why);

        // A slow link: the pair it is in is slow in both rounds, its first peer only once.
        let mut b = board(4);
        matmul(&mut b, &[Some(10.0); 4]);
        let speed = [5.0, 30.0, 5.0, 5.0];
        round(&mut b, &speed, &[]);
        round(&mut b, &speed, &[]);
        let v = b.verdict(0);
        assert_eq!(health(&v), vec![H, S, H, H]);
        assert!(v.nodes[1].why.contains("round 2"), "{}", v.nodes[1].why);
    }

    #[test]
    fn stale_and_foreign_reports_change_nothing_and_a_report_ahead_is_refused() {
        let mut b = board(2);
        assert!(
            b.report(&Report {
                node: 5,
                ..Default::default()
            })
            .is_err()
        );
        assert!(
            b.report(&Report {
                node: 0,
                step: 1,
                ..Default::default()
            })
            .is_err()
        );
        matmul(&mut b, &[Some(10.0), Some(10.0)]);
        // A late step-0 answer is ignored.
        b.report(&Report {
            node: 0,
            step: 0,
            ok: false,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(b.nodes[0].matmul, Outcome::Passed(10.0));
        assert_eq!(
            b.next(0, 0),
            Next::Round {
                step: 1,
                rank: 0,
                world: 2,
                store: "10.0.0.0:9000".into(),
                backend: "gloo",
            }
        );
        assert_eq!(b.next(0, 1), Next::Wait);
    }
}
