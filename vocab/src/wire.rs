//! One conversion per wire type (feature `wire`): the job master's gRPC messages
//! (`proto::jobmaster::v1`, and the devices the brain tells a job master of in
//! `proto::service::v1`) to and from the vocabulary. What the wire cannot say is an error
//! naming the field, never a default.

use proto::jobmaster::v1 as pb;
use proto::service::v1 as spb;

use crate::devices::DeviceUse;
use crate::plan::{Migration, RoleTarget, ScalePlan};
use crate::role::{Role, SlotKey};
use crate::spec::{PlacementGroup, Resources};
use crate::units::{Bytes, Gpus, Millicores};

/// A wire message that does not make a valid value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct WireError(pub String);

/// The role a wire message names (a role group's name, e.g. `"worker"`).
pub fn role(name: &str) -> Result<Role, WireError> {
    Role::new(name).map_err(WireError)
}

/// Zero means "not given" on the wire (proto3 has no absent scalars). The wire carries no
/// custom resources.
impl From<pb::Resources> for Resources {
    fn from(r: pb::Resources) -> Self {
        Resources {
            cpu: (r.cpu_millicores > 0).then_some(Millicores(r.cpu_millicores)),
            memory: (r.memory_bytes > 0).then_some(Bytes(r.memory_bytes)),
            gpu: (r.gpu_milli > 0).then_some(Gpus::from_milli(r.gpu_milli)),
            gpu_type: (!r.gpu_type.is_empty()).then_some(r.gpu_type),
            custom: Default::default(),
        }
    }
}

impl From<&Resources> for pb::Resources {
    fn from(r: &Resources) -> Self {
        pb::Resources {
            cpu_millicores: r.cpu.map_or(0, |c| c.0),
            memory_bytes: r.memory.map_or(0, |m| m.0),
            gpu_milli: r.gpu.map_or(0, Gpus::milli),
            gpu_type: r.gpu_type.clone().unwrap_or_default(),
        }
    }
}

impl TryFrom<pb::ScalePlan> for ScalePlan {
    type Error = WireError;
    fn try_from(p: pb::ScalePlan) -> Result<Self, WireError> {
        let mut plan = ScalePlan {
            version: p.version,
            ..Default::default()
        };
        for t in p.roles {
            let role = role(&t.role)?;
            let target = RoleTarget {
                count: t.count,
                resources: t.resources.map(Resources::from),
                nodes: t.nodes,
            };
            if plan.roles.insert(role, target).is_some() {
                return Err(WireError(format!("role {role} is named twice")));
            }
        }
        for m in p.migrations {
            plan.migrations.push(Migration {
                key: SlotKey {
                    role: role(&m.role)?,
                    index: m.index,
                },
                resources: m.resources.unwrap_or_default().into(),
                reason: m.reason,
            });
        }
        Ok(plan)
    }
}

impl From<&ScalePlan> for pb::ScalePlan {
    fn from(p: &ScalePlan) -> Self {
        pb::ScalePlan {
            version: p.version,
            roles: p
                .roles
                .iter()
                .map(|(&role, t)| pb::RoleTarget {
                    role: role.to_string(),
                    count: t.count,
                    resources: t.resources.as_ref().map(pb::Resources::from),
                    nodes: t.nodes.clone(),
                })
                .collect(),
            migrations: p.migrations.iter().map(pb::Migration::from).collect(),
        }
    }
}

impl From<&Migration> for pb::Migration {
    fn from(m: &Migration) -> Self {
        pb::Migration {
            role: m.key.role.to_string(),
            index: m.key.index,
            resources: Some((&m.resources).into()),
            reason: m.reason.clone(),
        }
    }
}

/// A placement group on the brain's wire (`JobShape.placement`).
impl From<&PlacementGroup> for spb::PlacementShape {
    fn from(g: &PlacementGroup) -> Self {
        spb::PlacementShape {
            roles: g.roles.iter().map(|r| r.to_string()).collect(),
            strategy: g.strategy.as_str().into(),
            share_devices: g.share_devices,
        }
    }
}

