//! Brain's own scheduler: elastic sizing by linear programming.
//!
//! Every round each job has candidate configurations `c = (worker type t, r GPUs)`, from the
//! fewest GPUs it runs on up to a growth limit, on a geometric ladder of sizes (each ≥ 1.25 ×
//! the last, plus its current and requested size). With `T[j][c]` the seconds job `j` still
//! needs in configuration `c` (work left / goodput), `d[j][c]` the restart it costs (0 for
//! the configuration it runs in now) and `s[j][c]` its speedup over the fewest GPUs it runs on
//! (goodput in `c` / goodput there), the LP is
//!
//! ```text
//! maximise   Σ_j Σ_c x[j][c] · v[j][c]
//!            v[j][c] = 1 / (T[j][c] + d[j][c])  +  (s[j][c] / H + w · ln(1 + s[j][c])) · T[j][c] / (T[j][c] + d[j][c])
//! subject to Σ_c x[j][c] ≤ 1                      for each job
//!            Σ_j Σ_{c on t} r_c · x[j][c] ≤ G_t   for each worker type t
//!            x ≥ 0
//! ```
//!
//! The first term is the rate at which jobs complete: a job close to done is worth more per
//! GPU than one far from it (shortest-remaining-time first, which minimises mean JCT), a GPU
//! goes where it shortens a completion the most, and a move pays for its restart. Alone it
//! sizes by nearness to completion only, so long jobs are finished one after another on
//! large, inefficient allocations and the last of them runs alone at the end, early in its
//! training, where large batches help least. The second term values the work a configuration
//! does, spread over the horizon `H` (`efficiency_horizon_s`): it matters little for a job with
//! far less than `H` left, and sizes jobs with more than that by their speedup per GPU (as
//! Pollux does), so long jobs advance side by side where GPUs do the most work. With the fill
//! step below, on Pollux's workloads it shortened the makespan by 5–8 % at every load and the
//! p99 JCT by 4 % and 1 % at 1.0× and 1.5× load, and raised the p99 at 0.5× by 2 % (the
//! docs/whatif.md has the figures, and what still loses to Pollux-style).
//!
//! The third term, off by default (`w` = `fairness_weight` = 0), is proportional fairness:
//! `ln(1 + s)` grows ever more slowly with the speedup, so with `w` > 0 a GPU is worth more to
//! a job that has few than to one that has many, and every job advances. It trades mean JCT
//! for the tail: on Pollux's workloads at 1.0× load `w` = 0.002 with a 120 s restart price
//! (examples/policies/elastic_lp_balanced.toml) took the makespan from 82,637 to 76,248 s and
//! raised the mean JCT from 2,352 to 2,689 s (docs/whatif.md has every trace).
//!
//! The LP has the allocation policies' block-angular shape (each job's shares are its own block,
//! summing to at most 1; the capacity rows couple them), so it is solved by the block
//! interior-point method of [`crate::lp::block_ipm`], with clarabel as the fallback where that
//! does not converge: at 10,000 live jobs the round went from 0.9–1.0 s to 0.42 s.
//!
//! The LP is a relaxation; the answer is made whole by giving each job its configuration of
//! largest share, the most valuable per GPU first, and where GPUs of that type ran out, its
//! largest candidate that still fits. GPUs the rounding leaves free go, one job at a time, to
//! the job and size (any size up to its growth limit) that gains the most value per GPU, a
//! restart priced in. Jobs whose configuration does not change keep their GPUs.
//!
//! A rigid job (one size only, as Philly's are) whose run alone is at least the makespan bound
//! of the work at hand (all of it at its most efficient size on every GPU, or the longest job
//! at its fastest) is on the critical path: it is placed first, so a stream of short jobs
//! never preempts it (shortest-remaining-time first would keep it waiting, and every hour it
//! waits is an hour added to the makespan).
//!
//! Like the Pollux-style policy it adapts batch sizes to the allocation, and a job grows at
//! most `max_growth` × the most GPUs it has held, as a live brain learns a job's scaling while
//! it runs.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use good_lp::{Expression, ProblemVariables, Solution, SolverModel, Variable, clarabel, variable};
use serde::{Deserialize, Serialize};

