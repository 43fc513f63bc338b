//! Placement groups: which processes of a job must share a node, and which must not.
//!
//! A spec's `placement:` lists groups of roles, each with a strategy Ray's placement groups
//! name: `strict_pack` (every process of the group on one node), `pack` (as few nodes as
//! possible), `strict_spread` (no two on one node), `spread` (as many nodes as possible). A
//! group is one bundle per process, laid out all at once before any of them starts, so a group
//! the cluster cannot hold starts none of them. On Ray the job master lays the bundles over the
//! nodes and pins each process to its node (`job_master::platform::ray`); on local processes
//! every process shares the one machine, so `strict_spread` of more than one process cannot be
//! held there and is refused at start.
//!
//! A group's roles may be resized: a process beyond the group's first ones is laid out beside
//! them as the strategy says (on a node of its own for `strict_spread`, on the group's node for
//! `strict_pack`), or waits with the reason when no node can take it.

use serde::{Deserialize, Serialize};

use super::JobSpec;
use crate::error::SpecError;
use crate::role::Role;

/// At most this many placement groups per job.
pub const MAX_GROUPS: usize = 16;

/// How a placement group's processes are laid over nodes (Ray's placement strategies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// All on one node, or none starts.
    StrictPack,
    /// On as few nodes as possible.
    Pack,
    /// No two on one node, or none starts.
    StrictSpread,
    /// On as many nodes as possible.
    Spread,
}

impl Strategy {
    /// Ray's name for it (`ray.util.placement_group(strategy=...)`).
    pub fn ray_name(self) -> &'static str {
        match self {
            Strategy::StrictPack => "STRICT_PACK",
            Strategy::Pack => "PACK",
            Strategy::StrictSpread => "STRICT_SPREAD",
            Strategy::Spread => "SPREAD",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::StrictPack => "strict_pack",
            Strategy::Pack => "pack",
            Strategy::StrictSpread => "strict_spread",
            Strategy::Spread => "spread",
        }
    }
}

/// One group of `placement:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementGroup {
    /// The roles whose processes the group holds, each process one bundle.
    pub roles: Vec<Role>,
    pub strategy: Strategy,
}

impl PlacementGroup {
    /// `actor+critic`: how events and errors name the group.
    pub fn name(&self) -> String {
        self.roles
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join("+")
    }
}

impl JobSpec {
    /// The placement group `role` is in, with its position in `placement:`.
    pub fn placement_of(&self, role: Role) -> Option<(usize, &PlacementGroup)> {
        self.placement
            .iter()
            .enumerate()
            .find(|(_, g)| g.roles.contains(&role))
    }

    /// The processes a group starts with, in bundle order: each role in the group's order, its
    /// indices 0.. up to its replicas (its `min` when it gives none).
    pub fn bundles(&self, group: &PlacementGroup) -> Vec<(Role, u32)> {
        group
            .roles
            .iter()
            .flat_map(|role| {
                let n = self.role_plan(*role).map_or(0, |p| p.replicas);
                (0..n).map(move |i| (*role, i))
            })
            .collect()
    }

    /// `placement:`'s checks: known roles, each in one group at most.
    pub(super) fn validate_placement(&self) -> Result<(), SpecError> {
        if self.placement.len() > MAX_GROUPS {
            return Err(SpecError::new(
                "placement",
                format!(
                    "has {} groups, more than the {MAX_GROUPS} a job may have",
                    self.placement.len()
                ),
            ));
        }
        let mut seen: Vec<Role> = Vec::new();
        for (i, g) in self.placement.iter().enumerate() {
            let p = |f: &str| format!("placement[{i}].{f}");
            if g.roles.is_empty() {
                return Err(SpecError::new(
                    p("roles"),
                    "is empty: name the roles to place",
                ));
            }
            for role in &g.roles {
                if !self.roles.contains_key(role) {
                    return Err(SpecError::new(
                        p("roles"),
                        format!(
                            "names {role}, which is not a role of the job (its roles: {})",
                            self.roles
                                .keys()
                                .map(|r| r.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
                if seen.contains(role) {
                    return Err(SpecError::new(
                        p("roles"),
                        format!("names {role}, which an earlier group places already"),
                    ));
                }
                seen.push(*role);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> Result<JobSpec, String> {
        let yaml = format!(
            "name: j\nkind: allreduce\nroles:\n  worker: {{ replicas: 2 }}\n  \
             critic: {{ replicas: 1, topology: single, command: [/bin/true] }}\n  \
             rollout: {{ replicas: 2, min: 1, max: 4, topology: service, command: [/bin/true] }}\n\
             workload: {{ builtin: {{}} }}\ndata: {{ num_samples: 10, shard_size: 1 }}\n\
             checkpoint: {{ dir: /tmp/x }}\n{extra}"
        );
        let s = JobSpec::from_yaml(&yaml).map_err(|e| e.to_string())?;
        s.validate().map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn a_group_holds_one_bundle_per_process_in_role_order() {
        let s =
            spec("placement:\n  - { roles: [critic, worker], strategy: strict_pack }\n").unwrap();
        let (i, g) = s.placement_of(Role::WORKER).unwrap();
        assert_eq!((i, g.strategy.ray_name()), (0, "STRICT_PACK"));
        let critic: Role = "critic".parse().unwrap();
        assert_eq!(
            s.bundles(g),
            vec![(critic, 0), (Role::WORKER, 0), (Role::WORKER, 1)]
        );
        assert_eq!(g.name(), "critic+worker");
        assert!(s.placement_of("rollout".parse().unwrap()).is_none());
    }

    #[test]
    fn bad_groups_are_refused_with_the_field() {
        for (extra, says) in [
            (
                "placement:\n  - { roles: [nope], strategy: pack }\n",
                "placement[0].roles: names nope, which is not a role of the job",
            ),
            (
                "placement:\n  - { roles: [], strategy: pack }\n",
                "placement[0].roles: is empty",
            ),
            (
                "placement:\n  - { roles: [worker], strategy: pack }\n  - { roles: [critic, worker], strategy: spread }\n",
                "placement[1].roles: names worker, which an earlier group places already",
            ),
            (
                "placement:\n  - { roles: [worker], strategy: sideways }\n",
                "unknown variant `sideways`",
            ),
        ] {
            let e = spec(extra).unwrap_err();
            assert!(e.contains(says), "{extra}: {e}");
        }
    }
}
