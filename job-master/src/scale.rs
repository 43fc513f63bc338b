//! Scale plans (pure, no I/O): what a plan asks, whether the job can carry it out, and the
//! bookkeeping of desired vs reached plan versions.
//!
//! A plan names, per role, a target count and the resources of processes launched from then on,
//! plus migrations (replace one process by one with other resources). [`validate`] checks it
//! against the spec's elastic bounds and what the platform can place, and rejects it with the
//! reason; the job then runs on untouched. The transition that carries a plan out lives in
//! [`crate::job`]; [`PlanBook`] only orders plans: one executes at a time, and a plan arriving
//! meanwhile waits, replacing any older waiting plan (merged, never interleaved).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::{Bytes, JobKind, JobSpec, Millicores, Resources, Role};
use vocab::SlotKey;

pub use vocab::plan::{Migration, RoleTarget, ScalePlan};

/// What the platform can place: the shell reads it from the machine (local) or the cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// Processes of this job the platform can run at once.
    pub max_processes: u32,
    /// The largest process the platform can place.
    pub cpu: Millicores,
    pub memory: Bytes,
    pub gpus: u32,
}

impl Default for Capacity {
    fn default() -> Self {
        Self {
            max_processes: 64,
            cpu: Millicores(u64::MAX),
            memory: Bytes(u64::MAX),
            gpus: u32::MAX,
        }
    }
}

/// Why a job cannot carry a plan out; the job then runs on untouched and the sender is told.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanRejection {
    #[error("the job is {0}")]
    NotRunning(&'static str),
    #[error("the job has no data left to train on")]
    NoDataLeft,
    #[error("plan version {version} is not newer than the accepted version {accepted}")]
    StaleVersion { version: u64, accepted: u64 },
    #[error("an {0} job has no parameter servers")]
    NoParameterServers(JobKind),
    #[error("the job has no {0} role")]
    NoSuchRole(Role),
    #[error(
        "the job has no worker role: its training group is {0} (`--role {0}=N`, not `--workers`)"
    )]
    TrainingNamed(Role),
    #[error("{role} count {count} is outside [min {min}, max {max}]")]
    OutOfBounds {
        role: Role,
        count: u32,
        min: u32,
        max: u32,
    },
    #[error("{role} count {count} is not a multiple of node_unit {node_unit}")]
    NotNodeUnit {
        role: Role,
        count: u32,
        node_unit: u32,
    },
    #[error("{what}: cpu 0m must be more than zero")]
    ZeroCpu { what: String },
    #[error("{what}: {asked} is more than the platform can place ({can})")]
    TooLarge {
        what: String,
        asked: String,
        can: String,
    },
    #[error("{total} processes are more than the platform can place ({can})")]
    TooManyProcesses { total: u32, can: u32 },
    #[error("migration of {0}: no such process stays in the job")]
    NoSuchProcess(SlotKey),
    #[error("{0} is migrated twice")]
    MigratedTwice(SlotKey),
    #[error(
        "{role}: the plan names {nodes} nodes for the {adds} processes it adds (at most one each)"
    )]
    TooManyNodes { role: Role, nodes: usize, adds: u32 },
    #[error("{0}: the plan names a node without a name")]
    EmptyNodeName(Role),
}

fn check_resources(what: &str, r: &Resources, cap: &Capacity) -> Result<(), PlanRejection> {
    let too_large = |asked: String, can: String| PlanRejection::TooLarge {
        what: what.to_string(),
        asked,
        can,
    };
    if let Some(c) = r.cpu {
        if c.0 == 0 {
            return Err(PlanRejection::ZeroCpu {
                what: what.to_string(),
            });
        }
        if c > cap.cpu {
            return Err(too_large(
                format!("cpu {}m", c.0),
                format!("{}m", cap.cpu.0),
            ));
        }
    }
    if let Some(m) = r.memory
        && m > cap.memory
    {
        return Err(too_large(
            format!("memory {} bytes", m.0),
            format!("{} bytes", cap.memory.0),
        ));
    }
    if let Some(g) = r.gpu
        && g > vocab::Gpus::whole(cap.gpus)
    {
        return Err(too_large(format!("{g} GPUs"), cap.gpus.to_string()));
    }
    Ok(())
}

