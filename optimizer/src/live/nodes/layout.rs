//! How a job's new processes are laid out for placing (`nodes.rs`): a start's role
//! processes, a worker with the processes that share its device as one bundle, the roles of
//! each entry of those lists (to name where each process went), and where a growth's worker
//! must go beside its partner.

use super::super::room::Process;
use super::super::*;
use super::Free;
use vocab::Gpus;

/// The processes of a start's service and single roles (with the GPUs of their own, of each
/// role's GPU model, else `model`), which it places with its training group; not those that
/// share the workers' devices, which go with their partner worker ([`with_partners`]). The
/// processes of one index of a group that shares devices ([`LiveGroup::share_devices`]) are
/// one bundle, their CPU, memory and GPU shares added up, as the job master lays them out.
pub(in crate::live) fn roles_of(job: &LiveJob, model: Option<&str>, free: &Free) -> Vec<Process> {
    bundles(job)
        .into_iter()
        .map(|roles| {
            let of = |role: Role| job.roles.iter().find(|r| r.role == role);
            // The roles of a bundle share a device, of one model.
            let model = roles
                .iter()
                .filter_map(|&r| of(r)?.gpu_type.as_deref())
                .next()
                .or(model);
            let (cpu, memory, gpus) = roles
                .iter()
                .filter_map(|&r| of(r))
                .fold((0, 0, Gpus::ZERO), |(c, m, g), r| {
                    (c + r.millicores, m + r.memory_bytes, g + r.gpus)
                });
            free.process(cpu, memory, gpus, model)
        })
        .collect()
}

/// The roles of the processes [`roles_of`] lists, one entry each, in its order: one role, or
/// the roles of one index of a group that shares devices.
pub(in crate::live) fn roles_of_laid(job: &LiveJob) -> Vec<Vec<Role>> {
    bundles(job)
}

/// A start's processes of its service and single roles (not those beside the workers) as
/// the roles of each bundle: each process alone, but those of one index of a group that
/// shares devices together (the group's entries after the other roles', index by index).
fn bundles(job: &LiveJob) -> Vec<Vec<Role>> {
    let sharing = |role: Role| {
        job.groups
            .iter()
            .position(|g| g.share_devices && g.roles.contains(&role))
    };
    let own = job.roles.iter().filter(|r| !r.beside_workers);
    let mut out: Vec<Vec<Role>> = own
        .clone()
        .filter(|r| sharing(r.role).is_none())
        .flat_map(|r| std::iter::repeat_n(vec![r.role], r.count as usize))
        .collect();
    for g in job.groups.iter().filter(|g| g.share_devices) {
        let members: Vec<&LiveRole> = own.clone().filter(|r| g.roles.contains(&r.role)).collect();
        let n = members.iter().map(|r| r.count).max().unwrap_or(0);
        out.extend((0..n).map(|k| {
            members
                .iter()
                .filter(|r| r.count > k)
                .map(|r| r.role)
                .collect::<Vec<_>>()
        }));
    }
    out
}

/// A start's processes at `w` workers as the job master lays them out where roles share the
/// workers' devices ([`LiveRole::beside_workers`]): worker `k` with the process `k` of each
/// such role beside it, as one bundle on one node (`worker` is the worker with its device's
/// whole bundle of GPUs); the roles' processes past the last worker on their own, with their
/// CPU and memory.
pub(in crate::live) fn with_partners(job: &LiveJob, worker: Process, w: u32) -> Vec<Process> {
    let beside: Vec<&LiveRole> = job.roles.iter().filter(|r| r.beside_workers).collect();
    let mut out: Vec<Process> = (0..w)
        .map(|k| {
            beside
                .iter()
                .filter(|r| r.count > k)
                .fold(worker, |p, r| p.with(r.millicores, r.memory_bytes))
        })
        .collect();
    for r in &beside {
        let alone = Process {
            gpus: 0,
            cpu: r.millicores,
            memory: r.memory_bytes,
            model: None,
        };
        out.extend(std::iter::repeat_n(
            alone,
            r.count.saturating_sub(w) as usize,
        ));
    }
    out
}

/// The roles of each entry of [`with_partners`] at `w` workers, in its order: a worker with
/// the processes beside it, then those past the last worker.
pub(in crate::live) fn with_partners_laid(job: &LiveJob, w: u32) -> Vec<Vec<Role>> {
    let beside: Vec<&LiveRole> = job.roles.iter().filter(|r| r.beside_workers).collect();
    let mut out: Vec<Vec<Role>> = (0..w)
        .map(|k| {
            std::iter::once(Role::WORKER)
                .chain(beside.iter().filter(|r| r.count > k).map(|r| r.role))
                .collect()
        })
        .collect();
    for r in &beside {
        out.extend(std::iter::repeat_n(
            vec![r.role],
            r.count.saturating_sub(w) as usize,
        ));
    }
    out
}

/// Where a start's processes went, by role (the training group as `worker`), in the order of
/// their indexes: the next process of each role of `laid[k]` on node `went[k]`.
pub(in crate::live) fn start_nodes(
    laid: &[Vec<Role>],
    went: &[usize],
    free: &Free,
) -> BTreeMap<Role, Vec<String>> {
    let mut out: BTreeMap<Role, Vec<String>> = BTreeMap::new();
    for (roles, &i) in laid.iter().zip(went) {
        for &role in roles {
            out.entry(role).or_default().push(free.name(i).to_string());
        }
    }
    out
}

/// The node each of `job`'s training processes runs on, by index (empty: not known).
pub(in crate::live) fn worker_nodes(job: &LiveJob) -> Vec<&str> {
    let n = job
        .workers
        .processes
        .iter()
        .map(|p| p.index + 1)
        .max()
        .unwrap_or(0);
    let mut out = vec![""; n as usize];
    for p in &job.workers.processes {
        out[p.index as usize] = &p.node;
    }
    out
}

/// Where a worker added at index `k` to running `job` must go, as `free` numbers the nodes:
/// the node of a process `k` of a role that shares the workers' devices, where one runs and
/// its node is known (the job master lays the two out as one bundle).
pub(in crate::live) fn partner_node(job: &LiveJob, k: u32, free: &Free) -> Option<usize> {
    job.roles
        .iter()
        .filter(|r| r.beside_workers && r.count > k)
        .filter_map(|r| r.nodes.get(k as usize).filter(|n| !n.is_empty()))
        .find_map(|n| free.node(n))
}
