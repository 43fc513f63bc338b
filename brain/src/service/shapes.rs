//! The brain's job shapes and node states on the wire, to and from the store's.

use proto::jobmaster::v1 as jm;
use proto::service::v1 as pb;

use crate::BrainError;
use crate::store::{ServiceShape, Shape};

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

/// The store's shape of a job from the wire's role groups: its one training group (`training`)
/// sized by its speed, a ps job's parameter servers (role `ps`), its other roles as they are.
pub(super) fn shape_from(s: pb::JobShape) -> Result<Shape, BrainError> {
    let bad = |why: String| BrainError::InvalidArgument(format!("job shape: {why}"));
    let kind = s
        .kind
        .parse::<vocab::JobKind>()
        .map_err(|e| bad(e.to_string()))?;
    let mut seen = std::collections::BTreeSet::new();
    let mut training: Option<pb::RoleShape> = None;
    let mut ps: Option<pb::RoleShape> = None;
    let mut services = std::collections::BTreeMap::new();
    for r in s.roles {
        let role = vocab::wire::role(&r.role).map_err(|e| bad(e.0))?;
        if !seen.insert(role) {
            return Err(bad(format!("role {role} is named twice")));
        }
        if r.training {
            if let Some(t) = &training {
                return Err(bad(format!(
                    "two training groups, {} and {role}: a job has one",
                    t.role
                )));
            }
            if kind == vocab::JobKind::Ps && role != vocab::Role::WORKER {
                return Err(bad(format!(
                    "training group {role:?}: a ps job's training group is its `worker` role"
                )));
            }
            training = Some(r);
        } else if kind == vocab::JobKind::Ps && role == vocab::Role::PS {
            ps = Some(r);
        } else {
            let gpu_type = model_of(&r.resources);
            let (millicores, memory_bytes, gpus) = resources(r.resources);
            let shape = ServiceShape {
                topology: r.topology,
                count: r.count,
                min: r.min,
                max: r.max,
                millicores,
                memory_bytes,
                gpus,
                gpu_type,
                shares_worker_devices: r.shares_worker_devices,
            };
            services.insert(role, shape);
        }
    }
    let t = training.ok_or_else(|| {
        bad(
            "no training group: one role must have `training` set (the group the brain sizes)"
                .into(),
        )
    })?;
    let trainer = vocab::wire::role(&t.role).map_err(|e| bad(e.0))?;
    let gpu_type = model_of(&t.resources);
    let (worker_millicores, worker_memory_bytes, worker_gpus) = resources(t.resources);
    let ps = ps.unwrap_or_default();
    let (ps_millicores, ps_memory_bytes, _) = resources(ps.resources);
    Ok(Shape {
        kind,
        workers: t.count,
        min_workers: t.min,
        max_workers: t.max,
        node_unit: t.node_unit,
        ps: ps.count,
        min_ps: ps.min,
        max_ps: ps.max,
        worker_millicores,
        worker_memory_bytes,
        worker_gpus,
        gpu_type,
        ps_millicores,
        ps_memory_bytes,
        total_samples: s.total_samples,
        services,
        worker_bundle_gpus: (t.bundle_gpu_milli > 0)
            .then(|| vocab::Gpus::from_milli(t.bundle_gpu_milli)),
        training_role: Some(trainer).filter(|&r| r != vocab::Role::WORKER),
        placement: s
            .placement
            .into_iter()
            .map(|g| vocab::wire::placement(g).map_err(|e| bad(e.0)))
            .collect::<Result<_, _>>()?,
    })
}

/// The GPU model a role's resources on the wire ask for (none: empty, any).
fn model_of(r: &Option<jm::Resources>) -> Option<String> {
    r.as_ref()
        .map(|r| r.gpu_type.clone())
        .filter(|t| !t.is_empty())
}

/// The wire's role groups of the store's shape: the training group first, then a ps job's
/// parameter servers, then the other roles.
pub(super) fn shape_to(s: Shape) -> pb::JobShape {
    let res = |cpu_millicores, memory_bytes, gpus: vocab::Gpus, gpu_type: &Option<String>| {
        Some(jm::Resources {
            cpu_millicores,
            memory_bytes,
            gpu_milli: gpus.milli(),
            gpu_type: gpu_type.clone().unwrap_or_default(),
        })
    };
    let trainer = s.trainer();
    let mut roles = vec![pb::RoleShape {
        role: trainer.to_string(),
        topology: match s.kind {
            vocab::JobKind::Ps => "ps",
            vocab::JobKind::Allreduce => "allreduce",
        }
        .into(),
        count: s.workers,
        min: s.min_workers,
        max: s.max_workers,
        resources: res(
            s.worker_millicores,
            s.worker_memory_bytes,
            s.worker_gpus,
            &s.gpu_type,
        ),
        training: true,
        node_unit: s.node_unit,
        bundle_gpu_milli: s.worker_bundle_gpus.map_or(0, vocab::Gpus::milli),
        ..Default::default()
    }];
    if s.kind == vocab::JobKind::Ps {
        roles.push(pb::RoleShape {
            role: vocab::Role::PS.to_string(),
            topology: "ps".into(),
            count: s.ps,
            min: s.min_ps,
            max: s.max_ps,
            resources: res(s.ps_millicores, s.ps_memory_bytes, vocab::Gpus::ZERO, &None),
            ..Default::default()
        });
    }
    roles.extend(s.services.iter().map(|(role, r)| pb::RoleShape {
        role: role.to_string(),
        topology: r.topology.clone(),
        count: r.count,
        min: r.min,
        max: r.max,
        resources: res(r.millicores, r.memory_bytes, r.gpus, &r.gpu_type),
        shares_worker_devices: r.shares_worker_devices,
        ..Default::default()
    }));
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
        Shape {
            kind: vocab::JobKind::Ps,
            workers: 3,
            min_workers: 1,
            max_workers: 8,
            node_unit: 1,
            ps: 2,
            min_ps: 1,
            max_ps: 4,
            worker_millicores: 2000,
            worker_memory_bytes: 1 << 30,
            worker_gpus: vocab::Gpus::from_milli(500),
            gpu_type: Some("V100".into()),
            ps_millicores: 1500,
            ps_memory_bytes: 1 << 29,
            total_samples: 10_000,
            services: [(
                rollout,
                ServiceShape {
                    topology: "service".into(),
                    count: 2,
                    min: 1,
                    max: 4,
                    millicores: 500,
                    memory_bytes: 1 << 28,
                    gpus: vocab::Gpus::from_milli(400),
                    gpu_type: Some("V100".into()),
                    shares_worker_devices: true,
                },
            )]
            .into(),
            worker_bundle_gpus: Some(vocab::Gpus::from_milli(900)),
            training_role: None,
            placement: vec![vocab::spec::PlacementGroup {
                roles: vec![vocab::Role::WORKER, rollout],
                strategy: vocab::spec::Strategy::StrictPack,
                share_devices: true,
            }],
        }
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
        let actor = Shape {
            kind: vocab::JobKind::Allreduce,
            ps: 0,
            min_ps: 0,
            max_ps: 0,
            ps_millicores: 0,
            ps_memory_bytes: 0,
            training_role: Some(vocab::Role::new("actor").unwrap()),
            ..ps_job()
        };
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