use super::{Assignment, BatchSizing, FreeGpus, JobView, Packing, Scheduler, Snapshot, carry_out};
use crate::error::PolicyError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElasticLp {
    /// Seconds a change of allocation is priced at. Above the 30 s a restart takes, it also
    /// stands for what a move costs beyond the job itself (GPUs idle while it restarts, the
    /// next move it may trigger); 240 s was chosen on Pollux's workloads and holds on Sia's.
    #[serde(default = "default_delay")]
    pub restart_delay_s: f64,
    /// A job may grow to at most this × the most GPUs it has held (at least the fewest it
    /// runs on); `0` lifts it.
    #[serde(default = "default_growth")]
    pub max_growth: f64,
    /// Seconds over which a configuration's speedup is valued beside its completion rate
    /// (`H` in the module's LP): jobs with more work than this left are sized by speedup per
    /// GPU. `0` turns it off (pure shortest-remaining-time first). 200,000 s was chosen on
    /// Pollux's workloads (50,000 shortened their makespan more but raised p99 JCT at 0.5×
    /// load more).
    #[serde(default = "default_horizon")]
    pub efficiency_horizon_s: f64,
    /// Weight of the proportional-fairness term `w · ln(1 + s)` in each configuration's value
    /// (`w` in the module's LP): above 0, GPUs go more evenly, trading mean JCT for the
    /// tail (p99 JCT, makespan). `0`, the default, leaves it out.
    #[serde(default)]
    pub fairness_weight: f64,
}

fn default_delay() -> f64 {
    240.0
}
fn default_growth() -> f64 {
    2.0
}
fn default_horizon() -> f64 {
    200_000.0
}

impl Default for ElasticLp {
    fn default() -> Self {
        ElasticLp {
            restart_delay_s: default_delay(),
            max_growth: default_growth(),
            efficiency_horizon_s: default_horizon(),
            fairness_weight: 0.0,
        }
    }
}

/// One candidate configuration of one job.
struct Config {
    t: usize,
    r: u32,
    /// Its value per unit of share: the module's `v[j][c]`.
    value: f64,
    /// Seconds left in it, restart aside.
    secs: f64,
}

/// What a job's values are computed from.
struct Pricing {
    /// The fewest GPUs it runs on, and the most it may have this round.
    least: u32,
    limit: u32,
    /// Its goodput on the fewest GPUs, on the type where that is highest.
    g_least: f64,
}

/// A job's best growth into free GPUs: value gained per GPU, the job, its type and new size.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Growth {
    gain: f64,
    j: usize,
    t: usize,
    r: u32,
}

impl Eq for Growth {}
impl Ord for Growth {
    fn cmp(&self, other: &Self) -> Ordering {
        self.gain
            .total_cmp(&other.gain)
            .then(other.j.cmp(&self.j))
            .then(other.r.cmp(&self.r))
    }
}
impl PartialOrd for Growth {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl ElasticLp {
    fn check_settings(&self) -> Result<(), PolicyError> {
        let bad = |m: String| Err(PolicyError::InvalidConfig(m));
        if !(self.restart_delay_s.is_finite() && self.restart_delay_s >= 0.0) {
            return bad(format!("restart_delay_s is {}", self.restart_delay_s));
        }
        if !(self.max_growth.is_finite() && (self.max_growth == 0.0 || self.max_growth >= 1.0)) {
            return bad(format!(
                "max_growth is {}, expected 0 or ≥ 1",
                self.max_growth
            ));
        }
        if !(self.efficiency_horizon_s.is_finite() && self.efficiency_horizon_s >= 0.0) {
            return bad(format!(
                "efficiency_horizon_s is {}, expected 0 or more",
                self.efficiency_horizon_s
            ));
        }
        if !(self.fairness_weight.is_finite() && self.fairness_weight >= 0.0) {
            return bad(format!(
                "fairness_weight is {}, expected 0 or more",
                self.fairness_weight
            ));
        }
        Ok(())
    }