/// A role's `nodes`: at most one for each process the plan adds to the `now` it has, each
/// named.
fn check_nodes(role: Role, target: &RoleTarget, now: u32) -> Result<(), PlanRejection> {
    let adds = target.count.saturating_sub(now);
    if target.nodes.len() > adds as usize {
        return Err(PlanRejection::TooManyNodes {
            role,
            nodes: target.nodes.len(),
            adds,
        });
    }
    if target.nodes.iter().any(|n| n.trim().is_empty()) {
        return Err(PlanRejection::EmptyNodeName(role));
    }
    Ok(())
}

/// Checks `plan` against the spec's bounds and the platform's capacity. `current` is the
/// count of each role now (roles the plan does not name keep it). `live` are the slots that run.
pub fn validate(
    plan: &ScalePlan,
    spec: &JobSpec,
    current: &BTreeMap<Role, u32>,
    live: &[SlotKey],
    cap: &Capacity,
) -> Result<(), PlanRejection> {
    let mut total = 0u32;
    for (&role, &now) in current {
        let count = plan.roles.get(&role).map_or(now, |t| t.count);
        total = total.saturating_add(count);
    }
    for (&role, target) in &plan.roles {
        if role == Role::PS && spec.kind != JobKind::Ps {
            return Err(PlanRejection::NoParameterServers(spec.kind));
        }
        let Ok(bounds) = spec.role_plan(role) else {
            let trainer = spec.training_role();
            return Err(if role == Role::WORKER && trainer != Role::WORKER {
                PlanRejection::TrainingNamed(trainer)
            } else {
                PlanRejection::NoSuchRole(role)
            });
        };
        let count = target.count;
        if count < bounds.min || count > bounds.max {
            return Err(PlanRejection::OutOfBounds {
                role,
                count,
                min: bounds.min,
                max: bounds.max,
            });
        }
        if count % bounds.node_unit != 0 {
            return Err(PlanRejection::NotNodeUnit {
                role,
                count,
                node_unit: bounds.node_unit,
            });
        }
        if let Some(r) = &target.resources {
            check_resources(&format!("{role} resources"), r, cap)?;
        }
        check_nodes(role, target, current.get(&role).copied().unwrap_or(0))?;
    }
    if total > cap.max_processes {
        return Err(PlanRejection::TooManyProcesses {
            total,
            can: cap.max_processes,
        });
    }
    let mut seen = Vec::new();
    for m in &plan.migrations {
        let count = plan
            .roles
            .get(&m.key.role)
            .map(|t| t.count)
            .or_else(|| current.get(&m.key.role).copied())
            .unwrap_or(0);
        if !live.contains(&m.key) || m.key.index >= count {
            return Err(PlanRejection::NoSuchProcess(m.key));
        }
        if seen.contains(&m.key) {
            return Err(PlanRejection::MigratedTwice(m.key));
        }
        seen.push(m.key);
        check_resources(&format!("migration of {}", m.key), &m.resources, cap)?;
    }
    Ok(())
}

/// Desired vs reached plan versions, and the plan waiting behind the one in progress.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanBook {
    /// The newest accepted plan's version.
    pub desired: u64,
    /// The newest plan fully carried out.
    pub reached: u64,
    pub queued: Option<ScalePlan>,
    /// The newest plan given up after it was accepted, and why (its consistent cut never
    /// came); the job went on at its old size.
    #[serde(default)]
    pub abandoned: Option<AbandonedPlan>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbandonedPlan {
    pub version: u64,
    pub reason: String,
}

