//! The rate-capped bound on mean JCT: the capacity bound of [`super::bound`] with each job's
//! speed capped, as a time-indexed LP (issue 45: the capacity bound lets one job run at the
//! whole cluster's rate at its most efficient size, which is what made it weak under load).
//!
//! Any schedule, cut into slots of Δ from the first job's earliest progress:
//!
//! * in each slot, a job spends a share `x[j,c,k]` of the slot at each configuration `c` (a GPU
//!   type and a GPU count), at most the whole slot together (from its earliest progress: its
//!   first round and one restart penalty), and the GPUs its configurations hold average to at
//!   most each type's;
//! * at configuration `c` it progresses no faster than `G[j,c]`, the best goodput of any
//!   placement of that size on that type, in any epoch, at any batch choice it may get (a rigid
//!   job: its duration at its GPUs, on any type that holds them), so the share of its work done
//!   in slot `k`, `a[j,k]`, is at most `Σ_c x[j,c,k] Δ G[j,c] / P[j]`; work not done by the last
//!   slot is done after it (`y[j]`, without a cap: the bound holds whatever the horizon);
//! * its work's mean time `M[j]` is at least `Σ_k a[j,k] max(t_k, release) + y[j] t_K`, and as
//!   its progress is never faster than its best rate, its completion is at least `M[j]` plus
//!   half its fastest time `P[j] / max_c G[j,c]` (the work after any instant t needs at least
//!   that fraction of the fastest time, so `C − M = ∫ (C − t) dA(t) ≥ T / 2`); and at least its
//!   alone bound.
//!
//! Minimising the sum of those completions over the shares is an LP whose optimum no schedule
//! beats. Mixing two configurations of one type in a slot gives every point between them, so
//! only the configurations on the upper concave hull of (GPUs, rate) are kept: the LP's optimum
//! is the same. Solved with clarabel (an interior point method, through good_lp), its
//! objective taken 1e-6 below for the solver's tolerance.

use super::{ClusterSpec, SimConfig};
use crate::error::PolicyError;

/// One job as the LP sees it.
#[derive(Clone, Debug)]
pub(super) struct CappedJob {
    pub submit_s: f64,
    /// When it can first make progress: its first round plus one restart penalty.
    pub release_s: f64,
    /// Its alone bound on completion (absolute time).
    pub alone_end_s: f64,
    /// Its work, in the unit of the rates.
    pub work: f64,
    /// (worker type, GPUs, best rate).
    pub configs: Vec<(usize, u32, f64)>,
}

/// How finely the LP cuts time: finer is tighter and slower (Pollux's 1.5× workload-1, 240
/// jobs: 32 slots 1,407 s in 4 s, 64 slots 1,451 s in 16 s, 128 slots 1,493 s in 79 s).
pub(super) const SLOTS: usize = 48;

/// The most variables the LP is built with: a larger trace (Philly's 82,247 jobs, say) gets
/// the other bounds only.
pub(super) const MAX_VARIABLES: usize = 300_000;

/// The LP's bound on the sum of completion times minus submissions, divided by the jobs: a
/// mean JCT no schedule beats; `None` when the LP would have more than [`MAX_VARIABLES`].
/// `end_s` is where the slots end (any time: work after it is counted at it); `capacity[t]`
/// the GPUs of type `t`.
pub(super) fn rate_capped_mean(
    jobs: &[CappedJob],
    capacity: &[u32],
    end_s: f64,
    slots: usize,
) -> Result<Option<f64>, PolicyError> {
    use good_lp::{Expression, ProblemVariables, SolverModel, clarabel};
    if jobs.is_empty() {
        return Ok(Some(0.0));
    }
    let start = jobs
        .iter()
        .map(|j| j.release_s)
        .fold(f64::INFINITY, f64::min);
    let end = end_s.max(start + 1.0);
    let grid = Grid {
        start,
        delta: (end - start) / slots as f64,
        count: slots,
    };
    let size: usize = jobs
        .iter()
        .map(|j| (slots - grid.first(j.release_s)) * (hull(&j.configs).len() + 1))
        .sum();
    if size > MAX_VARIABLES {
        return Ok(None);
    }
    let mut vars = ProblemVariables::new();
    let mut rows = Vec::new();
    // Per (slot, type), the GPUs held.
    let mut hold: Vec<Vec<Expression>> = vec![vec![Expression::default(); capacity.len()]; slots];
    let mut goal = Expression::default();
    for j in jobs {
        goal += job_rows(j, &grid, &mut vars, &mut rows, &mut hold);
    }
    for per_type in hold {
        for (held, &gpus) in per_type.into_iter().zip(capacity) {
            rows.push(held.leq(f64::from(gpus)));
        }
    }
    let mut model = vars.minimise(goal.clone()).using(clarabel);
    model
        .settings()
        .tol_gap_rel(1e-9)
        .tol_gap_abs(1e-6)
        .tol_feas(1e-9);
    let solution = model
        .with_all(rows)
        .solve()
        .map_err(|e| PolicyError::Solver(format!("the rate-capped bound: {e}")))?;
    use good_lp::Solution;
    // An interior point's objective is within its tolerance above the optimum: keep below.
    let sum = solution.eval(&goal) * (1.0 - 1e-6);
    let submitted: f64 = jobs.iter().map(|j| j.submit_s).sum();
    Ok(Some((sum - submitted) / jobs.len() as f64))
}

