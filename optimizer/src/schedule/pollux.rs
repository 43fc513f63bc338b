//! A Pollux-style goodput policy (OSDI 2021): each job's speedup is its goodput relative to its
//! goodput at a fair share of the cluster, a job moved to a new size has its speedup discounted
//! by the restart it costs (`max(age − restarts · delay, 0) / (age + delay)`), and the cluster
//! maximises the power mean (p = −1) of the speedups, which favours giving every job something
//! before giving any job more. Pollux searches with a genetic algorithm; here the same objective
//! is maximised greedily: GPUs go to the job and size with the best objective gain per GPU,
//! looking past plateaus (a jump of several GPUs counts when one GPU alone gains nothing).
//! Jobs grow at most `max_growth` × the most GPUs they have held (Pollux explores that way
//! because it learns a job's scaling as the job runs). Jobs adapt their batch size to the
//! allocation.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use super::{Assignment, BatchSizing, FreeGpus, JobView, Packing, Scheduler, Snapshot, carry_out};
use crate::error::PolicyError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pollux {
    /// Power-mean exponent (Pollux: −1; more negative is fairer).
    #[serde(default = "default_p")]
    pub p: f64,
    /// Seconds a restart costs, as the policy assumes (Pollux: 30).
    #[serde(default = "default_delay")]
    pub restart_delay_s: f64,
    /// A job may grow to at most this × the most GPUs it has held (at least 1); `0` lifts it.
    #[serde(default = "default_growth")]
    pub max_growth: f64,
}

fn default_p() -> f64 {
    -1.0
}
fn default_delay() -> f64 {
    30.0
}
fn default_growth() -> f64 {
    2.0
}

impl Default for Pollux {
    fn default() -> Self {
        Pollux {
            p: default_p(),
            restart_delay_s: default_delay(),
            max_growth: default_growth(),
        }
    }
}

struct Candidate<'a> {
    job: &'a JobView,
    /// Worker type chosen (fixed once the job has GPUs in this round's plan).
    t: Option<usize>,
    r: u32,
    limit: u32,
    /// The worker type the job runs on now.
    current_type: Option<usize>,
    /// Goodput at a fair share, per worker type.
    base: Vec<f64>,
    restart_factor: f64,
}

impl Pollux {
    fn check_settings(&self) -> Result<(), PolicyError> {
        let bad = |m: String| Err(PolicyError::InvalidConfig(m));
        if !(self.p.is_finite() && self.p < 0.0) {
            return bad(format!("p is {}, expected a negative number", self.p));
        }
        if !(self.restart_delay_s.is_finite() && self.restart_delay_s >= 0.0) {
            return bad(format!("restart_delay_s is {}", self.restart_delay_s));
        }
        if !(self.max_growth.is_finite() && (self.max_growth == 0.0 || self.max_growth >= 1.0)) {
            return bad(format!(
                "max_growth is {}, expected 0 or ≥ 1",
                self.max_growth
            ));
        }
        Ok(())
    }

    /// The job's term of the power mean at `r` GPUs on `t` (smaller is better).
    fn term(&self, c: &Candidate, t: usize, r: u32, scale: f64) -> f64 {
        let mut s = if r == 0 || c.base[t] <= 0.0 {
            0.0
        } else {
            c.job.goodput_at(t, r) / c.base[t] * scale
        };
        let unchanged = r == c.job.current_replicas() && c.current_type == Some(t);
        if r > 0 && !unchanged {
            s *= c.restart_factor;
        }
        (s + 1e-3).powf(self.p)
    }
}

/// A candidate's best next size: `gain` per GPU of growing the candidate at `pos` (in
/// attained-service order) to `r` GPUs on type `t`.
struct Move {
    gain: f64,
    pos: usize,
    t: usize,
    r: u32,
    version: u32,
}

