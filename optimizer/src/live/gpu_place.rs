//! Where a round's GPUs go, process by process: packing processes onto the free GPUs of a
//! model's nodes (the GPU round's `pack` and a starting job's roles), and what the round leaves.

use std::collections::BTreeMap;

use vocab::Gpus;

use super::{Decision, LiveJob, LiveNode};

/// The GPUs the round leaves on each of `nodes` once the GPU jobs' decisions are placed.
pub(super) fn left_after(nodes: &[LiveNode], decisions: &[(usize, Decision)]) -> Vec<LiveNode> {
    let mut left = nodes.to_vec();
    for (name, k) in decisions.iter().flat_map(|(_, d)| &d.gpu_placement) {
        if let Some(n) = left.iter_mut().find(|n| n.name == *name) {
            n.gpus = n.gpus.saturating_sub(*k);
        }
    }
    left
}

/// Places a starting CPU job's roles' processes that have GPUs of their own on the GPUs left
/// on `nodes` (of each role's GPU model, else the job's; any, when neither names one), each on the node with the
/// fewest left that holds it, and takes them off; whether all fit (`nodes` unchanged when
/// not).
pub(super) fn place_roles(job: &LiveJob, nodes: &mut [LiveNode]) -> bool {
    let mut left = nodes.to_vec();
    for r in job.roles.iter().filter(|r| !r.gpus.is_zero()) {
        if place_up_to(&mut left, r.gpus, r.count, r.model(job)) < r.count {
            return false;
        }
    }
    nodes.clone_from_slice(&left);
    true
}

/// Places up to `n` processes of `g` GPUs each on the GPUs left on `nodes` (of `model`; any,
/// when none), each (or each device its sharing processes pack onto) on the node with the
/// fewest left that holds it, and takes them off; how many it placed.
pub(super) fn place_up_to(nodes: &mut [LiveNode], g: Gpus, n: u32, model: Option<&str>) -> u32 {
    // A unit: one process's whole GPUs, or one GPU its sharing processes pack onto.
    let (unit, per_unit) = (g.devices(), g.per_device());
    let mut placed = 0;
    while placed < n {
        let Some(best) = (0..nodes.len())
            .filter(|&i| model.is_none_or(|m| m == nodes[i].gpu_type) && nodes[i].gpus >= unit)
            .min_by_key(|&i| (nodes[i].gpus, i))
        else {
            break;
        };
        nodes[best].gpus -= unit;
        placed = (placed + per_unit).min(n);
    }
    placed
}

/// `" and its roles' (rollout ×2 of 1 GPUs)"` for a job whose roles have GPUs of their own.
pub(super) fn roles_with_gpus(job: &LiveJob) -> String {
    let list: Vec<String> = job
        .roles
        .iter()
        .filter(|r| !r.gpus.is_zero())
        .map(|r| format!("{} ×{} of {} GPUs", r.role, r.count, r.gpus))
        .collect();
    if list.is_empty() {
        String::new()
    } else {
        format!(" and its roles' ({})", list.join(", "))
    }
}

/// Places up to `want` processes of `g` GPUs each on the free GPUs of the nodes of model `m`,
/// each (or each device its sharing processes pack onto) on the node with the fewest free
/// GPUs that holds it; how many it placed.
pub(super) fn place(
    free: &mut [u32],
    here: &mut BTreeMap<usize, u32>,
    nodes: &[LiveNode],
    model_of: &[usize],
    m: usize,
    g: Gpus,
    want: u32,
) -> u32 {
    // A unit: one process's whole GPUs, or one GPU its sharing processes pack onto.
    let (unit_gpus, per_unit) = (g.devices(), g.per_device());
    let mut placed = 0;
    while placed < want {
        let Some(best) = (0..nodes.len())
            .filter(|&n| model_of[n] == m && free[n] >= unit_gpus)
            .min_by_key(|&n| (free[n], n))
        else {
            break;
        };
        free[best] -= unit_gpus;
        *here.entry(best).or_default() += unit_gpus;
        placed = (placed + per_unit).min(want);
    }
    placed
}