    fn pricing(&self, job: &JobView, snapshot: &Snapshot) -> Option<Pricing> {
        let least = job.min_replicas()?;
        let g_least = (0..snapshot.worker_types.len())
            .map(|t| job.goodput_at(t, least))
            .fold(0.0, f64::max);
        Some(Pricing {
            least,
            limit: job.growth_limit(self.max_growth, least),
            g_least,
        })
    }

    /// The value `v` of `r` GPUs of type `t` for the job and the seconds it would still need
    /// there; `None` where it does not run.
    fn value(
        &self,
        job: &JobView,
        snapshot: &Snapshot,
        p: &Pricing,
        t: usize,
        r: u32,
    ) -> Option<(f64, f64)> {
        let g = job.goodput_at(t, r);
        if g <= 0.0 {
            return None;
        }
        let secs = job.remaining.max(1e-9) / g;
        let unchanged = r == job.current_replicas() && job.current_type(&snapshot.nodes) == Some(t);
        let delay = if unchanged { 0.0 } else { self.restart_delay_s };
        let mut value = 1.0 / (secs + delay);
        if p.g_least > 0.0 {
            let s = g / p.g_least;
            let mut work = self.fairness_weight * s.ln_1p();
            if self.efficiency_horizon_s > 0.0 {
                work += s / self.efficiency_horizon_s;
            }
            value += work * secs / (secs + delay);
        }
        Some((value, secs))
    }

    /// The job's candidate configurations, on every type it runs on (none without pricing:
    /// a job that runs nowhere).
    fn configs(&self, job: &JobView, snapshot: &Snapshot, p: Option<&Pricing>) -> Vec<Config> {
        let Some(p) = p else {
            return Vec::new();
        };
        let mut sizes = Vec::new();
        let mut r = p.least;
        while r <= p.limit {
            sizes.push(r);
            r = (r + 1).max((r as f64 * 1.25).ceil() as u32);
        }
        sizes.push(p.limit);
        for extra in [job.current_replicas(), job.requested_replicas] {
            if (p.least..=p.limit).contains(&extra) {
                sizes.push(extra);
            }
        }
        sizes.sort_unstable();
        sizes.dedup();
        let mut out = Vec::new();
        for t in 0..snapshot.worker_types.len() {
            for &r in &sizes {
                if let Some((value, secs)) = self.value(job, snapshot, p, t, r) {
                    out.push(Config { t, r, value, secs });
                }
            }
        }
        out
    }

    /// The job's best growth from `placed` (its type and size so far this round, if any) into
    /// the free GPUs of each type.
    fn best_growth(
        &self,
        snapshot: &Snapshot,
        j: usize,
        p: &Pricing,
        placed: Option<(usize, u32)>,
        free: &[u32],
    ) -> Option<Growth> {
        let job = &snapshot.jobs[j];
        let mut best: Option<Growth> = None;
        for (t, &f) in free.iter().enumerate() {
            let r0 = match placed {
                Some((pt, r)) if pt == t => r,
                Some(_) => continue,
                None => 0,
            };
            let hi = p.limit.min(r0 + f);
            if hi <= r0 {
                continue;
            }
            let base = match r0 {
                0 => 0.0,
                _ => self.value(job, snapshot, p, t, r0).map_or(0.0, |v| v.0),
            };
            // Every size for the first 64 GPUs more, then a ladder 1.1 × apart, then `hi`.
            let mut r = r0 + 1;
            while r <= hi {
                if let Some((v, _)) = self.value(job, snapshot, p, t, r) {
                    let g = Growth {
                        gain: (v - base) / (r - r0) as f64,
                        j,
                        t,
                        r,
                    };
                    if g.gain > 0.0 && best.is_none_or(|b| g > b) {
                        best = Some(g);
                    }
                }
                r = if r < r0 + 64 {
                    r + 1
                } else if r < hi {
                    ((r as f64 * 1.1).ceil() as u32).min(hi)
                } else {
                    hi + 1
                };
            }
        }
        best
    }

