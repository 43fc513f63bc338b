//! A hot PS gets more CPU, or the job one more PS. DLRover raises a PS's CPU when one sample
//! passes 90 % of its request; here the PS must stay hot for `sustained_samples` samples in a
//! row (one busy moment is not a reason to restart a PS), the new CPU is sized from the
//! observed peak so the PS lands at `target_fraction` of its new limit (below `hot_fraction`:
//! the band between them is the hysteresis that keeps it from firing again at once), it is
//! capped, and a PS that changed is left alone for `cooldown_s`.
//!
//! When *every* PS of the job is hot the job's speed is bound by its parameter servers as a
//! whole, not by one skewed shard: more CPU for one would move the bottleneck to the next, so
//! the job gets one more PS instead (its parameters are resharded over one more process), up
//! to `max_ps` and at most once per `cooldown_s`. `max_ps = 0` turns that off.

use serde::{Deserialize, Serialize};

use super::{Action, ChangeKind, Heuristic, JobRuntime, ProcessRuntime, Proposal, check_range};
use crate::error::PolicyError;
use crate::plan::{Migration, Role};
use crate::units::Millicores;
use vocab::SlotKey;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HotPs {
    /// A sample is hot when CPU use is at least this fraction of the PS's CPU.
    pub hot_fraction: f64,
    /// Hot samples in a row before acting.
    pub sustained_samples: usize,
    /// The new CPU puts the observed peak at this fraction of it (below `hot_fraction`).
    pub target_fraction: f64,
    /// At least this factor more CPU per step.
    pub min_growth: f64,
    /// Never more CPU than this for one PS.
    pub max_cpu: Millicores,
    /// Seconds a PS is left alone after its CPU changed (and the job after its PS count did).
    pub cooldown_s: f64,
    /// A job whose every PS is hot gets one more PS, up to this many (0: never).
    pub max_ps: u32,
}

impl Default for HotPs {
    fn default() -> Self {
        HotPs {
            hot_fraction: 0.9,
            sustained_samples: 3,
            target_fraction: 0.7,
            min_growth: 1.25,
            max_cpu: Millicores(16_000),
            cooldown_s: 600.0,
            max_ps: 8,
        }
    }
}

impl HotPs {
    /// Whether `p` used at least `hot_fraction` of its CPU for the last `sustained_samples`.
    fn is_hot(&self, p: &ProcessRuntime) -> bool {
        let limit = p.resources.cpu.0 as f64;
        let Some(from) = p.cpu_samples.len().checked_sub(self.sustained_samples) else {
            return false;
        };
        limit > 0.0
            && p.cpu_samples[from..]
                .iter()
                .all(|c| c.0 as f64 >= self.hot_fraction * limit)
    }
}