impl PartialEq for Move {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Move {}
impl PartialOrd for Move {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Move {
    fn cmp(&self, other: &Self) -> Ordering {
        self.gain
            .total_cmp(&other.gain)
            .then(other.pos.cmp(&self.pos))
    }
}

impl Pollux {
    /// The best growth of `c` that fits in `budget`, if any gains.
    fn best_move(
        &self,
        c: &Candidate,
        pos: usize,
        version: u32,
        types: usize,
        budget: &FreeGpus,
        scale: f64,
    ) -> Option<Move> {
        let type_choices: Vec<usize> = match (c.r, c.t) {
            (r, Some(t)) if r > 0 => vec![t],
            (_, Some(t)) => std::iter::once(t)
                .chain((0..types).filter(|&u| u != t))
                .collect(),
            _ => (0..types).collect(),
        };
        let mut best: Option<Move> = None;
        for t in type_choices {
            let now = self.term(c, t, c.r, scale);
            let room = budget.on_type(t);
            for r in c.r + 1..=c.limit.min(c.r + room) {
                let gain = (now - self.term(c, t, r, scale)) / (r - c.r) as f64;
                if gain > 1e-12 && best.as_ref().is_none_or(|b| gain > b.gain * (1.0 + 1e-9)) {
                    best = Some(Move {
                        gain,
                        pos,
                        t,
                        r,
                        version,
                    });
                }
            }
        }
        best
    }
}

impl Scheduler for Pollux {
    fn name(&self) -> &'static str {
        "pollux"
    }

    fn batch_sizing(&self) -> BatchSizing {
        BatchSizing::Adaptive
    }

    fn elastic(&self) -> bool {
        true
    }

