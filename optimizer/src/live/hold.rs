//! Whether the cluster's GPU nodes can ever hold a job, checked at submission: every role's
//! process on some node of its model ([`unplaceable`]), and each `placement:` group as a
//! whole: a `strict_pack` group's GPUs on one node, a `strict_spread` group's processes with
//! GPUs on as many nodes, a group that shares devices one device per index; and the same for
//! CPU and memory against each node's ([`never_holds_cpu`], [`never_holds_memory`]) where the
//! nodes' sizes are known. What a node has free at the time is its job master's to wait for.

use vocab::spec::{PlacementGroup, Strategy};
use vocab::{Gpus, JobSpec};

use super::gpu::{LiveNode, cluster_gpus, unplaceable};

/// Why `spec` (its counts filled in) can never run on `nodes`; `None` when it may.
pub fn never_holds(spec: &JobSpec, nodes: &[LiveNode]) -> Option<String> {
    for (role, r) in &spec.roles {
        let (gpus, model) = r.resources.as_ref().map_or((Gpus::ZERO, None), |r| {
            (r.gpu.unwrap_or_default(), r.gpu_type.as_deref())
        });
        if let Some(why) = unplaceable(nodes, gpus, model) {
            return Some(format!("role {role}: {why}"));
        }
    }
    spec.placement.iter().enumerate().find_map(|(i, g)| {
        group_never_holds(spec, g, nodes).map(|why| format!("placement[{i}] ({}): {why}", g.name()))
    })
}

/// A resource every node has an amount of, checked per process and per placement group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Amount {
    /// Millicores.
    Cpu,
    /// Bytes.
    Memory,
}

impl Amount {
    /// What one process of `role` asks for (`default` when its role names none).
    fn of(self, spec: &JobSpec, role: &vocab::Role, default: u64) -> u64 {
        let r = spec.roles[role].resources.as_ref();
        match self {
            Amount::Cpu => r.and_then(|x| x.cpu).map_or(default, |c| c.0),
            Amount::Memory => r.and_then(|x| x.memory).map_or(default, |m| m.0),
        }
    }

    /// `v` as a user reads it: `1.5 CPUs`, `6 GiB`.
    fn show(self, v: u64) -> String {
        let trim = |s: String| s.trim_end_matches('0').trim_end_matches('.').to_string();
        match self {
            Amount::Cpu => format!("{} CPUs", trim(format!("{:.3}", v as f64 / 1000.0))),
            Amount::Memory if v >= 1 << 30 => {
                format!(
                    "{} GiB",
                    trim(format!("{:.2}", v as f64 / (1u64 << 30) as f64))
                )
            }
            Amount::Memory => format!(
                "{} MiB",
                trim(format!("{:.1}", v as f64 / (1u64 << 20) as f64))
            ),
        }
    }
}

/// `bytes` as a user reads them: `6 GiB`, `512 MiB`.
pub(super) fn memory_shown(bytes: u64) -> String {
    Amount::Memory.show(bytes)
}

/// Why `spec` (its counts filled in) can never get its CPU on nodes of `node_cpus` millicores
/// each (the nodes with CPU to hand out): a process asking more than every node has, a
/// `strict_pack` group more than every node has, and, where `spread` (the nodes are the ones
/// processes run on, as a Ray cluster's), a `strict_spread` group of more bundles than there
/// are nodes that hold one. A group that shares devices is one bundle per index, otherwise
/// one per process. `default_cpu`: the CPU of a process whose role names none. `None` when it
/// may, or when no node's CPU is known.
pub fn never_holds_cpu(
    spec: &JobSpec,
    node_cpus: &[u64],
    default_cpu: u64,
    spread: bool,
) -> Option<String> {
    never_holds_amount(Amount::Cpu, spec, node_cpus, default_cpu, spread)
}