    /// Hands the GPUs the rounding left free, one growth at a time, to the job and size that
    /// gain the most value per GPU (a job not placed may start; restarts are priced in).
    fn fill(
        &self,
        snapshot: &Snapshot,
        pricing: &[Option<Pricing>],
        budget: &mut FreeGpus,
        sizes: &mut Vec<(usize, usize, u32)>,
    ) {
        let types = snapshot.worker_types.len();
        let mut free: Vec<u32> = (0..types).map(|t| budget.on_type(t)).collect();
        if free.iter().all(|&f| f == 0) {
            return;
        }
        let mut placed: Vec<Option<(usize, u32)>> = vec![None; snapshot.jobs.len()];
        for &(j, t, r) in sizes.iter() {
            placed[j] = Some((t, r));
        }
        let best = |j: usize, placed: &[Option<(usize, u32)>], free: &[u32]| {
            pricing[j]
                .as_ref()
                .and_then(|p| self.best_growth(snapshot, j, p, placed[j], free))
        };
        let mut heap: BinaryHeap<Growth> = (0..snapshot.jobs.len())
            .filter_map(|j| best(j, &placed, &free))
            .collect();
        // Free GPUs only shrink and a job's own size only grows, so a growth popped is either
        // still its best (taken) or is recomputed and pushed back lower.
        while let Some(g) = heap.pop() {
            if free.iter().all(|&f| f == 0) {
                break;
            }
            match best(g.j, &placed, &free) {
                Some(now) if now == g => {
                    let r0 = placed[g.j].map_or(0, |p| p.1);
                    free[g.t] -= g.r - r0;
                    budget.take(g.t, g.r - r0);
                    placed[g.j] = Some((g.t, g.r));
                    heap.extend(best(g.j, &placed, &free));
                }
                Some(now) => heap.push(now),
                None => {}
            }
        }
        sizes.clear();
        sizes.extend(
            placed
                .iter()
                .enumerate()
                .filter_map(|(j, p)| p.map(|(t, r)| (j, t, r))),
        );
    }

    /// The LP by the block interior-point method of [`crate::lp::block_ipm`] (its shape: each
    /// job's shares summing to at most 1, one capacity row per worker type); `None` when it
    /// does not converge. Configurations on a type with no GPUs are pinned at 0.
    fn solve_structured(
        configs: &[Vec<Config>],
        capacity: &[u32],
        top: f64,
    ) -> Option<Vec<Vec<f64>>> {
        use crate::lp::block_ipm::{Block, BlockLp, Var};
        let lp = BlockLp {
            blocks: configs
                .iter()
                .map(|cs| Block {
                    vars: cs
                        .iter()
                        .filter(|c| capacity[c.t] > 0)
                        .map(|c| Var {
                            gain: c.value / top,
                            fair: 0.0,
                            uses: vec![(c.t, c.r as f64)],
                        })
                        .collect(),
                    hi: 1.0,
                    lo: None,
                })
                .collect(),
            coupling_rhs: capacity.iter().map(|&g| g.max(1) as f64).collect(),
            max_min: false,
        };
        let solution = lp.solve()?;
        Some(
            configs
                .iter()
                .zip(solution.x)
                .map(|(cs, xs)| {
                    let mut xs = xs.into_iter();
                    cs.iter()
                        .map(|c| match capacity[c.t] {
                            0 => 0.0,
                            _ => xs.next().unwrap_or(0.0),
                        })
                        .collect()
                })
                .collect(),
        )
    }