impl Heuristic for HotPs {
    fn name(&self) -> &'static str {
        "hot_ps"
    }

    fn validate(&self) -> Result<(), PolicyError> {
        check_range("hot_ps", "hot_fraction", self.hot_fraction, 0.05, 1.0)?;
        check_range(
            "hot_ps",
            "target_fraction",
            self.target_fraction,
            0.05,
            self.hot_fraction,
        )?;
        check_range("hot_ps", "min_growth", self.min_growth, 1.0, 16.0)?;
        check_range("hot_ps", "cooldown_s", self.cooldown_s, 0.0, f64::MAX)?;
        if self.sustained_samples == 0 {
            return Err(PolicyError::InvalidConfig(
                "hot_ps.sustained_samples is 0; at least one sample must be hot".into(),
            ));
        }
        Ok(())
    }

    fn propose(&self, job: &JobRuntime) -> Result<Vec<Proposal>, PolicyError> {
        let hot: Vec<&ProcessRuntime> = job.ps.iter().filter(|p| self.is_hot(p)).collect();
        let n = job.ps.len() as u32;
        if n > 0
            && hot.len() == job.ps.len()
            && n < self.max_ps
            && !job.cooling(ChangeKind::PsCount, None, self.cooldown_s)
        {
            return Ok(vec![Proposal {
                kind: ChangeKind::PsCount,
                reason: format!(
                    "every ps used ≥ {:.0} % of its CPU for {} samples: the job is bound by its \
                     parameter servers: {n} -> {} ps",
                    100.0 * self.hot_fraction,
                    self.sustained_samples,
                    n + 1
                ),
                action: Action::SetCount {
                    role: Role::PS,
                    count: n + 1,
                },
            }]);
        }
        let mut out = Vec::new();
        for p in hot {
            let limit = p.resources.cpu.0 as f64;
            if job.cooling(
                ChangeKind::PsCpu,
                Some((Role::PS, p.index)),
                self.cooldown_s,
            ) || p.resources.cpu >= self.max_cpu
            {
                continue;
            }
            let recent = &p.cpu_samples[p.cpu_samples.len() - self.sustained_samples..];
            let peak = recent.iter().map(|c| c.0).max().unwrap_or(0) as f64;
            let want = (peak / self.target_fraction).max(limit * self.min_growth);
            // Whole hundreds of millicores, within the cap.
            let cpu = Millicores(((want / 100.0).ceil() as u64 * 100).min(self.max_cpu.0));
            let mut resources = p.resources.clone();
            resources.cpu = cpu;
            out.push(Proposal {
                kind: ChangeKind::PsCpu,
                reason: format!(
                    "ps-{} used ≥ {:.0} % of its {}m CPU for {} samples (peak {peak:.0}m): {}m",
                    p.index,
                    100.0 * self.hot_fraction,
                    p.resources.cpu.0,
                    self.sustained_samples,
                    cpu.0
                ),
                action: Action::Migrate(Migration {
                    key: SlotKey {
                        role: Role::PS,
                        index: p.index,
                    },
                    resources: (&resources).into(),
                    reason: "hot ps".into(),
                }),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heuristics::Change;
    use crate::heuristics::tests::job;

    fn hot(samples: &[u64]) -> JobRuntime {
        let mut j = job(2, 2);
        j.ps[1].cpu_samples = samples.iter().map(|&c| Millicores(c)).collect();
        j
    }

    fn cpu_of(p: &[Proposal]) -> Vec<u64> {
        p.iter()
            .map(|p| match &p.action {
                Action::Migrate(m) => m.resources.cpu.unwrap().0,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_sustained_hot_ps_gets_cpu_sized_from_its_peak() {
        let h = HotPs::default();
        // 950m of 1000m for three samples: the peak at 70 % needs 1358m, more than 1.25x.
        assert_eq!(
            cpu_of(&h.propose(&hot(&[200, 950, 960, 980])).unwrap()),
            vec![1400]
        );
        // A spike is not enough, nor two hot samples.
        assert!(h.propose(&hot(&[950, 300, 990])).unwrap().is_empty());
        assert!(h.propose(&hot(&[990, 990])).unwrap().is_empty());
        // Just below the threshold: nothing.
        assert!(h.propose(&hot(&[899, 899, 899])).unwrap().is_empty());
    }

    #[test]
    fn growth_is_capped_and_cooled_down() {
        let h = HotPs {
            max_cpu: Millicores(1200),
            ..HotPs::default()
        };
        assert_eq!(
            cpu_of(&h.propose(&hot(&[990, 990, 990])).unwrap()),
            vec![1200]
        );
        let mut j = hot(&[990, 990, 990]);
        j.history.push(Change {
            at_s: j.now_s - 100.0,
            kind: ChangeKind::PsCpu,
            process: Some((Role::PS, 1)),
        });
        assert!(HotPs::default().propose(&j).unwrap().is_empty());
        j.now_s += 600.0;
        assert_eq!(HotPs::default().propose(&j).unwrap().len(), 1);
    }

    #[test]
    fn a_job_whose_every_ps_is_hot_gets_one_more_ps_up_to_the_cap() {
        let h = HotPs::default();
        let mut j = job(2, 2);
        for p in &mut j.ps {
            p.cpu_samples = vec![Millicores(980); 3];
        }
        let p = h.propose(&j).unwrap();
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(
            p[0].action,
            Action::SetCount {
                role: Role::PS,
                count: 3
            }
        );
        assert!(p[0].reason.contains("2 -> 3 ps"), "{p:?}");
        // At the cap, or with scale-out off, the hot PS get CPU instead.
        for max_ps in [2, 0] {
            let h = HotPs {
                max_ps,
                ..HotPs::default()
            };
            assert_eq!(cpu_of(&h.propose(&j).unwrap()), vec![1400, 1400]);
        }
        // Once added, not again within the cool-down.
        j.history.push(Change {
            at_s: j.now_s - 10.0,
            kind: ChangeKind::PsCount,
            process: None,
        });
        assert_eq!(cpu_of(&h.propose(&j).unwrap()), vec![1400, 1400]);
    }

    #[test]
    fn settings_out_of_range_are_rejected() {
        let h = HotPs {
            target_fraction: 0.95,
            ..HotPs::default()
        };
        assert!(
            h.validate()
                .unwrap_err()
                .to_string()
                .contains("target_fraction")
        );
    }
}