/// The LP's slots: `count` of `delta` seconds from `start`.
struct Grid {
    start: f64,
    delta: f64,
    count: usize,
}

impl Grid {
    fn t(&self, k: usize) -> f64 {
        self.start + k as f64 * self.delta
    }

    /// The slot a job released at `release_s` first progresses in.
    fn first(&self, release_s: f64) -> usize {
        (((release_s - self.start) / self.delta).floor() as usize).min(self.count)
    }
}

/// Job `j`'s variables and rows (its shares, its work per slot, its completion); the GPUs its
/// shares hold go to `hold`. Returns its completion.
fn job_rows(
    j: &CappedJob,
    grid: &Grid,
    vars: &mut good_lp::ProblemVariables,
    rows: &mut Vec<good_lp::Constraint>,
    hold: &mut [Vec<good_lp::Expression>],
) -> good_lp::Variable {
    use good_lp::{Expression, variable};
    let fastest = j.configs.iter().map(|c| c.2).fold(0.0, f64::max);
    let configs = hull(&j.configs);
    let first = grid.first(j.release_s);
    // Its completion: at least its alone bound.
    let c = vars.add(variable().min(j.alone_end_s));
    // C − Σ a s − y t_K ≥ T / 2, and Σ a + y = 1.
    let mut mean: Expression = c.into();
    let mut done = Expression::default();
    for (k, held) in hold.iter_mut().enumerate().skip(first) {
        let share = if k == first {
            ((grid.t(k + 1) - j.release_s) / grid.delta).clamp(0.0, 1.0)
        } else {
            1.0
        };
        let a = vars.add(variable().min(0.0).max(1.0));
        mean.add_mul(-grid.t(k).max(j.release_s), a);
        done += a;
        let mut time = Expression::default();
        let mut rate: Expression = a.into();
        for &(ty, r, g) in &configs {
            let x = vars.add(variable().min(0.0).max(1.0));
            time += x;
            rate.add_mul(-grid.delta * g / j.work, x);
            held[ty].add_mul(f64::from(r), x);
        }
        rows.push(time.leq(share));
        rows.push(rate.leq(0.0));
    }
    let y = vars.add(variable().min(0.0).max(1.0));
    done += y;
    mean.add_mul(-grid.t(grid.count).max(j.release_s), y);
    rows.push(done.eq(1.0));
    let half = if fastest > 0.0 {
        j.work / fastest / 2.0
    } else {
        0.0
    };
    rows.push(mean.geq(half));
    c
}

/// The configurations on the upper concave hull of (GPUs, rate) per type, with the origin: any
/// other is beaten by sharing a slot between two of them.
fn hull(configs: &[(usize, u32, f64)]) -> Vec<(usize, u32, f64)> {
    let mut out = Vec::new();
    let mut types: Vec<usize> = configs.iter().map(|c| c.0).collect();
    types.sort_unstable();
    types.dedup();
    for ty in types {
        let mut points: Vec<(f64, f64, u32)> = configs
            .iter()
            .filter(|c| c.0 == ty && c.2 > 0.0)
            .map(|c| (f64::from(c.1), c.2, c.1))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        // Monotone chain from the origin, keeping right turns only (upper hull), and only
        // points that raise the rate.
        let mut chain: Vec<(f64, f64, u32)> = vec![(0.0, 0.0, 0)];
        for q in points {
            if q.1 <= chain.last().expect("origin").1 {
                continue;
            }
            while chain.len() >= 2 {
                let (o, a) = (chain[chain.len() - 2], chain[chain.len() - 1]);
                let cross = (a.0 - o.0) * (q.1 - o.1) - (a.1 - o.1) * (q.0 - o.0);
                if cross >= 0.0 {
                    chain.pop();
                } else {
                    break;
                }
            }
            chain.push(q);
        }
        out.extend(chain.into_iter().skip(1).map(|(_, g, r)| (ty, r, g)));
    }
    out
}