impl PlanBook {
    /// Refuses a version that is not above the newest accepted one.
    pub fn check_version(&self, version: u64) -> Result<(), PlanRejection> {
        if version <= self.desired {
            return Err(PlanRejection::StaleVersion {
                version,
                accepted: self.desired,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec::from_yaml(
            "name: t\nkind: ps\nroles:\n  ps: { replicas: 2, min: 1, max: 4 }\n  \
             worker: { replicas: 2, min: 1, max: 8, node_unit: 1 }\n\
             workload:\n  builtin: {}\ndata: { num_samples: 100, shard_size: 10 }\n\
             checkpoint: { dir: /tmp/x }\n",
        )
        .unwrap()
    }

    fn plan(ps: Option<u32>, workers: Option<u32>) -> ScalePlan {
        let mut p = ScalePlan {
            version: 1,
            ..Default::default()
        };
        if let Some(n) = ps {
            p.roles.insert(
                Role::PS,
                RoleTarget {
                    count: n,
                    resources: None,
                    ..Default::default()
                },
            );
        }
        if let Some(n) = workers {
            p.roles.insert(
                Role::WORKER,
                RoleTarget {
                    count: n,
                    resources: None,
                    ..Default::default()
                },
            );
        }
        p
    }

    fn current() -> BTreeMap<Role, u32> {
        [(Role::PS, 2), (Role::WORKER, 2)].into()
    }

    #[test]
    fn a_plan_names_at_most_one_node_for_each_process_it_adds() {
        let s = spec();
        let ok = |p: &ScalePlan| validate(p, &s, &current(), &[], &Capacity::default());
        let with = |workers: u32, nodes: &[&str]| {
            let mut p = plan(None, Some(workers));
            p.roles.get_mut(&Role::WORKER).unwrap().nodes =
                nodes.iter().map(|n| n.to_string()).collect();
            p
        };
        // 2 → 4 adds two; one named and one left to the job master is fine too.
        assert_eq!(ok(&with(4, &["10.0.0.2", "10.0.0.3"])), Ok(()));
        assert_eq!(ok(&with(4, &["10.0.0.2"])), Ok(()));
        assert_eq!(
            ok(&with(3, &["10.0.0.2", "10.0.0.3"]))
                .unwrap_err()
                .to_string(),
            "worker: the plan names 2 nodes for the 1 processes it adds (at most one each)"
        );
        // A shrink adds none.
        assert!(matches!(
            ok(&with(1, &["10.0.0.2"])),
            Err(PlanRejection::TooManyNodes { adds: 0, .. })
        ));
        assert_eq!(
            ok(&with(3, &[" "])),
            Err(PlanRejection::EmptyNodeName(Role::WORKER))
        );
    }

    #[test]
    fn plans_outside_the_bounds_or_the_capacity_are_rejected_with_the_reason() {
        let s = spec();
        let cap = Capacity {
            max_processes: 10,
            ..Default::default()
        };
        let ok = |p: &ScalePlan| validate(p, &s, &current(), &[], &cap);
        assert_eq!(ok(&plan(Some(3), Some(4))), Ok(()));
        assert!(
            ok(&plan(Some(5), None))
                .unwrap_err()
                .to_string()
                .contains("outside")
        );
        assert!(
            ok(&plan(None, Some(0)))
                .unwrap_err()
                .to_string()
                .contains("outside")
        );
        assert!(
            ok(&plan(Some(4), Some(8)))
                .unwrap_err()
                .to_string()
                .contains("12 processes are more than the platform can place (10)")
        );
        let mut big = plan(None, Some(2));
        big.roles.get_mut(&Role::WORKER).unwrap().resources = Some(Resources {
            cpu: Some(Millicores(4000)),
            ..Default::default()
        });
        let small = Capacity {
            cpu: Millicores(2000),
            ..Default::default()
        };
        assert!(
            validate(&big, &s, &current(), &[], &small)
                .unwrap_err()
                .to_string()
                .contains("cpu 4000m is more than the platform can place (2000m)")
        );
        let mut mig = plan(None, Some(1));
        mig.migrations.push(Migration {
            key: SlotKey {
                role: Role::WORKER,
                index: 1,
            },
            resources: Resources::default(),
            reason: "oom".into(),
        });
        let live = [SlotKey {
            role: Role::WORKER,
            index: 1,
        }];
        assert!(
            validate(&mig, &s, &current(), &live, &cap)
                .unwrap_err()
                .to_string()
                .contains("no such process stays")
        );
    }

    #[test]
    fn versions_must_increase() {
        let book = PlanBook {
            desired: 3,
            ..Default::default()
        };
        assert!(book.check_version(3).is_err());
        assert!(book.check_version(4).is_ok());
    }
}
