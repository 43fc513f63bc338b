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
//! A group may also share devices (`share_devices: true`): process `i` of each of its roles
//! runs on one GPU with process `i` of the others (the actor and the rollout engine of one
//! device, as colocated RL frameworks run them). Each such role asks for a share of a device
//! (`gpu: 0.5`) and the shares of the group's roles add up to at most one device; the group's
//! strategy then lays out one bundle per index, the processes of an index together.
//!
//! A group's roles may be resized: a process beyond the group's first ones is laid out beside
//! them as the strategy says (on a node of its own for `strict_spread`, on the group's node for
//! `strict_pack`), or waits with the reason when no node can take it.

use serde::{Deserialize, Serialize};

use super::JobSpec;
use crate::error::SpecError;
use crate::role::{Role, SlotKey};
use crate::units::Gpus;

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

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        use Strategy::*;
        [StrictPack, Pack, StrictSpread, Spread]
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown placement strategy {s:?}: strict_pack, pack, strict_spread or spread"
                )
            })
    }
}

/// One group of `placement:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementGroup {
    /// The roles whose processes the group holds, each process one bundle.
    pub roles: Vec<Role>,
    pub strategy: Strategy,
    /// Process `i` of each role shares one GPU with process `i` of the others.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_devices: bool,
}

/// Whom a process shares its device with, and the share the device must have free for all of
/// them (a `placement:` group with `share_devices`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceShare {
    /// The processes of the same index in the group's other roles.
    pub partners: Vec<SlotKey>,
    /// What the index's processes take of the device together.
    pub bundle: Gpus,
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

    /// The GPU share a role's processes ask for (none: zero).
    pub fn gpu_of(&self, role: Role) -> Gpus {
        self.roles
            .get(&role)
            .and_then(|r| r.resources.as_ref())
            .and_then(|r| r.gpu)
            .unwrap_or_default()
    }

    /// Whom `key`'s process shares its device with, when its role is in a group that shares
    /// devices.
    pub fn device_share(&self, key: SlotKey) -> Option<DeviceShare> {
        let (_, g) = self.placement_of(key.role)?;
        g.share_devices.then(|| DeviceShare {
            partners: g
                .roles
                .iter()
                .filter(|r| **r != key.role)
                .map(|&role| SlotKey {
                    role,
                    index: key.index,
                })
                .collect(),
            bundle: g.roles.iter().map(|r| self.gpu_of(*r)).sum(),
        })
    }

    /// What one device holds per worker index when the training group shares its devices with
    /// other roles (a `share_devices` group with the training role in it): the group's shares added up.
    /// The brain places workers by it.
    pub fn worker_bundle(&self) -> Option<Gpus> {
        self.device_share(SlotKey {
            role: self.training_role(),
            index: 0,
        })
        .map(|s| s.bundle)
    }

    /// Whether `role`'s processes share the training group's devices (their GPUs are counted
    /// in the workers' bundles).
    pub fn shares_worker_devices(&self, role: Role) -> bool {
        let trainer = self.training_role();
        role != trainer
            && self
                .placement_of(role)
                .is_some_and(|(_, g)| g.share_devices && g.roles.contains(&trainer))
    }

    /// `share_devices`: every role asks for a share below one device, of one model, and the
    /// shares add up to at most one.
    fn validate_shared_devices(&self, i: usize, g: &PlacementGroup) -> Result<(), SpecError> {
        let path = format!("placement[{i}].share_devices");
        for role in &g.roles {
            let share = self.gpu_of(*role);
            if !share.is_fraction() {
                return Err(SpecError::new(
                    &path,
                    format!(
                        "role {role} asks for gpu: {share}; processes share a device only with \
                         a share of one below 1 (e.g. gpu: 0.5)"
                    ),
                ));
            }
        }
        let total: Gpus = g.roles.iter().map(|r| self.gpu_of(*r)).sum();
        if total > Gpus::ONE {
            return Err(SpecError::new(
                &path,
                format!(
                    "the shares of {} add up to {total}, more than one device",
                    g.roles
                        .iter()
                        .map(|r| format!("{r} ({})", self.gpu_of(*r)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let model = |r: &Role| {
            self.roles[r]
                .resources
                .as_ref()
                .and_then(|x| x.gpu_type.clone())
        };
        if g.roles.iter().any(|r| model(r) != model(&g.roles[0])) {
            return Err(SpecError::new(
                &path,
                "its roles ask for different GPU models (gpu_type); one device has one model",
            ));
        }
        Ok(())
    }

    /// `placement:`'s checks: known roles, each in one group at most; shared devices as
    /// [`Self::validate_shared_devices`].
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
            if g.share_devices {
                self.validate_shared_devices(i, g)?;
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
    fn roles_share_devices_index_by_index_within_one_device() {
        let with = |gpus: (&str, &str), extra: &str| {
            let yaml = format!(
                "name: j\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, resources: {{ gpu: {} }} }}\n  \
                 rollout: {{ replicas: 3, topology: service, command: [/bin/true], resources: {{ gpu: {} }} }}\n\
                 workload: {{ builtin: {{}} }}\ndata: {{ num_samples: 10, shard_size: 1 }}\n\
                 checkpoint: {{ dir: /tmp/x }}\n\
                 placement:\n  - {{ roles: [worker, rollout], strategy: pack, share_devices: true }}\n{extra}",
                gpus.0, gpus.1
            );
            let s = JobSpec::from_yaml(&yaml).map_err(|e| e.to_string())?;
            s.validate().map_err(|e| e.to_string())?;
            Ok::<_, String>(s)
        };
        let s = with(("0.6", "0.4"), "").unwrap();
        let rollout: Role = "rollout".parse().unwrap();
        let share = s
            .device_share(SlotKey {
                role: rollout,
                index: 1,
            })
            .unwrap();
        assert_eq!(
            share.partners,
            vec![SlotKey {
                role: Role::WORKER,
                index: 1
            }]
        );
        assert_eq!(share.bundle, Gpus::ONE);
        assert_eq!(s.worker_bundle(), Some(Gpus::ONE));
        assert!(s.shares_worker_devices(rollout) && !s.shares_worker_devices(Role::WORKER));
        assert!(
            s.device_share(SlotKey {
                role: rollout,
                index: 0
            })
            .is_some()
        );
        let e = with(("0.6", "0.5"), "").unwrap_err();
        assert!(
            e.contains(
                "placement[0].share_devices: the shares of worker (0.6), rollout (0.5) add up \
                 to 1.1, more than one device"
            ),
            "{e}"
        );
        let e = with(("1", "0.5"), "").unwrap_err();
        assert!(
            e.contains("role worker asks for gpu: 1; processes share a device only"),
            "{e}"
        );
        // Written back as it was read.
        let yaml = serde_norway::to_string(&s).unwrap();
        assert!(yaml.contains("share_devices: true"), "{yaml}");
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