/// Where the LP's slots end: past every alone bound and the capacity bound's last completion,
/// twice as far from the first release (work after it is still counted).
pub(super) fn horizon(jobs: &[CappedJob], capacity_end_s: f64) -> f64 {
    let start = jobs
        .iter()
        .map(|j| j.release_s)
        .fold(f64::INFINITY, f64::min);
    let last = jobs
        .iter()
        .map(|j| j.alone_end_s)
        .fold(capacity_end_s, f64::max);
    start + 2.0 * (last - start).max(1.0)
}

/// GPUs of each worker type of `cluster`, in the order of [`ClusterSpec::worker_types`].
pub(super) fn type_capacity(cluster: &ClusterSpec) -> Vec<u32> {
    cluster
        .worker_types()
        .iter()
        .map(|t| {
            cluster
                .nodes
                .iter()
                .filter(|n| &n.worker_type == t)
                .map(|n| n.gpus)
                .sum()
        })
        .collect()
}

/// A job's release: its first round at or after submission plus one restart penalty.
pub(super) fn release(submit_s: f64, config: &SimConfig) -> f64 {
    (submit_s / config.round_s).ceil() * config.round_s + config.restart_penalty_s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(submit: f64, work: f64, configs: Vec<(usize, u32, f64)>) -> CappedJob {
        let fastest = configs.iter().map(|c| c.2).fold(0.0, f64::max);
        CappedJob {
            submit_s: submit,
            release_s: submit,
            alone_end_s: submit + work / fastest,
            work,
            configs,
        }
    }

    #[test]
    fn an_lp_too_large_is_left_out() {
        let jobs: Vec<CappedJob> = (0..1000)
            .map(|i| {
                job(
                    f64::from(i),
                    100.0,
                    (1..=8).map(|r| (0, r, f64::from(r))).collect(),
                )
            })
            .collect();
        // 1,000 jobs × up to 600 slots × 2 variables: over the limit.
        assert_eq!(rate_capped_mean(&jobs, &[8], 2000.0, 600).unwrap(), None);
    }

    #[test]
    fn the_hull_keeps_what_sharing_cannot_beat() {
        // Rates 10, 15, 16, 30 at 1, 2, 3, 4 GPUs: 3 GPUs (16) lies under the chord from 2 to 4.
        let h = hull(&[(0, 1, 10.0), (0, 2, 15.0), (0, 3, 16.0), (0, 4, 30.0)]);
        assert_eq!(h, [(0, 1, 10.0), (0, 4, 30.0)]);
        // Concave speed-up: every point is kept; a slower larger size is dropped.
        let h = hull(&[(0, 1, 10.0), (0, 2, 18.0), (0, 4, 30.0), (0, 8, 29.0)]);
        assert_eq!(h, [(0, 1, 10.0), (0, 2, 18.0), (0, 4, 30.0)]);
    }

    #[test]
    fn a_full_cluster_queue_costs_what_one_machine_would_and_no_more() {
        // Two jobs of 100 units on a type of 1 GPU, rate 1, both at 0: the best schedule runs
        // one then the other (JCTs 100 and 200, mean 150). The LP may share the GPU but not
        // speed a job up: its bound lies between the alone bound (100) and 150.
        let jobs = [
            job(0.0, 100.0, vec![(0, 1, 1.0)]),
            job(0.0, 100.0, vec![(0, 1, 1.0)]),
        ];
        let b = rate_capped_mean(&jobs, &[1], 400.0, 200).unwrap().unwrap();
        assert!(b > 100.0 + 40.0 && b <= 150.0 + 1e-6, "{b}");
    }

    #[test]
    fn a_lone_job_is_bounded_by_its_alone_time() {
        let jobs = [job(10.0, 100.0, vec![(0, 1, 1.0), (0, 2, 1.8)])];
        let b = rate_capped_mean(&jobs, &[2], 200.0, 50).unwrap().unwrap();
        // Its alone bound, less the solver's tolerance (taken on the safe side).
        let alone = 100.0 / 1.8;
        assert!(b <= alone && b > alone - 1e-3, "{b}");
    }
}
