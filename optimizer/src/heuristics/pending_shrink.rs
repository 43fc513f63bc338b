//! Processes that wait too long to be placed. DLRover drops workers pending too long; here
//! pending workers beyond `pending_timeout_s` are given up (never below the job's minimum, so a
//! job that cannot reach its minimum keeps asking), and a pending PS, which the job cannot do
//! without, is asked for with `ps_cpu_shrink` × its CPU (not below `min_ps_cpu`) so it fits.
//! After a shrink the job is left alone for `cooldown_s`.

use serde::{Deserialize, Serialize};

use super::{Action, ChangeKind, Heuristic, JobRuntime, Proposal, check_range};
use crate::error::PolicyError;
use crate::plan::{Migration, Role};
use crate::units::Millicores;
use vocab::SlotKey;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PendingShrink {
    /// Seconds a process may wait to be placed.
    pub pending_timeout_s: f64,
    /// A pending PS is asked for with this fraction of its CPU.
    pub ps_cpu_shrink: f64,
    /// ... but never less than this.
    pub min_ps_cpu: Millicores,
    /// Seconds the job is left alone after a shrink.
    pub cooldown_s: f64,
}

impl Default for PendingShrink {
    fn default() -> Self {
        PendingShrink {
            pending_timeout_s: 300.0,
            ps_cpu_shrink: 0.5,
            min_ps_cpu: Millicores(500),
            cooldown_s: 600.0,
        }
    }
}

impl Heuristic for PendingShrink {
    fn name(&self) -> &'static str {
        "pending_shrink"
    }

    fn validate(&self) -> Result<(), PolicyError> {
        check_range(
            "pending_shrink",
            "pending_timeout_s",
            self.pending_timeout_s,
            0.0,
            f64::MAX,
        )?;
        check_range(
            "pending_shrink",
            "ps_cpu_shrink",
            self.ps_cpu_shrink,
            0.05,
            1.0,
        )?;
        check_range(
            "pending_shrink",
            "cooldown_s",
            self.cooldown_s,
            0.0,
            f64::MAX,
        )
    }

    fn propose(&self, job: &JobRuntime) -> Result<Vec<Proposal>, PolicyError> {
        if job.cooling(ChangeKind::Pending, None, self.cooldown_s) {
            return Ok(Vec::new());
        }
        let overdue =
            |since: Option<f64>| since.is_some_and(|t| job.now_s - t >= self.pending_timeout_s);
        let mut out = Vec::new();
        let stuck = job
            .workers
            .iter()
            .filter(|w| overdue(w.pending_since_s))
            .count() as u32;
        let target = job
            .config
            .workers
            .saturating_sub(stuck)
            .max(job.min_workers);
        if stuck > 0 && target < job.config.workers {
            out.push(Proposal {
                kind: ChangeKind::Pending,
                reason: format!(
                    "{stuck} worker(s) pending over {:.0} s: {} -> {target} workers",
                    self.pending_timeout_s, job.config.workers
                ),
                action: Action::SetCount {
                    role: Role::WORKER,
                    count: target,
                },
            });
        }
        for p in job.ps.iter().filter(|p| overdue(p.pending_since_s)) {
            let cpu = Millicores(
                ((p.resources.cpu.0 as f64 * self.ps_cpu_shrink) as u64).max(self.min_ps_cpu.0),
            );
            if cpu >= p.resources.cpu {
                continue;
            }
            let mut resources = p.resources.clone();
            resources.cpu = cpu;
            out.push(Proposal {
                kind: ChangeKind::Pending,
                reason: format!(
                    "ps-{} pending over {:.0} s: CPU {}m -> {}m",
                    p.index, self.pending_timeout_s, p.resources.cpu.0, cpu.0
                ),
                action: Action::Migrate(Migration {
                    key: SlotKey {
                        role: Role::PS,
                        index: p.index,
                    },
                    resources: (&resources).into(),
                    reason: "pending too long".into(),
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

    #[test]
    fn overdue_workers_are_given_up_down_to_the_minimum() {
        let mut j = job(1, 4);
        j.min_workers = 2;
        j.workers[2].pending_since_s = Some(j.now_s - 400.0);
        j.workers[3].pending_since_s = Some(j.now_s - 100.0);
        let p = PendingShrink::default().propose(&j).unwrap();
        assert_eq!(
            p[0].action,
            Action::SetCount {
                role: Role::WORKER,
                count: 3
            }
        );
        for w in &mut j.workers {
            w.pending_since_s = Some(j.now_s - 1000.0);
        }
        let p = PendingShrink::default().propose(&j).unwrap();
        assert_eq!(
            p[0].action,
            Action::SetCount {
                role: Role::WORKER,
                count: 2
            }
        );
        j.history.push(Change {
            at_s: j.now_s - 10.0,
            kind: ChangeKind::Pending,
            process: None,
        });
        assert!(PendingShrink::default().propose(&j).unwrap().is_empty());
    }

    #[test]
    fn an_overdue_ps_is_asked_for_with_less_cpu_but_not_below_the_floor() {
        let mut j = job(2, 1);
        j.ps[1].pending_since_s = Some(0.0);
        let p = PendingShrink::default().propose(&j).unwrap();
        match &p[0].action {
            Action::Migrate(m) => {
                assert_eq!((m.key.index, m.resources.cpu), (1, Some(Millicores(500))))
            }
            other => panic!("{other:?}"),
        }
        j.ps[1].resources.cpu = Millicores(500);
        assert!(PendingShrink::default().propose(&j).unwrap().is_empty());
    }
}
