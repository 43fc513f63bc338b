//! DLRover's job-level heuristics (its Brain's auto-scaling, as in [`crate::heuristics`]) on a
//! shared cluster: there is no cluster-wide optimisation, each job scales itself.
//!
//! * Admission: waiting jobs start in order of submission at the size they asked for, wherever
//!   it fits (Kubernetes places pending pods as room appears); a job pending longer than
//!   `pending_timeout_s` accepts any size that fits, down to the fewest GPUs it runs on
//!   (DLRover's pending shrink).
//! * Speed-up: a running job, once `cooldown_s` has passed since its last change, grows by
//!   `step` GPUs while the step's efficiency ((speed gain) / (GPU gain), 1 for linear) is at
//!   least `grow_efficiency`, when GPUs are free after admission; it gives back its last step
//!   when that step's efficiency is below `shrink_efficiency`.
//!
//! Jobs keep the batch size they asked for; the speed of a size is the job's goodput there (in
//! a live cluster, the speed DLRover measures after each change).

use serde::{Deserialize, Serialize};

use super::{Assignment, FreeGpus, JobView, Packing, Scheduler, Snapshot, carry_out};
use crate::error::PolicyError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DlRover {
    /// Grow while a step's efficiency is at least this.
    pub grow_efficiency: f64,
    /// Give the last step back when its efficiency is below this (≤ `grow_efficiency`).
    pub shrink_efficiency: f64,
    /// GPUs added or removed per step.
    pub step: u32,
    /// Seconds between changes of one job.
    pub cooldown_s: f64,
    /// Seconds a job waits at its requested size before it takes what fits.
    pub pending_timeout_s: f64,
}

impl Default for DlRover {
    fn default() -> Self {
        DlRover {
            grow_efficiency: 0.7,
            shrink_efficiency: 0.4,
            step: 1,
            cooldown_s: 300.0,
            pending_timeout_s: 600.0,
        }
    }
}

impl DlRover {
    fn check_settings(&self) -> Result<(), PolicyError> {
        let bad = |m: String| Err(PolicyError::InvalidConfig(m));
        let unit = |v: f64| v.is_finite() && v >= 0.0;
        if !(unit(self.grow_efficiency)
            && unit(self.shrink_efficiency)
            && self.shrink_efficiency <= self.grow_efficiency)
        {
            return bad(format!(
                "efficiencies grow {} / shrink {}: expected 0 ≤ shrink ≤ grow",
                self.grow_efficiency, self.shrink_efficiency
            ));
        }
        if self.step == 0 {
            return bad("step is 0".into());
        }
        if !(unit(self.cooldown_s) && unit(self.pending_timeout_s)) {
            return bad(format!(
                "cooldown_s {} / pending_timeout_s {}",
                self.cooldown_s, self.pending_timeout_s
            ));
        }
        Ok(())
    }

    /// Efficiency of going from `a` to `b > a` GPUs on type `t`.
    fn efficiency(job: &JobView, t: usize, a: u32, b: u32) -> f64 {
        let (ga, gb) = (job.goodput_at(t, a), job.goodput_at(t, b));
        if ga <= 0.0 || b <= a {
            return 0.0;
        }
        (gb / ga - 1.0) / ((b - a) as f64 / a as f64)
    }
}

