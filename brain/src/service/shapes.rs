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

pub(super) fn shape_from(s: pb::JobShape) -> Result<Shape, BrainError> {
    if s.kind == "ps" && !matches!(s.training_role.as_str(), "" | "worker") {
        return Err(BrainError::InvalidArgument(format!(
            "job shape: training_role {:?}: a ps job's training group is its `worker` role",
            s.training_role
        )));
    }
    let gpu_type = s
        .worker_resources
        .as_ref()
        .map(|r| r.gpu_type.clone())
        .filter(|t| !t.is_empty());
    let (worker_millicores, worker_memory_bytes, worker_gpus) = resources(s.worker_resources);
    let (ps_millicores, ps_memory_bytes, _) = resources(s.ps_resources);
    Ok(Shape {
        kind: s
            .kind
            .parse()
            .map_err(|e| BrainError::InvalidArgument(format!("job shape: {e}")))?,
        workers: s.workers,
        min_workers: s.min_workers,
        max_workers: s.max_workers,
        node_unit: s.worker_node_unit,
        ps: s.ps,
        min_ps: s.min_ps,
        max_ps: s.max_ps,
        worker_millicores,
        worker_memory_bytes,
        worker_gpus,
        gpu_type,
        ps_millicores,
        ps_memory_bytes,
        total_samples: s.total_samples,
        services: s
            .services
            .into_iter()
            .map(|r| {
                let role = vocab::wire::role(&r.role)
                    .map_err(|e| BrainError::InvalidArgument(format!("job shape: {e}")))?;
                let (millicores, memory_bytes, gpus) = resources(r.resources);
                let shape = ServiceShape {
                    topology: r.topology,
                    count: r.count,
                    min: r.min,
                    max: r.max,
                    millicores,
                    memory_bytes,
                    gpus,
                    shares_worker_devices: r.shares_worker_devices,
                };
                Ok((role, shape))
            })
            .collect::<Result<_, BrainError>>()?,
        worker_bundle_gpus: (s.worker_bundle_gpu_milli > 0)
            .then(|| vocab::Gpus::from_milli(s.worker_bundle_gpu_milli)),
        training_role: match s.training_role.as_str() {
            "" => None,
            name => Some(vocab::wire::role(name).map_err(|e| {
                BrainError::InvalidArgument(format!("job shape: training_role: {}", e.0))
            })?)
            .filter(|&r| r != vocab::Role::WORKER),
        },
    })
}

pub(super) fn shape_to(s: Shape) -> pb::JobShape {
    pb::JobShape {
        kind: s.kind.to_string(),
        training_role: s.trainer().to_string(),
        workers: s.workers,
        min_workers: s.min_workers,
        max_workers: s.max_workers,
        worker_node_unit: s.node_unit,
        ps: s.ps,
        min_ps: s.min_ps,
        max_ps: s.max_ps,
        worker_resources: Some(jm::Resources {
            cpu_millicores: s.worker_millicores,
            memory_bytes: s.worker_memory_bytes,
            gpu_milli: s.worker_gpus.milli(),
            gpu_type: s.gpu_type.clone().unwrap_or_default(),
        }),
        ps_resources: Some(jm::Resources {
            cpu_millicores: s.ps_millicores,
            memory_bytes: s.ps_memory_bytes,
            gpu_milli: 0,
            gpu_type: String::new(),
        }),
        total_samples: s.total_samples,
        services: s
            .services
            .iter()
            .map(|(role, r)| pb::RoleShape {
                role: role.to_string(),
                topology: r.topology.clone(),
                count: r.count,
                min: r.min,
                max: r.max,
                resources: Some(jm::Resources {
                    cpu_millicores: r.millicores,
                    memory_bytes: r.memory_bytes,
                    gpu_milli: r.gpus.milli(),
                    gpu_type: String::new(),
                }),
                shares_worker_devices: r.shares_worker_devices,
            })
            .collect(),
        worker_bundle_gpu_milli: s.worker_bundle_gpus.map_or(0, vocab::Gpus::milli),
    }
}
