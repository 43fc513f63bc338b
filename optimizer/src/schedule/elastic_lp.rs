//! Brain's own scheduler: elastic sizing by linear programming.
//!
//! Every round each job has candidate configurations `c = (worker type t, r GPUs)`, from the
//! fewest GPUs it runs on up to a growth limit, on a geometric ladder of sizes (each ≥ 1.25 ×
//! the last, plus its current and requested size). With `T[j][c]` the seconds job `j` still
//! needs in configuration `c` (work left / goodput) and `d[j][c]` the restart it costs (0 for
//! the configuration it runs in now), the LP is
//!
//! ```text
//! maximise   Σ_j Σ_c x[j][c] / (T[j][c] + d[j][c])
//! subject to Σ_c x[j][c] ≤ 1                      for each job
//!            Σ_j Σ_{c on t} r_c · x[j][c] ≤ G_t   for each worker type t
//!            x ≥ 0
//! ```
//!
//! i.e. the cluster maximises the rate at which jobs complete: a job close to done is worth
//! more per GPU than one far from it (shortest-remaining-time first, which minimises mean JCT),
//! a GPU goes where it shortens a completion the most, and a move pays for its restart. The LP
//! is a relaxation; the answer is made whole by giving each job its configuration of largest
//! share, the most valuable per GPU first, and where GPUs of that type ran out, its largest
//! candidate that still fits. Jobs whose configuration does not change keep their GPUs.
//!
//! Like the Pollux-style policy it adapts batch sizes to the allocation, and a job grows at
//! most `max_growth` × the most GPUs it has held, as a live brain learns a job's scaling while
//! it runs.

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
}

fn default_delay() -> f64 {
    240.0
}
fn default_growth() -> f64 {
    2.0
}

impl Default for ElasticLp {
    fn default() -> Self {
        ElasticLp {
            restart_delay_s: default_delay(),
            max_growth: default_growth(),
        }
    }
}

/// One candidate configuration of one job.
struct Config {
    t: usize,
    r: u32,
    /// Completions per second: 1 / (seconds left in it + the restart it costs).
    rate: f64,
}

impl ElasticLp {
    fn validate(&self) -> Result<(), PolicyError> {
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
        Ok(())
    }

    /// The job's candidate configurations, on every type it runs on.
    fn configs(&self, job: &JobView, snapshot: &Snapshot) -> Vec<Config> {
        let Some(least) = job.min_replicas() else {
            return Vec::new();
        };
        let limit = job.growth_limit(self.max_growth, least);
        let mut sizes = Vec::new();
        let mut r = least;
        while r <= limit {
            sizes.push(r);
            r = (r + 1).max((r as f64 * 1.25).ceil() as u32);
        }
        sizes.push(limit);
        let current = job.current_replicas();
        for extra in [current, job.requested_replicas] {
            if (least..=limit).contains(&extra) {
                sizes.push(extra);
            }
        }
        sizes.sort_unstable();
        sizes.dedup();
        let now_type = job.current_type(&snapshot.nodes);
        let remaining = job.remaining.max(1e-9);
        let mut out = Vec::new();
        for t in 0..snapshot.worker_types.len() {
            for &r in &sizes {
                let g = job.goodput_at(t, r);
                if g <= 0.0 {
                    continue;
                }
                let unchanged = r == current && now_type == Some(t);
                let delay = if unchanged { 0.0 } else { self.restart_delay_s };
                out.push(Config {
                    t,
                    r,
                    rate: 1.0 / (remaining / g + delay),
                });
            }
        }
        out
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

    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError> {
        self.validate()?;
        let types = snapshot.worker_types.len();
        let mut capacity = vec![0u32; types];
        for n in &snapshot.nodes {
            capacity[n.worker_type] += n.gpus;
        }
        let configs: Vec<Vec<Config>> = snapshot
            .jobs
            .iter()
            .map(|j| self.configs(j, snapshot))
            .collect();
        if configs.iter().all(Vec::is_empty) {
            return Ok(Assignment::new());
        }
        // Rates are scaled so the largest is 1: the solver's tolerances are relative.
        let top = configs.iter().flatten().map(|c| c.rate).fold(0.0, f64::max);
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
        let mut used: Vec<Expression> = (0..types).map(|_| Expression::default()).collect();
        for (cs, xs) in configs.iter().zip(&x) {
            if cs.is_empty() {
                continue;
            }
            let mut one = Expression::default();
            for (c, &v) in cs.iter().zip(xs) {
                objective.add_mul(c.rate / top, v);
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

        // Each job's configuration of largest share, the most valuable per GPU first.
        let mut chosen: Vec<(usize, usize, f64)> = Vec::new(); // (job, config, value per GPU)
        for (j, (cs, xs)) in configs.iter().zip(&x).enumerate() {
            let best = cs
                .iter()
                .zip(xs)
                .enumerate()
                .map(|(k, (_, &v))| (k, solution.value(v)))
                .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
            if let Some((k, share)) = best
                && share > 1e-3
            {
                chosen.push((j, k, share * cs[k].rate / cs[k].r as f64));
            }
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
        // 4 GPUs, five one-GPU jobs with 1000, 2000, ... s of work: the four shortest run.
        let s = snapshot(1, &[(1, 1, 0.0); 5]);
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
}