impl Scheduler for DlRover {
    fn name(&self) -> &'static str {
        "dlrover"
    }

    fn elastic(&self) -> bool {
        true
    }

    fn validate(&self) -> Result<(), PolicyError> {
        self.check_settings()
    }

    fn schedule(&self, snapshot: &Snapshot) -> Result<Assignment, PolicyError> {
        self.check_settings()?;
        let mut budget = FreeGpus::new(&snapshot.nodes);
        // (job, type, GPUs, wants to grow)
        let mut sizes: Vec<(&JobView, usize, u32, bool)> = Vec::new();
        for job in &snapshot.jobs {
            let Some(t) = job.current_type(&snapshot.nodes) else {
                continue;
            };
            let r = job.current_replicas();
            let settled = job
                .last_change_s
                .is_none_or(|c| snapshot.now_s - c >= self.cooldown_s);
            let least = job.min_replicas().unwrap_or(1);
            let back = r.saturating_sub(self.step).max(least);
            let (r, grow) = if !settled {
                (r, false)
            } else if r + self.step <= job.max_replicas
                && Self::efficiency(job, t, r, r + self.step) >= self.grow_efficiency
            {
                (r, true)
            } else if back < r && Self::efficiency(job, t, back, r) < self.shrink_efficiency {
                (back, false)
            } else {
                (r, false)
            };
            if budget.take(t, r).is_some() {
                sizes.push((job, t, r, grow));
            }
        }
        for job in snapshot.jobs.iter().filter(|j| j.current.is_empty()) {
            let want = job.requested_replicas.min(job.max_replicas);
            let least = if snapshot.now_s - job.submitted_s < self.pending_timeout_s {
                want
            } else {
                job.min_replicas().unwrap_or(want).min(want)
            };
            let Some((t, r)) = (least..=want)
                .rev()
                .find_map(|r| budget.fastest_type(job, r).map(|t| (t, r)))
            else {
                continue;
            };
            budget.take(t, r);
            sizes.push((job, t, r, false));
        }
        for s in sizes.iter_mut().filter(|s| s.3) {
            if budget.take(s.1, self.step).is_some() {
                s.2 += self.step;
            }
        }
        sizes.sort_by_key(|&(j, _, r, _)| (std::cmp::Reverse(r), j.id));
        let sizes = sizes.into_iter().map(|(j, t, r, _)| (j.id, t, r)).collect();
        carry_out(snapshot, sizes, Packing::Tight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::tests::snapshot;
    use crate::units::JobId;

    fn n(a: &Assignment, id: u64) -> u32 {
        a.get(&JobId(id)).map_or(0, |s| s.iter().map(|x| x.1).sum())
    }

    #[test]
    fn a_job_that_scales_well_grows_after_its_cooldown_and_waiting_jobs_come_first() {
        // Goodput r^0.8: going 2 → 3 is 0.77 efficient, so a settled job grows.
        let mut s = snapshot(2, &[(2, 8, 0.0), (4, 4, 0.0)]);
        s.jobs[0].current = vec![(0, 2)];
        s.jobs[0].last_change_s = Some(0.0);
        let a = DlRover::default().schedule(&s).unwrap();
        crate::schedule::check(&s, &a).unwrap();
        // Job 1 is admitted at its 4 GPUs first; job 0 grows into what is left.
        assert_eq!((n(&a, 0), n(&a, 1)), (3, 4));
        // Within its cooldown it stays.
        s.jobs[0].last_change_s = Some(900.0);
        let a = DlRover::default().schedule(&s).unwrap();
        assert_eq!((n(&a, 0), n(&a, 1)), (2, 4));
    }

    #[test]
    fn a_job_pending_too_long_takes_what_fits_and_bad_steps_are_given_back() {
        let mut s = snapshot(1, &[(3, 3, 0.0), (4, 4, 0.0)]);
        s.jobs[0].current = vec![(0, 3)];
        s.jobs[0].last_change_s = Some(900.0);
        s.now_s = 100.0;
        s.jobs[1].submitted_s = 0.0;
        assert_eq!(n(&DlRover::default().schedule(&s).unwrap(), 1), 0);
        s.now_s = 1000.0;
        assert_eq!(n(&DlRover::default().schedule(&s).unwrap(), 1), 1);
        let strict = DlRover {
            shrink_efficiency: 0.7,
            grow_efficiency: 0.9,
            ..DlRover::default()
        };
        // 2 → 3 is 0.77 efficient, below 0.9 to grow but above 0.7: it stays at 3.
        s.jobs[0].last_change_s = Some(0.0);
        assert_eq!(n(&strict.schedule(&s).unwrap(), 0), 3);
        let stricter = DlRover {
            shrink_efficiency: 0.8,
            grow_efficiency: 0.9,
            ..DlRover::default()
        };
        assert_eq!(n(&stricter.schedule(&s).unwrap(), 0), 2);
        let bad = DlRover {
            shrink_efficiency: 0.9,
            grow_efficiency: 0.5,
            ..DlRover::default()
        };
        assert!(bad.schedule(&s).is_err());
    }
}
