//! A service role that bounds its job grows ([`grow_one`]): by its callers' wait, within its
//! `max` and the room the round leaves, each new process whole on a node where the platform
//! reports the nodes' room ([`on_nodes`]), else on the GPUs the round leaves.

use super::super::Decision;
use super::{LiveJob, LiveRole, Room, target};

/// Where the roles' new processes go besides the pool: the nodes' free room (where the
/// platform reports it), else, for processes with GPUs, the GPUs the round leaves.
pub struct Places<'a> {
    pub free: Option<&'a mut super::super::nodes::Free>,
    pub gpus_left: &'a mut [super::super::LiveNode],
}

/// A role its callers wait for (`wait` of their time) up to `⌈n / (1 − wait)⌉` processes,
/// within its max and `room` (taken from it); or the reason it stays. False when it stays for
/// lack of room.
pub(super) fn grow_one(
    (job, role): (&LiveJob, &LiveRole),
    model: Option<&str>,
    wait: f64,
    room: &mut Room,
    on: &mut Places,
    d: &mut Decision,
) -> bool {
    let rate = role.rate.unwrap_or_default();
    let figures = format!(
        "its callers wait {:.0}% of their time for it, busy {:.0}% ({:.1} calls/s)",
        wait * 100.0,
        rate.busy_share * 100.0,
        rate.served_per_s
    );
    if role.count >= role.max {
        d.reasons.push(format!(
            "{}: {figures}, but it is at its max of {}",
            role.role, role.max
        ));
        return true;
    }
    let want = target(role, wait);
    let by_cpu = room
        .cpu_millicores
        .checked_div(role.millicores)
        .unwrap_or(u64::MAX)
        .min(u32::MAX as u64) as u32;
    let by_memory = room
        .memory_bytes
        .checked_div(role.memory_bytes)
        .unwrap_or(u64::MAX)
        .min(u32::MAX as u64) as u32;
    let pooled = (want - role.count)
        .min(by_cpu)
        .min(by_memory)
        .min(room.processes);
    // Each process whole on one node, where the platform reports them; else, a process with
    // GPUs on the GPUs the round leaves.
    let more = match on.free.as_deref_mut() {
        Some(f) if pooled > 0 => match on_nodes((job, role), model, pooled, f) {
            Ok(on_nodes) => {
                let more = on_nodes.len() as u32;
                d.nodes.insert(role.role, on_nodes);
                more
            }
            Err(why) => {
                d.reasons.push(format!("{}: {figures}; {why}", role.role));
                return false;
            }
        },
        None if !role.gpus.is_zero() && pooled > 0 => {
            let fit = super::super::gpu_place::place_up_to(on.gpus_left, role.gpus, pooled, model);
            if fit == 0 {
                d.reasons.push(format!(
                    "{}: {figures}; no GPUs left for another process of {} GPUs",
                    role.role, role.gpus
                ));
                return false;
            }
            fit
        }
        _ => pooled,
    };
    if more == 0 {
        let mut asks = format!("{} m", role.millicores);
        if by_memory == 0 {
            asks.push_str(&format!(
                " and {} of memory ({} left)",
                super::super::hold::memory_shown(role.memory_bytes),
                super::super::hold::memory_shown(room.memory_bytes)
            ));
        }
        d.reasons.push(format!(
            "{}: {figures}; no room left for another process of {asks}",
            role.role
        ));
        return false;
    }
    let to = role.count + more;
    room.cpu_millicores -= more as u64 * role.millicores;
    room.processes -= more;
    room.memory_bytes -= more as u64 * role.memory_bytes;
    d.resize(role.role, role.count, to);
    d.reasons.push(format!(
        "{}: {} -> {to}: it bounds the job: {figures}{}{}",
        role.role,
        role.count,
        match (more < pooled, role.gpus.is_zero()) {
            (false, _) => "",
            (true, true) => ", as many as the nodes' free room holds",
            (true, false) => ", as many as the free GPUs hold",
        },
        match role.sizing {
            super::RoleSizing::Grows => {
                " (an all-reduce group: its processes restart to form it at its new size)"
            }
            _ => "",
        }
    ));
    true
}

/// Up to `pooled` more processes of `job`'s `role` placed on the nodes' free room `f`, each
/// whole on one node: beside its index's partners where it shares their devices, beside its
/// placement group by the group's strategy, beside worker `k` where it shares the workers'
/// devices, else on the freest. The nodes they went to, or why none fits.
fn on_nodes(
    (job, role): (&LiveJob, &LiveRole),
    model: Option<&str>,
    pooled: u32,
    f: &mut super::super::nodes::Free,
) -> Result<Vec<String>, String> {
    let p = f.process(role.millicores, role.memory_bytes, role.gpus, model);
    let group = job.groups.iter().find(|g| g.roles.contains(&role.role));
    let on_nodes = match group {
        // Each beside its index's partners where it shares their devices.
        Some(g) if g.share_devices => f.take_sharing(job, (g, role), pooled, p),
        // Each beside its placement group's processes, by the group's strategy.
        Some(_) => f.take_in_group(job, role.role, pooled, p),
        None => {
            // A role beside the workers: its process `k` goes to worker `k`'s node.
            let partners = match role.beside_workers {
                true => super::super::nodes::worker_nodes(job),
                false => Vec::new(),
            };
            let node = |k: u32| {
                let at = partners
                    .get((role.count + k) as usize)
                    .filter(|n| !n.is_empty());
                at.and_then(|n| f.node(n))
            };
            let nodes: Vec<Option<usize>> = (0..pooled).map(node).collect();
            f.take_in_order(pooled, p, |k| nodes[k as usize])
        }
    };
    if !on_nodes.is_empty() {
        return Ok(on_nodes);
    }
    let what = match group {
        Some(g) => format!("in its placement group {}", g.shown()),
        None => format!("of {}", super::super::nodes::shown(&p, f)),
    };
    Err(format!(
        "no node has room for another process {what} ({})",
        f.freest_shown()
    ))
}