    /// The same LP by the general sparse solver (clarabel through good_lp): the fallback.
    fn solve_general(
        configs: &[Vec<Config>],
        capacity: &[u32],
        top: f64,
    ) -> Result<Vec<Vec<f64>>, PolicyError> {
        let mut vars = ProblemVariables::new();
        let x: Vec<Vec<Variable>> = configs
            .iter()
            .map(|cs| {
                cs.iter()
                    .map(|_| vars.add(variable().min(0.0).max(1.0)))
                    .collect()
            })
            .collect();
        let mut objective = Expression::default();
        let mut rows = Vec::new();
        let mut used: Vec<Expression> =
            (0..capacity.len()).map(|_| Expression::default()).collect();
        for (cs, xs) in configs.iter().zip(&x) {
            if cs.is_empty() {
                continue;
            }
            let mut one = Expression::default();
            for (c, &v) in cs.iter().zip(xs) {
                objective.add_mul(c.value / top, v);
                one.add_mul(1.0, v);
                used[c.t].add_mul(c.r as f64, v);
            }
            rows.push(one.leq(1.0));
        }
        for (t, e) in used.into_iter().enumerate() {
            rows.push(e.leq(capacity[t] as f64));
        }
        let solution = vars
            .maximise(objective)
            .using(clarabel)
            .with_all(rows)
            .solve()
            .map_err(|e| PolicyError::Solver(e.to_string()))?;
        Ok(x.iter()
            .map(|xs| xs.iter().map(|&v| solution.value(v)).collect())
            .collect())
    }

    /// The makespan bound of the work at hand: all of it at its most efficient size on every
    /// GPU, or the longest job at its fastest, whichever is later.
    fn makespan_bound(configs: &[Vec<Config>], gpus: u32) -> f64 {
        let work: f64 = configs
            .iter()
            .filter_map(|cs| {
                cs.iter()
                    .map(|c| c.r as f64 * c.secs)
                    .min_by(f64::total_cmp)
            })
            .sum();
        let longest = configs
            .iter()
            .filter_map(|cs| cs.iter().map(|c| c.secs).min_by(f64::total_cmp))
            .fold(0.0, f64::max);
        (work / gpus.max(1) as f64).max(longest)
    }
}

impl Scheduler for ElasticLp {
    fn name(&self) -> &'static str {
        "elastic_lp"
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
        let types = snapshot.worker_types.len();
        let mut capacity = vec![0u32; types];
        for n in &snapshot.nodes {
            capacity[n.worker_type] += n.gpus;
        }
        let pricing: Vec<Option<Pricing>> = snapshot
            .jobs
            .iter()
            .map(|job| self.pricing(job, snapshot))
            .collect();
        let configs: Vec<Vec<Config>> = snapshot
            .jobs
            .iter()
            .zip(&pricing)
            .map(|(j, p)| self.configs(j, snapshot, p.as_ref()))
            .collect();
        if configs.iter().all(Vec::is_empty) {
            return Ok(Assignment::new());
        }
        // Values are scaled so the largest is 1: the solvers' tolerances are relative.
        let top = configs
            .iter()
            .flatten()
            .map(|c| c.value)
            .fold(0.0, f64::max);
        let shares = Self::solve_structured(&configs, &capacity, top)
            .map_or_else(|| Self::solve_general(&configs, &capacity, top), Ok)?;