/// As [`never_holds_cpu`], for the memory the processes ask for (those whose role names
/// none ask for nothing: the platform reserves none for them) on nodes of `node_memory`
/// bytes each. `None` when it may, or when no node's memory is known.
pub fn never_holds_memory(spec: &JobSpec, node_memory: &[u64], spread: bool) -> Option<String> {
    never_holds_amount(Amount::Memory, spec, node_memory, 0, spread)
}

fn never_holds_amount(
    what: Amount,
    spec: &JobSpec,
    nodes: &[u64],
    default: u64,
    spread: bool,
) -> Option<String> {
    let largest = nodes.iter().copied().max()?;
    let of = |r: &vocab::Role| what.of(spec, r, default);
    let count = |r: &vocab::Role| spec.role_plan(*r).map_or(0, |p| p.replicas);
    let have = || {
        format!(
            "the cluster's {} node(s) have at most {}",
            nodes.len(),
            what.show(largest)
        )
    };
    for role in spec.roles.keys().filter(|r| count(r) > 0) {
        if of(role) > largest {
            return Some(format!(
                "role {role}: each process asks for {}, and {}",
                what.show(of(role)),
                have()
            ));
        }
    }
    spec.placement.iter().enumerate().find_map(|(i, g)| {
        let bundles: Vec<u64> = if g.share_devices {
            let n = g.roles.iter().map(count).max().unwrap_or(0);
            (0..n)
                .map(|i| g.roles.iter().filter(|r| count(r) > i).map(of).sum())
                .collect()
        } else {
            g.roles
                .iter()
                .flat_map(|r| std::iter::repeat_n(of(r), count(r) as usize))
                .collect()
        };
        let why = match g.strategy {
            Strategy::StrictPack => {
                let need: u64 = bundles.iter().sum();
                (need > largest).then(|| {
                    format!(
                        "strict_pack needs {} on one node, and {}",
                        what.show(need),
                        have()
                    )
                })
            }
            Strategy::StrictSpread if spread => {
                let smallest = bundles.iter().copied().min().unwrap_or(0);
                let fit = nodes.iter().filter(|c| **c >= smallest).count();
                (fit < bundles.len()).then(|| {
                    format!(
                        "strict_spread needs {} nodes each with {} or more, and {fit} of \
                         the cluster's {} node(s) have that",
                        bundles.len(),
                        what.show(smallest),
                        nodes.len()
                    )
                })
            }
            Strategy::StrictSpread | Strategy::Pack | Strategy::Spread => None,
        };
        why.map(|why| format!("placement[{i}] ({}): {why}", g.name()))
    })
}

/// A node's size, for the checks where each node's CPU and memory are its own (a Ray
/// cluster's nodes).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSize {
    pub cpu_millicores: u64,
    /// 0: not known.
    pub memory_bytes: u64,
    pub gpus: u32,
    pub gpu_type: String,
}

