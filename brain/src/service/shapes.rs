//! The brain's job shapes and node states on the wire, to and from the store's.

use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;

use crate::BrainError;
use crate::store::{RoleShape, Shape};
use vocab::spec::Topology;

pub(super) fn resources(r: Option<jm::Resources>) -> (u64, u64, vocab::Gpus) {
    r.map_or((0, 0, vocab::Gpus::ZERO), |r| {
        (
            r.cpu_millicores,
            r.memory_bytes,
            vocab::Gpus::from_milli(r.gpu_milli),
        )
    })
}

pub(super) fn node_state(n: &crate::control::NodeState) -> pb::NodeState {
    let c = n.cordon.as_ref();
    pb::NodeState {
        name: n.node.name.clone(),
        cpu_millicores: n.node.cpu_millicores,
        gpus: n.node.gpus,
        gpu_type: n.node.gpu_type.clone(),
        state: match (c.is_some(), n.stragglers.is_empty()) {
            (true, _) => "cordoned",
            (false, false) => "straggler",
            (false, true) => "ok",
        }
        .into(),
        reason: c.map(|c| c.reason.clone()).unwrap_or_default(),
        since_unix_ms: c.map_or(0, |c| c.since_unix_ms),
        until_unix_ms: c.and_then(|c| c.until_unix_ms).unwrap_or(0),
        stragglers: n.stragglers.clone(),
    }
}

/// The store's shape of a job from the wire's role groups: one of them its training group
/// (`training`, the group the brain sizes by its speed), each named once.
pub(super) fn shape_from(s: pb::JobShape) -> Result<Shape, BrainError> {
    let bad = |why: String| BrainError::InvalidArgument(format!("job shape: {why}"));
    let kind = s
        .kind
        .parse::<vocab::JobKind>()
        .map_err(|e| bad(e.to_string()))?;
    let mut roles = std::collections::BTreeMap::new();
    let mut training: Option<vocab::Role> = None;
    for r in s.roles {
        let role = vocab::wire::role(&r.role).map_err(|e| bad(e.0))?;
        if r.training {
            if let Some(t) = training {
                return Err(bad(format!(
                    "two training groups, {t} and {role}: a job has one"
                )));
            }
            training = Some(role);
        }
        let topology = r
            .topology
            .parse::<Topology>()
            .map_err(|e| bad(format!("role {role}: {e}")))?;
        let gpu_type = model_of(&r.resources);
        let (millicores, memory_bytes, gpus) = resources(r.resources);
        let shape = RoleShape {
            topology,
            count: r.count,
            min: r.min,
            max: r.max,
            node_unit: if r.training { r.node_unit } else { 1 },
            millicores,
            memory_bytes,
            gpus,
            gpu_type,
            bundle_gpus: (r.bundle_gpu_milli > 0)
                .then(|| vocab::Gpus::from_milli(r.bundle_gpu_milli)),
            shares_worker_devices: r.shares_worker_devices,
        };
        if roles.insert(role, shape).is_some() {
            return Err(bad(format!("role {role} is named twice")));
        }
    }
    let training = training.ok_or_else(|| {
        bad(
            "no training group: one role must have `training` set (the group the brain sizes)"
                .into(),
        )
    })?;
    let shape = Shape {
        kind,
        total_samples: s.total_samples,
        training,
        roles,
        placement: s
            .placement
            .into_iter()
            .map(|g| vocab::wire::placement(g).map_err(|e| bad(e.0)))
            .collect::<Result<_, _>>()?,
    };
    shape.validate().map_err(bad)?;
    Ok(shape)
}

/// The GPU model a role's resources on the wire ask for (none: empty, any).
fn model_of(r: &Option<jm::Resources>) -> Option<String> {
    r.as_ref()
        .map(|r| r.gpu_type.clone())
        .filter(|t| !t.is_empty())
}

/// The wire's role groups of the store's shape: the training group first, then the others
/// by name.
pub(super) fn shape_to(s: Shape) -> pb::JobShape {
    let wire = |role: vocab::Role, r: &RoleShape| pb::RoleShape {
        role: role.to_string(),
        topology: r.topology.to_string(),
        count: r.count,
        min: r.min,
        max: r.max,
        resources: Some(jm::Resources {
            cpu_millicores: r.millicores,
            memory_bytes: r.memory_bytes,
            gpu_milli: r.gpus.milli(),
            gpu_type: r.gpu_type.clone().unwrap_or_default(),
        }),
        training: role == s.training,
        node_unit: if role == s.training { r.node_unit } else { 0 },
        bundle_gpu_milli: r.bundle_gpus.map_or(0, vocab::Gpus::milli),
        shares_worker_devices: r.shares_worker_devices,
    };
    let trainer = s.training;
    let mut roles = vec![wire(trainer, s.training_group())];
    roles.extend(
        s.roles
            .iter()
            .filter(|(r, _)| **r != trainer)
            .map(|(r, g)| wire(*r, g)),
    );
    pb::JobShape {
        kind: s.kind.to_string(),
        total_samples: s.total_samples,
        roles,
        placement: s.placement.iter().map(pb::PlacementShape::from).collect(),
    }
}

