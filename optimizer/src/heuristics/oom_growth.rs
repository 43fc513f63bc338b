//! A process killed for memory comes back with more. DLRover doubles the memory of an OOM-killed
//! process; here the new memory is the larger of `growth` × the old and `headroom` × the highest
//! resident memory seen, rounded up to whole MiB and capped at `max_memory`. A process already
//! at the cap gets no proposal (growing cannot help; its failure stays visible). OOM kills are
//! counted since the process's resources last changed, so each kill is acted on once.

use serde::{Deserialize, Serialize};

use super::{Action, ChangeKind, Heuristic, JobRuntime, Proposal, check_range};
use crate::error::PolicyError;
use crate::plan::{Migration, Role};
use crate::units::Bytes;
use vocab::SlotKey;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OomGrowth {
    /// At least this factor more memory after an OOM kill.
    pub growth: f64,
    /// At least this factor over the highest resident memory seen.
    pub headroom: f64,
    /// Never more memory than this for one process.
    pub max_memory: Bytes,
}

impl Default for OomGrowth {
    fn default() -> Self {
        OomGrowth {
            growth: 1.5,
            headroom: 1.2,
            max_memory: Bytes(64 << 30),
        }
    }
}

const MIB: u64 = 1 << 20;

impl Heuristic for OomGrowth {
    fn name(&self) -> &'static str {
        "oom_growth"
    }

    fn validate(&self) -> Result<(), PolicyError> {
        check_range("oom_growth", "growth", self.growth, 1.0, 16.0)?;
        check_range("oom_growth", "headroom", self.headroom, 1.0, 16.0)
    }

    fn propose(&self, job: &JobRuntime) -> Result<Vec<Proposal>, PolicyError> {
        let mut out = Vec::new();
        let all = job
            .ps
            .iter()
            .map(|p| (Role::PS, p))
            .chain(job.workers.iter().map(|p| (Role::WORKER, p)));
        for (role, p) in all {
            let old = p.resources.memory.0;
            if p.oom_kills == 0 || old >= self.max_memory.0 {
                continue;
            }
            let want = (old as f64 * self.growth).max(p.memory_peak.0 as f64 * self.headroom);
            let memory = Bytes(((want / MIB as f64).ceil() as u64 * MIB).min(self.max_memory.0));
            let mut resources = p.resources.clone();
            resources.memory = memory;
            out.push(Proposal {
                kind: ChangeKind::Memory,
                reason: format!(
                    "{role}-{} was killed for memory {} time(s) at {} MiB (peak {} MiB): {} MiB",
                    p.index,
                    p.oom_kills,
                    old / MIB,
                    p.memory_peak.0 / MIB,
                    memory.0 / MIB
                ),
                action: Action::Migrate(Migration {
                    key: SlotKey {
                        role,
                        index: p.index,
                    },
                    resources: (&resources).into(),
                    reason: "out of memory".into(),
                }),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heuristics::tests::job;

    fn memory_of(p: &[Proposal]) -> Vec<u64> {
        p.iter()
            .map(|p| match &p.action {
                Action::Migrate(m) => m.resources.memory.unwrap().0 / MIB,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn an_oom_killed_process_grows_by_the_larger_of_factor_and_peak() {
        let mut j = job(1, 2);
        j.workers[1].oom_kills = 1;
        j.workers[1].memory_peak = Bytes(1000 * MIB);
        assert_eq!(
            memory_of(&OomGrowth::default().propose(&j).unwrap()),
            vec![1536]
        );
        j.workers[1].memory_peak = Bytes(1500 * MIB);
        assert_eq!(
            memory_of(&OomGrowth::default().propose(&j).unwrap()),
            vec![1800]
        );
    }

    #[test]
    fn growth_stops_at_the_cap() {
        let mut j = job(1, 1);
        j.ps[0].oom_kills = 2;
        let h = OomGrowth {
            max_memory: Bytes(1200 * MIB),
            ..OomGrowth::default()
        };
        assert_eq!(memory_of(&h.propose(&j).unwrap()), vec![1200]);
        j.ps[0].resources.memory = Bytes(1200 * MIB);
        assert!(h.propose(&j).unwrap().is_empty());
        assert!(OomGrowth::default().propose(&job(1, 1)).unwrap().is_empty());
    }
}