/// Why `spec`'s processes with GPUs can never run with their CPU and memory beside their
/// GPUs on `nodes`: a role's process whose CPU or memory no node with its GPUs (of its model)
/// has, or a training group with GPUs whose minimum the nodes of any one model hold fewer
/// of, each process whole on one node (the round starts the group at its minimum or more, on
/// one model). A worker whose device other roles share counts as its bundle: the device, its
/// CPU and memory and those of the processes of its index beside it (as the job master lays
/// them out, on one node); those roles are not checked apart. `default_cpu`: the CPU of a
/// process whose role names none. `None` when it may.
pub fn never_holds_beside_gpus(
    spec: &JobSpec,
    nodes: &[NodeSize],
    default_cpu: u64,
) -> Option<String> {
    let trainer = spec.training_role();
    let asks = |r: &vocab::spec::RoleSpec| {
        let res = r.resources.as_ref();
        (
            res.and_then(|x| x.cpu).map_or(default_cpu, |c| c.0),
            res.and_then(|x| x.memory).map_or(0, |m| m.0),
        )
    };
    // The roles beside each worker, with their processes' count.
    let partners: Vec<(vocab::Role, u32)> = spec
        .roles
        .keys()
        .filter(|r| spec.shares_worker_devices(**r))
        .map(|r| (*r, spec.role_plan(*r).map_or(0, |p| p.replicas)))
        .collect();
    for (role, r) in &spec.roles {
        let bundle = (*role == trainer).then(|| spec.worker_bundle()).flatten();
        let g = bundle.unwrap_or_else(|| spec.gpu_of(*role));
        let Ok(plan) = spec.role_plan(*role) else {
            continue;
        };
        if g.is_zero() || plan.replicas == 0 || spec.shares_worker_devices(*role) {
            continue;
        }
        let res = r.resources.as_ref();
        let model = res.and_then(|x| x.gpu_type.as_deref());
        let (own_cpu, own_memory) = asks(r);
        // Worker `k`'s bundle: itself and the partners of its index (none but a bundle's).
        let beside: &[(vocab::Role, u32)] = if bundle.is_some() { &partners } else { &[] };
        let at = |k: u32| {
            beside
                .iter()
                .filter(|(_, n)| *n > k)
                .map(|(p, _)| asks(&spec.roles[p]))
                .fold((own_cpu, own_memory), |(c, m), (pc, pm)| (c + pc, m + pm))
        };
        let (cpu, memory) = at(0);
        let who = match bundle {
            Some(_) if !partners.is_empty() => format!(
                "role {role} (with {} beside each process, one device between them)",
                partners
                    .iter()
                    .map(|(p, _)| p.to_string())
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            _ => format!("role {role}"),
        };
        let with: Vec<&NodeSize> = nodes
            .iter()
            .filter(|n| n.gpus >= g.devices() && model.is_none_or(|m| m == n.gpu_type))
            .collect();
        let gpus = format!(
            "{g} {}GPUs",
            model.map_or(String::new(), |m| format!("{m} "))
        );
        let Some(most_cpu) = with.iter().map(|n| n.cpu_millicores).max() else {
            continue; // `never_holds` names it
        };
        let most_memory = with.iter().map(|n| n.memory_bytes).max().unwrap_or(0);
        for (what, asks, most) in [
            (Amount::Cpu, cpu, most_cpu),
            (Amount::Memory, memory, most_memory),
        ] {
            // A node's memory of 0: not known.
            let known = what == Amount::Cpu || most > 0;
            if known && asks > most {
                return Some(format!(
                    "{who}: each process asks for {} beside {gpus}, and the cluster's {} \
                     node(s) with those GPUs have at most {}",
                    what.show(asks),
                    with.len(),
                    what.show(most)
                ));
            }
        }
        if *role != trainer {
            continue;
        }
        // The training group at its minimum, on the nodes of one model (where partners are
        // fewer than the workers, counted at the smallest bundle among the first `min`).
        let min = plan.min.max(1);
        let (cpu, memory) = at(min - 1);
        let holds = |n: &NodeSize| {
            let by = |have: u64, each: u64| have.checked_div(each).unwrap_or(u64::MAX);
            let by_memory = match n.memory_bytes {
                0 => u64::MAX,
                m => by(m, memory),
            };
            (g.fit_in(n.gpus) as u64)
                .min(by(n.cpu_millicores, cpu))
                .min(by_memory)
        };
        let mut by_model: std::collections::BTreeMap<&str, u64> = Default::default();
        for n in &with {
            *by_model.entry(n.gpu_type.as_str()).or_default() += holds(n);
        }
        let most = by_model.values().copied().max().unwrap_or(0);
        if most < min as u64 {
            return Some(format!(
                "{who}: its minimum of {min} processes of {gpus} and {} each never fits: \
                 the nodes of one GPU model hold {most} such processes at most, each whole on \
                 one node",
                Amount::Cpu.show(cpu)
            ));
        }
    }
    None
}

/// Each bundle's GPUs (one per process, or one per index when the group shares devices) and
/// the model the group asks for.
fn bundles(spec: &JobSpec, g: &PlacementGroup) -> (Vec<Gpus>, Option<String>) {
    let model = g.roles.iter().find_map(|r| {
        spec.roles[r]
            .resources
            .as_ref()
            .and_then(|x| x.gpu_type.clone())
    });
    let count = |r: &vocab::Role| spec.role_plan(*r).map_or(0, |p| p.replicas);
    let out = if g.share_devices {
        let n = g.roles.iter().map(count).max().unwrap_or(0);
        vec![Gpus::ONE; n as usize]
    } else {
        g.roles
            .iter()
            .flat_map(|r| std::iter::repeat_n(spec.gpu_of(*r), count(r) as usize))
            .filter(|g| !g.is_zero())
            .collect()
    };
    (out, model)
}

fn group_never_holds(spec: &JobSpec, g: &PlacementGroup, nodes: &[LiveNode]) -> Option<String> {
    let (bundles, model) = bundles(spec, g);
    if bundles.is_empty() {
        return None;
    }
    let of_model: Vec<u32> = nodes
        .iter()
        .filter(|n| n.gpus > 0 && model.as_deref().is_none_or(|m| m == n.gpu_type))
        .map(|n| n.gpus)
        .collect();
    let have = || cluster_gpus(nodes);
    match g.strategy {
        Strategy::StrictPack => {
            // At least: the whole devices, and the shares packed as tightly as they can be.
            let whole: u32 = bundles
                .iter()
                .filter(|b| !b.is_fraction())
                .map(|b| b.devices())
                .sum();
            let shares: u32 = bundles
                .iter()
                .filter(|b| b.is_fraction())
                .map(|b| b.milli())
                .sum();
            let need = whole + shares.div_ceil(1000);
            let largest = of_model.iter().copied().max().unwrap_or(0);
            (need > largest).then(|| {
                format!(
                    "strict_pack needs {need} GPUs on one node for its {} processes with GPUs, \
                     more than any node holds: {}",
                    bundles.len(),
                    have()
                )
            })
        }
        Strategy::StrictSpread => {
            let smallest = bundles.iter().map(|b| b.devices()).min().unwrap_or(0);
            let fit = of_model.iter().filter(|n| **n >= smallest).count();
            (fit < bundles.len()).then(|| {
                format!(
                    "strict_spread needs {} nodes each with {smallest} GPUs or more, and {fit} \
                     node(s) have that: {}",
                    bundles.len(),
                    have()
                )
            })
        }
        Strategy::Pack | Strategy::Spread => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<LiveNode> {
        [("cpu", 0, ""), ("v", 2, "V100"), ("a", 4, "A100")]
            .iter()
            .map(|(n, g, m)| LiveNode {
                name: n.to_string(),
                gpus: *g,
                gpu_type: m.to_string(),
            })
            .collect()
    }

    fn spec(worker_gpu: &str, rollouts: u32, rollout_gpu: &str, group: &str) -> JobSpec {
        let yaml = format!(
            "name: j\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, resources: {{ gpu: {worker_gpu} }} }}\n  \
             rollout: {{ replicas: {rollouts}, topology: service, command: [/bin/true], resources: {{ gpu: {rollout_gpu} }} }}\n\
             workload: {{ builtin: {{}} }}\ndata: {{ num_samples: 10, shard_size: 1 }}\n\
             checkpoint: {{ dir: /tmp/x }}\nplacement:\n  - {group}\n"
        );
        let s = JobSpec::from_yaml(&yaml).unwrap();
        s.validate().unwrap();
        s
    }

    #[test]
    fn processes_and_groups_no_node_has_the_cpu_for_are_named() {
        let yaml = |rollout_cpu: &str, group: &str| {
            let s = JobSpec::from_yaml(&format!(
                "name: j\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, resources: {{ cpu: 2 }} }}\n  \
                 rollout: {{ replicas: 3, topology: service, command: [/bin/true], resources: {{ cpu: {rollout_cpu} }} }}\n\
                 workload: {{ builtin: {{}} }}\ndata: {{ num_samples: 10, shard_size: 1 }}\n\
                 checkpoint: {{ dir: /tmp/x }}\nplacement:\n  - {group}\n"
            ))
            .unwrap();
            s.validate().unwrap();
            s
        };
        // Three nodes of 4 CPUs (a node of GPUs only has none to hand out).
        let nodes = [4000, 4000, 4000];
        let spread = "{ roles: [rollout], strategy: strict_spread }";
        assert_eq!(
            never_holds_cpu(&yaml("1", spread), &nodes, 1000, true),
            None
        );
        // An engine of 6 CPUs: no node has them.
        assert_eq!(
            never_holds_cpu(&yaml("6", spread), &nodes, 1000, true).as_deref(),
            Some(
                "role rollout: each process asks for 6 CPUs, and the cluster's 3 node(s) have at most 4 CPUs"
            )
        );
        // Two workers of 2 and three engines of 0.5 packed on one node: 5.5 CPUs.
        let pack = "{ roles: [worker, rollout], strategy: strict_pack }";
        assert_eq!(
            never_holds_cpu(&yaml("0.5", pack), &nodes, 1000, true).as_deref(),
            Some(
                "placement[0] (worker+rollout): strict_pack needs 5.5 CPUs on one node, and the cluster's 3 node(s) have at most 4 CPUs"
            )
        );
        assert_eq!(
            never_holds_cpu(&yaml("0.5", pack), &[4000, 8000], 1000, true),
            None
        );
        // Three engines strictly spread over two nodes: never.
        assert!(
            never_holds_cpu(&yaml("1", spread), &[4000, 4000], 1000, true)
                .unwrap()
                .contains("strict_spread needs 3 nodes each with 1 CPUs or more, and 2 of the cluster's 2 node(s) have that")
        );
        // Nodes that are not where the processes run (the brain's own pool): no spread check.
        assert_eq!(
            never_holds_cpu(&yaml("1", spread), &[4000], 1000, false),
            None
        );
        // No node's CPU known: nothing to say.
        assert_eq!(never_holds_cpu(&yaml("6", spread), &[], 1000, true), None);
    }

    #[test]
    fn processes_and_groups_no_node_has_the_memory_for_are_named() {
        let yaml = |rollout_memory: &str, group: &str| {
            let s = JobSpec::from_yaml(&format!(
                "name: j\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, resources: {{ memory: 2Gi }} }}\n  \
                 rollout: {{ replicas: 3, topology: service, command: [/bin/true], resources: {{ memory: {rollout_memory} }} }}\n\
                 workload: {{ builtin: {{}} }}\ndata: {{ num_samples: 10, shard_size: 1 }}\n\
                 checkpoint: {{ dir: /tmp/x }}\nplacement:\n  - {group}\n"
            ))
            .unwrap();
            s.validate().unwrap();
            s
        };
        // Three nodes of 4 GiB each (the three-node cluster of `.ci/ray-cluster`).
        let nodes = [4 << 30, 4 << 30, 4 << 30];
        let spread = "{ roles: [rollout], strategy: strict_spread }";
        assert_eq!(never_holds_memory(&yaml("1Gi", spread), &nodes, true), None);
        assert_eq!(
            never_holds_memory(&yaml("6Gi", spread), &nodes, true).as_deref(),
            Some(
                "role rollout: each process asks for 6 GiB, and the cluster's 3 node(s) have at most 4 GiB"
            )
        );
        // Two workers of 2 GiB and three engines of 512 MiB packed on one node: 5.5 GiB.
        let pack = "{ roles: [worker, rollout], strategy: strict_pack }";
        assert_eq!(
            never_holds_memory(&yaml("512Mi", pack), &nodes, true).as_deref(),
            Some(
                "placement[0] (worker+rollout): strict_pack needs 5.5 GiB on one node, and the cluster's 3 node(s) have at most 4 GiB"
            )
        );
        assert!(
            never_holds_memory(&yaml("3Gi", spread), &[4 << 30, 4 << 30, 2 << 30], true)
                .unwrap()
                .contains("strict_spread needs 3 nodes each with 3 GiB or more, and 2 of")
        );
        // A role that names no memory asks the platform for none; no node's memory known:
        // nothing to say.
        let none = JobSpec::from_yaml(
            "name: j\nkind: allreduce\nroles:\n  worker: { replicas: 2 }\n\
             workload: { builtin: {} }\ndata: { num_samples: 10, shard_size: 1 }\n\
             checkpoint: { dir: /tmp/x }\n",
        )
        .unwrap();
        assert_eq!(never_holds_memory(&none, &[1 << 20], true), None);
        assert_eq!(never_holds_memory(&yaml("6Gi", spread), &[], true), None);
    }

    #[test]
    fn groups_no_node_set_can_hold_are_named_and_the_others_pass() {
        let n = nodes();
        // 2 workers of 1 and 2 engines of 0.5 on one node: 3 GPUs, the A100 node holds 4.
        let ok = spec(
            "1",
            2,
            "0.5",
            "{ roles: [worker, rollout], strategy: strict_pack }",
        );
        assert_eq!(never_holds(&ok, &n), None);
        // 2 of 2 and 2 of 0.5: 5 GPUs on one node, more than any.
        let e = never_holds(
            &spec(
                "2",
                2,
                "0.5",
                "{ roles: [worker, rollout], strategy: strict_pack }",
            ),
            &n,
        )
        .unwrap();
        assert!(
            e.contains("placement[0] (worker+rollout): strict_pack needs 5 GPUs on one node"),
            "{e}"
        );
        // 3 engines with GPUs strictly spread: only 2 nodes have GPUs.
        let e = never_holds(
            &spec(
                "0.5",
                3,
                "0.5",
                "{ roles: [rollout], strategy: strict_spread }",
            ),
            &n,
        )
        .unwrap();
        assert!(
            e.contains("strict_spread needs 3 nodes each with 1 GPUs or more, and 2"),
            "{e}"
        );
        // Shared devices: one per index, spread over the 2 GPU nodes.
        let shared = "{ roles: [worker, rollout], strategy: strict_spread, share_devices: true }";
        assert_eq!(never_holds(&spec("0.5", 2, "0.5", shared), &n), None);
        assert!(never_holds(&spec("0.5", 3, "0.5", shared), &n).is_some());
        // A role alone no node holds is named.
        let e = never_holds(
            &spec("8", 1, "0.5", "{ roles: [rollout], strategy: pack }"),
            &n,
        )
        .unwrap();
        assert!(
            e.starts_with("role worker: the job asks for 8 GPUs per worker"),
            "{e}"
        );
    }

    #[test]
    fn gpu_processes_whose_cpu_their_gpu_nodes_lack_are_named() {
        // The CI harness's nodes: 4 CPUs and 4 GiB each; 2 V100s on one, 4 A100s on another.
        let size = |gpus: u32, model: &str| NodeSize {
            cpu_millicores: 4000,
            memory_bytes: 4 << 30,
            gpus,
            gpu_type: model.into(),
        };
        let nodes = [size(0, ""), size(2, "V100"), size(4, "A100")];
        let job = |workers: &str, rollout: &str| {
            let s = JobSpec::from_yaml(&format!(
                "name: j\nkind: allreduce\nroles:\n  worker: {{ {workers} }}\n  \
                 rollout: {{ replicas: 1, topology: service, command: [/bin/true], {rollout} }}\n\
                 workload: {{ builtin: {{}} }}\ndata: {{ num_samples: 10, shard_size: 1 }}\n\
                 checkpoint: {{ dir: /tmp/x }}\n"
            ))
            .unwrap();
            s.validate().unwrap();
            s
        };
        let check = |workers: &str, rollout: &str| {
            never_holds_beside_gpus(&job(workers, rollout), &nodes, 1000)
        };
        let v100 = |cpu: &str| {
            format!("replicas: 2, min: 1, resources: {{ cpu: {cpu}, gpu: 1, gpu_type: V100 }}")
        };
        assert_eq!(check(&v100("3"), "resources: { cpu: 1 }"), None);
        // 6 CPUs beside a V100: the V100 node has 4 (the CPU node's 8 would not do).
        let big = [size(0, ""), size(2, "V100")];
        let mut wide = big.clone();
        wide[0].cpu_millicores = 8000;
        assert_eq!(
            never_holds_beside_gpus(&job(&v100("6"), "resources: { cpu: 1 }"), &wide, 1000)
                .as_deref(),
            Some(
                "role worker: each process asks for 6 CPUs beside 1 V100 GPUs, and the cluster's \
                 1 node(s) with those GPUs have at most 4 CPUs"
            )
        );
        // A minimum of 2 workers of 3 CPUs beside a V100: the V100 node holds one.
        let e = check(
            "replicas: 2, min: 2, resources: { cpu: 3, gpu: 1, gpu_type: V100 }",
            "resources: { cpu: 1 }",
        )
        .unwrap();
        assert_eq!(
            e,
            "role worker: its minimum of 2 processes of 1 V100 GPUs and 3 CPUs each never fits: \
             the nodes of one GPU model hold 1 such processes at most, each whole on one node"
        );
        // Any model: the A100 node holds one and the V100 node one, but never both for one
        // job (it runs on one model); of 2 CPUs, each holds 2.
        let any = |cpu: &str| format!("replicas: 2, min: 2, resources: {{ cpu: {cpu}, gpu: 1 }}");
        assert!(check(&any("3"), "resources: { cpu: 1 }").is_some());
        assert_eq!(check(&any("2"), "resources: { cpu: 1 }"), None);
        // Memory too, and a role with GPUs of its own.
        assert!(
            check(&v100("1"), "resources: { cpu: 1, memory: 6Gi, gpu: 1 }")
                .unwrap()
                .starts_with("role rollout: each process asks for 6 GiB beside 1 GPUs")
        );
        // A worker whose device a rollout engine shares counts with the engine beside it:
        // one V100 and their CPUs added up, on one node.
        let shared = |worker_cpu: u32, min: u32, engine_cpu: u32, engines: u32| {
            let s = JobSpec::from_yaml(&format!(
                "name: j\nkind: allreduce\nroles:\n  worker: {{ replicas: 2, min: {min}, resources: {{ cpu: {worker_cpu}, gpu: 0.5, gpu_type: V100 }} }}\n  \
                 rollout: {{ replicas: {engines}, topology: service, command: [/bin/true], resources: {{ cpu: {engine_cpu}, gpu: 0.5, gpu_type: V100 }} }}\n\
                 workload: {{ builtin: {{}} }}\ndata: {{ num_samples: 10, shard_size: 1 }}\n\
                 checkpoint: {{ dir: /tmp/x }}\nplacement:\n  - {{ roles: [worker, rollout], strategy: pack, share_devices: true }}\n",
            ))
            .unwrap();
            s.validate().unwrap();
            never_holds_beside_gpus(&s, &big, 1000)
        };
        // Two bundles of 2 CPUs: the V100 node's 4 hold both.
        assert_eq!(shared(1, 2, 1, 2), None);
        // A bundle of 3 + 2 CPUs: no V100 node has 5.
        assert_eq!(
            shared(3, 1, 2, 2).as_deref(),
            Some(
                "role worker (with rollout beside each process, one device between them): each \
                 process asks for 5 CPUs beside 1 V100 GPUs, and the cluster's 1 node(s) with \
                 those GPUs have at most 4 CPUs"
            )
        );
        // At a minimum of 2, bundles of 3 + 1 CPUs: the node holds one.
        assert_eq!(
            shared(3, 2, 1, 2).as_deref(),
            Some(
                "role worker (with rollout beside each process, one device between them): its \
                 minimum of 2 processes of 1 V100 GPUs and 4 CPUs each never fits: the nodes of \
                 one GPU model hold 1 such processes at most, each whole on one node"
            )
        );
        // One engine only: the second worker's bundle is the worker alone, so bundles of 2
        // and 1 CPUs, which the node holds.
        assert_eq!(shared(1, 2, 1, 1), None);
    }
}