/// A dry run's decision role by role, on the wire: each group's count now and from now on
/// ([`optimizer::live::Decision::role_changes`]), and the nodes the plan that carries it out
/// names for the processes it adds.
pub(super) fn role_changes(
    d: &optimizer::live::Decision,
    trainer: vocab::Role,
) -> Vec<pb::RoleChange> {
    let plan = d.scale_plan(0, trainer);
    d.role_changes(trainer)
        .iter()
        .map(|c| pb::RoleChange {
            role: c.role.to_string(),
            from: c.from,
            to: c.to,
            training: c.training,
            nodes: plan
                .roles
                .get(&c.role)
                .map_or_else(Vec::new, |t| t.nodes.clone()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decisions_role_changes_carry_the_nodes_of_what_they_add() {
        let rollout = vocab::Role::new("rollout").unwrap();
        let trainer = vocab::Role::new("trainer").unwrap();
        let mut d = optimizer::live::Decision::sizing(
            optimizer::units::JobId(1),
            "rl",
            optimizer::live::LiveState::Running,
            (2, 3),
            (0, 0),
        );
        d.resize(rollout, 1, 2);
        d.nodes = [
            (vocab::Role::WORKER, vec!["10.0.0.3".to_string()]),
            (rollout, vec!["10.0.0.2".to_string()]),
        ]
        .into();
        let changes = role_changes(&d, trainer);
        let shown: Vec<(&str, u32, u32, &[String])> = changes
            .iter()
            .map(|c| (c.role.as_str(), c.from, c.to, &c.nodes[..]))
            .collect();
        assert_eq!(
            shown,
            [
                ("trainer", 2, 3, &["10.0.0.3".to_string()][..]),
                ("rollout", 1, 2, &["10.0.0.2".to_string()][..])
            ]
        );
        assert!(changes[0].training && !changes[1].training);
    }

    fn ps_job() -> Shape {
        let rollout = vocab::Role::new("rollout").unwrap();
        let mut shape = Shape::new(
            vocab::JobKind::Ps,
            vocab::Role::WORKER,
            RoleShape {
                memory_bytes: 1 << 30,
                gpus: vocab::Gpus::from_milli(500),
                gpu_type: Some("V100".into()),
                bundle_gpus: Some(vocab::Gpus::from_milli(900)),
                ..RoleShape::sized(Topology::Ps, 3, (1, 8), 2000)
            },
            10_000,
        )
        .with(
            vocab::Role::PS,
            RoleShape {
                memory_bytes: 1 << 29,
                ..RoleShape::sized(Topology::Ps, 2, (1, 4), 1500)
            },
        )
        .with(
            rollout,
            RoleShape {
                memory_bytes: 1 << 28,
                gpus: vocab::Gpus::from_milli(400),
                gpu_type: Some("V100".into()),
                shares_worker_devices: true,
                ..RoleShape::sized(Topology::Service, 2, (1, 4), 500)
            },
        );
        shape.placement = vec![vocab::spec::PlacementGroup {
            roles: vec![vocab::Role::WORKER, rollout],
            strategy: vocab::spec::Strategy::StrictPack,
            share_devices: true,
        }];
        shape
    }

    #[test]
    fn a_shape_is_its_role_groups_on_the_wire_and_back() {
        let wire = shape_to(ps_job());
        let names: Vec<(&str, bool)> = wire
            .roles
            .iter()
            .map(|r| (r.role.as_str(), r.training))
            .collect();
        assert_eq!(names, [("worker", true), ("ps", false), ("rollout", false)]);
        assert_eq!(shape_from(wire).unwrap(), ps_job());
        // An all-reduce group named otherwise is the training group by its flag.
        let mut actor = ps_job();
        actor.kind = vocab::JobKind::Allreduce;
        actor.roles.remove(&vocab::Role::PS);
        let mut group = actor.roles.remove(&vocab::Role::WORKER).unwrap();
        group.topology = Topology::Allreduce;
        actor.training = vocab::Role::new("actor").unwrap();
        actor.roles.insert(actor.training, group);
        actor.placement[0].roles[0] = actor.training;
        let wire = shape_to(actor.clone());
        assert_eq!(wire.roles.len(), 2, "{wire:?}");
        assert_eq!(
            (wire.roles[0].role.as_str(), wire.roles[0].topology.as_str()),
            ("actor", "allreduce")
        );
        assert_eq!(shape_from(wire).unwrap(), actor);
    }

    #[test]
    fn a_shape_without_one_training_group_is_refused_with_why() {
        let refused = |f: &dyn Fn(&mut pb::JobShape)| {
            let mut wire = shape_to(ps_job());
            f(&mut wire);
            shape_from(wire).unwrap_err().to_string()
        };
        let e = refused(&|w| w.roles[0].training = false);
        assert!(e.contains("no training group"), "{e}");
        let e = refused(&|w| w.roles[2].training = true);
        assert!(e.contains("two training groups, worker and rollout"), "{e}");
        let e = refused(&|w| w.roles[2].role = "ps".into());
        assert!(e.contains("role ps is named twice"), "{e}");
        let e = refused(&|w| w.roles[0].role = "actor".into());
        assert!(
            e.contains("a ps job's training group is its `worker` role"),
            "{e}"
        );
        let e = refused(&|w| w.roles[2].topology = "replicas".into());
        assert!(
            e.contains("role rollout: topology \"replicas\": expected allreduce"),
            "{e}"
        );
        let e = refused(&|w| w.roles[1].role = "Bad Name".into());
        assert!(e.contains("job shape"), "{e}");
        let e = refused(&|w| w.placement[0].strategy = "packed".into());
        assert!(e.contains("unknown placement strategy \"packed\""), "{e}");
    }

    #[test]
    fn a_placement_group_of_roles_the_job_lacks_is_refused() {
        let mut shape = ps_job();
        assert_eq!(shape.validate(), Ok(()));
        shape.placement[0]
            .roles
            .push(vocab::Role::new("critic").unwrap());
        let e = shape.validate().unwrap_err();
        assert!(
            e.contains("placement group worker+rollout+critic: the job has no role critic"),
            "{e}"
        );
        let mut shape = ps_job();
        shape.placement.push(shape.placement[0].clone());
        let e = shape.validate().unwrap_err();
        assert!(e.contains("role worker is in two placement groups"), "{e}");
    }
}