    fn validate(&self) -> Result<(), PolicyError> {
        self.check_settings()
    }

    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError> {
        self.check_settings()?;
        if snapshot.jobs.is_empty() {
            return Ok(Assignment::new());
        }
        let types = snapshot.worker_types.len();
        let total: u32 = snapshot.nodes.iter().map(|n| n.gpus).sum();
        let fair = total.div_ceil(snapshot.jobs.len() as u32).max(1);
        // Speedups are scaled so that a node's worth of GPUs at fair-share efficiency is 1.
        let scale = snapshot.nodes.len() as f64 / total.max(1) as f64;
        let mut cands: Vec<Candidate> = snapshot
            .jobs
            .iter()
            .map(|job| {
                let age = (snapshot.now_s - job.submitted_s).max(0.0);
                let delay = self.restart_delay_s;
                let restart_factor = if age + delay > 0.0 {
                    (age - job.restarts as f64 * delay).max(0.0) / (age + delay)
                } else {
                    1.0
                };
                // A job may always grow to the fewest GPUs it runs on (a rigid job's request).
                let least = job.min_replicas().unwrap_or(1);
                let limit = job.growth_limit(self.max_growth, least);
                let base = (0..types)
                    .map(|t| {
                        let f = fair.clamp(least, job.max_replicas.max(least));
                        let g = job.goodput_at(t, f);
                        if g > 0.0 { g } else { job.goodput_at(t, least) }
                    })
                    .collect();
                Candidate {
                    job,
                    t: job.current_type(&snapshot.nodes),
                    current_type: job.current_type(&snapshot.nodes),
                    r: 0,
                    limit,
                    base,
                    restart_factor,
                }
            })
            .collect();
        // Pollux orders jobs by attained service, then age: ties in gain go to the earlier.
        let mut order: Vec<usize> = (0..cands.len()).collect();
        order.sort_by(|&a, &b| {
            let (ja, jb) = (cands[a].job, cands[b].job);
            ja.attained_gpu_s
                .total_cmp(&jb.attained_gpu_s)
                .then(ja.submitted_s.total_cmp(&jb.submitted_s))
                .then(ja.id.cmp(&jb.id))
        });
        let mut budget = FreeGpus::new(&snapshot.nodes);
        // Each candidate's best move, in a max-heap by gain per GPU (ties to the earlier in
        // `order`). GPUs only ever run out, so a stored move stays the candidate's best for as
        // long as it still fits: one that no longer does is recomputed when it surfaces, and a
        // candidate's moves are recomputed after it grows (`version` drops the old one).
        let mut version = vec![0u32; cands.len()];
        let mut heap = BinaryHeap::new();
        for (pos, &i) in order.iter().enumerate() {
            if let Some(m) = self.best_move(&cands[i], pos, 0, types, &budget, scale) {
                heap.push(m);
            }
        }
        while let Some(m) = heap.pop() {
            let i = order[m.pos];
            if m.version != version[i] {
                continue;
            }
            let c = &mut cands[i];
            if budget.on_type(m.t) < m.r - c.r {
                if let Some(m) = self.best_move(c, m.pos, m.version, types, &budget, scale) {
                    heap.push(m);
                }
                continue;
            }
            budget.take(m.t, m.r - c.r);
            c.t = Some(m.t);
            c.r = m.r;
            version[i] += 1;
            if let Some(m) = self.best_move(c, m.pos, version[i], types, &budget, scale) {
                heap.push(m);
            }
        }
        let mut placing: Vec<&Candidate> = cands.iter().filter(|c| c.r > 0).collect();
        placing.sort_by_key(|c| (std::cmp::Reverse(c.r), c.job.id));
        let sizes = placing
            .into_iter()
            .map(|c| (c.job.id, c.t.expect("a job with GPUs has a type"), c.r))
            .collect();
        carry_out(snapshot, sizes, Packing::Tight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::tests::snapshot;
    use crate::units::JobId;

    fn sizes(a: &Assignment) -> Vec<u32> {
        a.values().map(|s| s.iter().map(|x| x.1).sum()).collect()
    }

    #[test]
    fn every_job_gets_a_gpu_before_any_grows_and_the_cluster_fills() {
        let mut s = snapshot(2, &[(1, 8, 0.0), (1, 8, 0.0), (1, 8, 0.0)]);
        for j in &mut s.jobs {
            j.peak_replicas = 4;
        }
        let a = Pollux::default().schedule(&s).unwrap();
        crate::schedule::check(&s, &a).unwrap();
        let n = sizes(&a);
        assert_eq!(n.len(), 3, "{a:?}");
        assert_eq!(n.iter().sum::<u32>(), 8, "{a:?}");
    }

    #[test]
    fn growth_is_limited_by_what_the_job_has_held() {
        let s = snapshot(4, &[(1, 16, 0.0)]);
        let a = Pollux::default().schedule(&s).unwrap();
        assert_eq!(sizes(&a), vec![1], "a new job starts on one GPU");
        let mut s = s;
        s.jobs[0].peak_replicas = 3;
        assert_eq!(sizes(&Pollux::default().schedule(&s).unwrap()), vec![6]);
        let free = Pollux {
            max_growth: 0.0,
            ..Pollux::default()
        };
        assert_eq!(sizes(&free.schedule(&s).unwrap()), vec![16]);
    }

    #[test]
    fn a_young_job_is_not_restarted_for_a_small_gain() {
        // One job on 2 GPUs, 10 s old, one restart already: growing to 4 would cost its whole
        // speedup in the restart discount, so it keeps its GPUs.
        let mut s = snapshot(1, &[(2, 4, 0.0)]);
        s.jobs[0].current = vec![(0, 2)];
        s.jobs[0].peak_replicas = 2;
        s.jobs[0].restarts = 1;
        s.now_s = 10.0;
        let a = Pollux::default().schedule(&s).unwrap();
        assert_eq!(a[&JobId(0)], vec![(0, 2)]);
        let bad = Pollux {
            p: 1.0,
            ..Pollux::default()
        };
        assert!(matches!(
            bad.schedule(&s),
            Err(PolicyError::InvalidConfig(_))
        ));
    }
}