        // Each job's configuration of largest share, the most valuable per GPU first.
        let mut chosen: Vec<(usize, usize, f64)> = Vec::new(); // (job, config, value per GPU)
        for (j, (cs, xs)) in configs.iter().zip(&shares).enumerate() {
            let best = xs
                .iter()
                .copied()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
            if let Some((k, share)) = best
                && share > 1e-3
            {
                chosen.push((j, k, share * cs[k].value / cs[k].r as f64));
            }
        }
        // Rigid jobs on the critical path go first: the LP's type for them, else the one
        // they run on, else their fastest.
        let bound = Self::makespan_bound(&configs, capacity.iter().sum());
        for (j, cs) in configs.iter().enumerate() {
            let job = &snapshot.jobs[j];
            let rigid = pricing[j]
                .as_ref()
                .is_some_and(|p| p.least == job.max_replicas);
            let fastest = cs.iter().map(|c| c.secs).fold(f64::INFINITY, f64::min);
            if cs.is_empty() || !rigid || fastest < bound {
                continue;
            }
            let now_type = job.current_type(&snapshot.nodes);
            let k = match chosen.iter().position(|c| c.0 == j) {
                Some(i) => chosen.remove(i).1,
                None => (0..cs.len())
                    .min_by(|&a, &b| {
                        (Some(cs[b].t) == now_type)
                            .cmp(&(Some(cs[a].t) == now_type))
                            .then(cs[a].secs.total_cmp(&cs[b].secs))
                    })
                    .expect("a job with configurations"),
            };
            chosen.push((j, k, f64::INFINITY));
        }
        chosen.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
        let mut budget = FreeGpus::new(&snapshot.nodes);
        let mut sizes: Vec<(usize, usize, u32)> = Vec::new(); // (job, type, r)
        for (j, k, _) in chosen {
            let want = &configs[j][k];
            let fits = if budget.on_type(want.t) >= want.r {
                Some((want.t, want.r))
            } else {
                // The largest candidate of that type that still fits.
                configs[j]
                    .iter()
                    .filter(|c| c.t == want.t && c.r <= budget.on_type(c.t))
                    .map(|c| (c.t, c.r))
                    .max_by_key(|&(_, r)| r)
            };
            if let Some((t, r)) = fits {
                budget.take(t, r);
                sizes.push((j, t, r));
            }
        }
        self.fill(snapshot, &pricing, &mut budget, &mut sizes);
        sizes.sort_by_key(|&(j, _, r)| (std::cmp::Reverse(r), j));
        let sizes = sizes
            .into_iter()
            .map(|(j, t, r)| (snapshot.jobs[j].id, t, r))
            .collect();
        carry_out(snapshot, sizes, Packing::Tight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::tests::snapshot;
    use crate::units::JobId;

    fn sizes(a: &Assignment) -> Vec<(u64, u32)> {
        a.iter()
            .map(|(id, s)| (id.0, s.iter().map(|x| x.1).sum()))
            .collect()
    }

    #[test]
    fn the_job_closest_to_done_is_served_first_and_capacity_holds() {
        // 4 GPUs, eight one-GPU jobs with 1000, 2000, ... s of work: the four shortest run (the
        // work, 9,000 s on 4 GPUs, is longer than any one job, so none is on the critical path).
        let s = snapshot(1, &[(1, 1, 0.0); 8]);
        let a = ElasticLp::default().schedule(&s).unwrap();
        crate::schedule::check(&s, &a).unwrap();
        assert_eq!(sizes(&a), vec![(0, 1), (1, 1), (2, 1), (3, 1)]);
    }

    #[test]
    fn idle_gpus_go_to_jobs_that_can_use_them() {
        // One job alone on 8 GPUs that has held 4 may grow to 8.
        let mut s = snapshot(2, &[(4, 16, 0.0)]);
        s.jobs[0].peak_replicas = 4;
        let a = ElasticLp::default().schedule(&s).unwrap();
        assert_eq!(sizes(&a), vec![(0, 8)]);
        // A brand-new job starts on one GPU (nothing is known of its scaling yet).
        s.jobs[0].peak_replicas = 0;
        assert_eq!(
            sizes(&ElasticLp::default().schedule(&s).unwrap()),
            vec![(0, 1)]
        );
        let bad = ElasticLp {
            max_growth: 0.5,
            ..ElasticLp::default()
        };
        assert!(matches!(
            bad.schedule(&s),
            Err(PolicyError::InvalidConfig(_))
        ));
    }

    #[test]
    fn a_running_job_is_not_moved_for_less_than_its_restart() {
        // A job on 2 GPUs with 10 s of work left: growing to 4 would save ~4 s but cost 30 s.
        let mut s = snapshot(1, &[(2, 4, 0.0)]);
        s.jobs[0].current = vec![(0, 2)];
        s.jobs[0].peak_replicas = 2;
        s.jobs[0].remaining = 10.0;
        let a = ElasticLp::default().schedule(&s).unwrap();
        assert_eq!(a[&JobId(0)], vec![(0, 2)]);
    }

    #[test]
    fn gpus_the_rounding_leaves_free_go_to_jobs_that_can_use_them() {
        // 64 GPUs, jobs waiting to restart with growth limits whose ladders of candidate sizes
        // (…, 15, 19, 24, 30, 38, …) need not add up to 64: no GPU may stay idle while a job
        // could still use it, and no node is overcommitted.
        for peaks in [[20, 20, 20], [13, 29, 2], [7, 25, 11], [3, 3, 3]] {
            let mut s = snapshot(16, &[(1, 64, 0.0); 3]);
            for (job, peak) in s.jobs.iter_mut().zip(peaks) {
                job.peak_replicas = peak;
                job.remaining = 1e6;
            }
            let a = ElasticLp::default().schedule(&s).unwrap();
            crate::schedule::check(&s, &a).unwrap();
            let used: u32 = sizes(&a).iter().map(|x| x.1).sum();
            let could: u32 = peaks.iter().map(|p| 2 * p).sum();
            assert_eq!(used, could.min(64), "{peaks:?}: {:?}", sizes(&a));
        }
    }

    /// Two long jobs on 8 GPUs, goodput r^0.9, and the policy that values completion rate
    /// alone, under which the shorter takes (nearly) all 8 (6.5e-6 against 6.4e-6 for 4 + 4).
    fn two_long_jobs() -> (Snapshot, ElasticLp) {
        let mut s = snapshot(2, &[(1, 8, 0.0); 2]);
        for (job, remaining) in s.jobs.iter_mut().zip([1e6, 1.2e6]) {
            job.peak_replicas = 8;
            job.remaining = remaining;
            job.goodput = vec![(0..=8).map(|r| (r as f64).powf(0.9)).collect()].into();
        }
        let srpt = ElasticLp {
            efficiency_horizon_s: 0.0,
            ..ElasticLp::default()
        };
        let a = sizes(&srpt.schedule(&s).unwrap());
        assert!(a[0] == (0, 8) || a == vec![(0, 7), (1, 1)], "{a:?}");
        (s, srpt)
    }

    #[test]
    fn long_jobs_advance_side_by_side_where_gpus_do_the_most_work() {
        // Valued over the efficiency horizon as well, both run (5 + 3).
        let (s, _) = two_long_jobs();
        let a = sizes(&ElasticLp::default().schedule(&s).unwrap());
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(a.iter().all(|x| x.1 >= 3) && a[0].1 + a[1].1 == 8, "{a:?}");
        let bad = ElasticLp {
            efficiency_horizon_s: -1.0,
            ..ElasticLp::default()
        };
        assert!(matches!(
            bad.schedule(&s),
            Err(PolicyError::InvalidConfig(_))
        ));
    }

    #[test]
    fn a_fairness_weight_spreads_gpus_over_the_jobs() {
        // With the proportional-fairness term, a GPU is worth more to the job with fewer
        // (ln(1 + s) flattens), so both run on at least 3.
        let (s, srpt) = two_long_jobs();
        let fair = ElasticLp {
            fairness_weight: 1e-5,
            ..srpt.clone()
        };
        let a = sizes(&fair.schedule(&s).unwrap());
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(a.iter().all(|x| x.1 >= 3) && a[0].1 + a[1].1 == 8, "{a:?}");
        for w in [-1e-3, f64::NAN, f64::INFINITY] {
            let bad = ElasticLp {
                fairness_weight: w,
                ..ElasticLp::default()
            };
            assert!(
                matches!(bad.schedule(&s), Err(PolicyError::InvalidConfig(m)) if m.contains("fairness_weight")),
                "{w}"
            );
        }
    }

    #[test]
    fn a_rigid_job_on_the_critical_path_is_not_preempted() {
        // 8 GPUs: a rigid 4-GPU job running, eight short one-GPU jobs waiting.
        let mut jobs = vec![(4, 4, 0.0)];
        jobs.extend([(1, 1, 0.0); 8]);
        let mut s = snapshot(2, &jobs);
        s.jobs[0].goodput = vec![vec![0.0, 0.0, 0.0, 0.0, 4.0]].into();
        s.jobs[0].current = vec![(0, 4)];
        s.jobs[0].peak_replicas = 4;
        let with = |s: &mut Snapshot, long_s: f64, short_s: f64| {
            s.jobs[0].remaining = 4.0 * long_s;
            for job in &mut s.jobs[1..] {
                job.remaining = short_s;
            }
            let a = ElasticLp::default().schedule(s).unwrap();
            crate::schedule::check(s, &a).unwrap();
            sizes(&a)
        };
        // 40,000 s left, the others 100 s each: it alone sets the makespan bound (40,000 s
        // against 40,100 s of work on 8 GPUs), so it keeps its GPUs and four others share the rest.
        let a = with(&mut s, 40_000.0, 100.0);
        assert_eq!(a[0], (0, 4));
        assert_eq!(a.len(), 5);
        // 2,000 s left against 1,500 s each for the others: the work at hand (2,500 s on 8
        // GPUs) sets the bound, and shortest remaining time first lets the short jobs through.
        let a = with(&mut s, 2_000.0, 1_500.0);
        assert_eq!(a, (1..=8).map(|j| (j, 1)).collect::<Vec<_>>());
    }

    #[test]
    fn the_block_method_and_the_general_solver_agree_on_the_optimum() {
        // Jobs of every kind the tests use: new, running, grown; on 2 and 16 nodes.
        for (nodes, n) in [(2, 5), (16, 40)] {
            let mut s = snapshot(nodes, &vec![(1, 64, 0.0); n]);
            for (i, job) in s.jobs.iter_mut().enumerate() {
                job.peak_replicas = (i as u32 * 7) % 24;
                job.remaining = 1e3 * (1 + (i * 37) % 500) as f64;
            }
            s.jobs[0].current = vec![(0, 2)];
            let lp = ElasticLp::default();
            let configs: Vec<Vec<Config>> = s
                .jobs
                .iter()
                .map(|j| lp.configs(j, &s, lp.pricing(j, &s).as_ref()))
                .collect();
            let capacity = vec![4 * nodes as u32];
            let top = configs
                .iter()
                .flatten()
                .map(|c| c.value)
                .fold(0.0, f64::max);
            let objective = |x: &[Vec<f64>]| -> f64 {
                configs
                    .iter()
                    .zip(x)
                    .flat_map(|(cs, xs)| cs.iter().zip(xs).map(|(c, x)| c.value / top * x))
                    .sum()
            };
            let block = ElasticLp::solve_structured(&configs, &capacity, top).unwrap();
            let general = ElasticLp::solve_general(&configs, &capacity, top).unwrap();
            let (a, b) = (objective(&block), objective(&general));
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
            for (xs, cs) in block.iter().zip(&configs) {
                assert!(xs.iter().sum::<f64>() <= 1.0 + 1e-6);
                assert_eq!(xs.len(), cs.len());
            }
        }
    }
}