/// The placement group a `JobShape.placement` entry names; a role or strategy that does not
/// parse is an error.
pub fn placement(g: spb::PlacementShape) -> Result<PlacementGroup, WireError> {
    Ok(PlacementGroup {
        roles: g.roles.iter().map(|r| role(r)).collect::<Result<_, _>>()?,
        strategy: g.strategy.parse().map_err(WireError)?,
        share_devices: g.share_devices,
    })
}

/// A [`DeviceUse`] on the brain's wire (`GetPlanResponse.other_jobs_devices`).
impl From<&DeviceUse> for Vec<spb::NodeDevices> {
    fn from(u: &DeviceUse) -> Self {
        u.0.iter()
            .map(|(node, held)| spb::NodeDevices {
                node: node.clone(),
                held_milli: held.iter().map(|(d, &h)| (d.clone(), h)).collect(),
            })
            .collect()
    }
}

impl From<Vec<spb::NodeDevices>> for DeviceUse {
    fn from(nodes: Vec<spb::NodeDevices>) -> Self {
        let mut u = DeviceUse::default();
        for n in nodes.into_iter().filter(|n| !n.node.is_empty()) {
            let node = u.0.entry(n.node).or_default();
            for (d, h) in n.held_milli {
                let held = node.entry(d).or_default();
                *held = (*held + h).min(1000);
            }
        }
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_use_survives_the_wire() {
        let mut u = DeviceUse::default();
        u.add("10.0.0.2", "0", Gpus::from_milli(700));
        u.add("10.0.0.2", "1", Gpus::from_milli(300));
        u.add("10.0.0.3", "0,1", Gpus::from_milli(2000));
        let wire: Vec<spb::NodeDevices> = (&u).into();
        assert_eq!(wire.len(), 2);
        assert_eq!(DeviceUse::from(wire), u);
        // A node without a name counts nothing; a share over a device counts a whole one.
        let odd = vec![
            spb::NodeDevices {
                node: String::new(),
                held_milli: [("0".to_string(), 500)].into(),
            },
            spb::NodeDevices {
                node: "n".into(),
                held_milli: [("0".to_string(), 4000)].into(),
            },
        ];
        let back = DeviceUse::from(odd);
        assert_eq!(back.0.len(), 1);
        assert_eq!(back.on("n").unwrap()["0"], 1000);
    }

    #[test]
    fn a_plan_survives_the_wire_and_a_bad_one_is_refused() {
        let mut plan = ScalePlan::count(3, Role::WORKER, 4);
        plan.roles.get_mut(&Role::WORKER).unwrap().resources = Some(Resources {
            cpu: Some(Millicores(1500)),
            memory: Some(Bytes(1 << 30)),
            ..Default::default()
        });
        plan.set_count(Role::PS, 2);
        // Where the sender placed the PS it adds.
        plan.roles.get_mut(&Role::PS).unwrap().nodes = vec!["10.0.0.2".into(), "10.0.0.3".into()];
        plan.migrations.push(Migration {
            key: SlotKey {
                role: Role::PS,
                index: 1,
            },
            resources: Resources {
                cpu: Some(Millicores(2000)),
                ..Default::default()
            },
            reason: "hot ps".into(),
        });
        let wire = pb::ScalePlan::from(&plan);
        let ps = wire.roles.iter().find(|t| t.role == "ps").unwrap();
        assert_eq!(ps.nodes, ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(ScalePlan::try_from(wire.clone()), Ok(plan));
        let mut twice = wire.clone();
        twice.roles.push(twice.roles[0].clone());
        assert!(
            ScalePlan::try_from(twice)
                .unwrap_err()
                .0
                .contains("named twice")
        );
        let mut bad = wire;
        bad.roles[0].role = "Rollout Engine".into();
        let e = ScalePlan::try_from(bad).unwrap_err().0;
        assert!(e.starts_with("role name"), "{e}");
    }
}
