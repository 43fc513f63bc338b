//! A process killed for memory comes back with more. DLRover doubles the memory of an OOM-killed
//! process; here the new memory is the larger of `growth` × the old and `headroom` × the highest
//! resident memory seen, rounded up to whole MiB and capped at `max_memory`. Workers are alike:
//! the first worker killed grows every worker below the new size (from the killed workers'
//! memory and the largest peak of the role), so
//! its siblings do not die the same way one after the other; a parameter server grows alone. A process already
//! at the cap gets no proposal (growing cannot help; its failure stays visible). OOM kills are
//! counted since the process's resources last changed, so each kill is acted on once.

use serde::{Deserialize, Serialize};

use super::{Action, ChangeKind, Heuristic, JobRuntime, ProcessRuntime, Proposal, check_range};
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
        // Parameter servers hold different shards: each grows on its own kills.
        for p in job.ps.iter().filter(|p| p.oom_kills > 0) {
            if let Some(memory) = self.grown(p.resources.memory, p.memory_peak) {
                out.push(self.proposal(Role::PS, p, memory, killed(Role::PS, p, memory)));
            }
        }
        // Workers are alike (one program, even shares of the data): the first kill grows them
        // all, or the others die the same way one after the other.
        let Some(first) = job.workers.iter().find(|p| p.oom_kills > 0) else {
            return Ok(out);
        };
        let old = job
            .workers
            .iter()
            .filter(|p| p.oom_kills > 0)
            .map(|p| p.resources.memory)
            .max()
            .unwrap_or_default();
        let peak = job
            .workers
            .iter()
            .map(|p| p.memory_peak)
            .max()
            .unwrap_or_default();
        let Some(memory) = self.grown(old, peak) else {
            return Ok(out);
        };
        let why = format!(
            "{}; every worker to {} MiB (the workers are alike)",
            killed(Role::WORKER, first, memory),
            memory.0 / MIB
        );
        for p in job.workers.iter().filter(|p| p.resources.memory < memory) {
            out.push(self.proposal(Role::WORKER, p, memory, why.clone()));
        }
        Ok(out)
    }
}

/// Why `p` of `role` grows to `memory`.
fn killed(role: Role, p: &ProcessRuntime, memory: Bytes) -> String {
    format!(
        "{role}-{} was killed for memory {} time(s) at {} MiB (peak {} MiB): {} MiB",
        p.index,
        p.oom_kills,
        p.resources.memory.0 / MIB,
        p.memory_peak.0 / MIB,
        memory.0 / MIB
    )
}

impl OomGrowth {
    /// The memory after a kill at `old` with `peak` seen: the larger of `growth` × `old` and
    /// `headroom` × `peak`, in whole MiB, capped; none at the cap already.
    fn grown(&self, old: Bytes, peak: Bytes) -> Option<Bytes> {
        if old.0 >= self.max_memory.0 {
            return None;
        }
        let want = (old.0 as f64 * self.growth).max(peak.0 as f64 * self.headroom);
        Some(Bytes(
            ((want / MIB as f64).ceil() as u64 * MIB).min(self.max_memory.0),
        ))
    }

    fn proposal(&self, role: Role, p: &ProcessRuntime, memory: Bytes, reason: String) -> Proposal {
        let mut resources = p.resources.clone();
        resources.memory = memory;
        Proposal {
            kind: ChangeKind::Memory,
            reason,
            action: Action::Migrate(Migration {
                key: SlotKey {
                    role,
                    index: p.index,
                },
                resources: (&resources).into(),
                reason: "out of memory".into(),
            }),
        }
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
        let mut j = job(1, 1);
        j.ps[0].oom_kills = 1;
        j.ps[0].memory_peak = Bytes(1000 * MIB);
        assert_eq!(
            memory_of(&OomGrowth::default().propose(&j).unwrap()),
            vec![1536]
        );
        j.ps[0].memory_peak = Bytes(1500 * MIB);
        assert_eq!(
            memory_of(&OomGrowth::default().propose(&j).unwrap()),
            vec![1800]
        );
    }

    /// One worker killed for memory grows every worker (seen: worker-1 of a DDP job kept dying
    /// at 512 MiB after worker-0 was grown, until the relaunch limit failed the job).
    #[test]
    fn the_first_worker_killed_grows_every_worker_and_a_ps_alone() {
        let mut j = job(2, 3);
        j.workers[1].oom_kills = 1;
        j.workers[1].memory_peak = Bytes(1000 * MIB);
        j.workers[2].memory_peak = Bytes(1200 * MIB);
        let p = OomGrowth::default().propose(&j).unwrap();
        // 1,024 × 1.5 (more than the largest peak of the role, 1,200 × 1.2).
        assert_eq!(memory_of(&p), vec![1536, 1536, 1536]);
        let keys: Vec<u32> = p
            .iter()
            .map(|p| match &p.action {
                Action::Migrate(m) => m.key.index,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(keys, vec![0, 1, 2]);
        assert!(
            p[0].reason.contains("worker-1 was killed") && p[0].reason.contains("every worker"),
            "{}",
            p[0].reason
        );
        // A worker already above the new size is left alone; no PS was killed, none grows.
        j.workers[0].resources.memory = Bytes(2048 * MIB);
        let p = OomGrowth::default().propose(&j).unwrap();
        assert_eq!(memory_of(&p), vec![1536, 1536]);
        // A peak above: 1,400 × 1.2 = 1,680.
        j.workers[2].memory_peak = Bytes(1400 * MIB);
        assert_eq!(
            memory_of(&OomGrowth::default().propose(&j).unwrap()),
            vec![1680, 1680]
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
