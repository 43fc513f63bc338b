//! Each node's free CPU and memory, where the platform reports them ([`LiveCluster::free`]: a
//! Ray cluster's available resources by node). The round counts CPU and memory in one pool;
//! this gate then lets the CPU jobs' new processes (a start's PS and workers, a growth's added
//! workers) through only where they fit on the nodes as they are, each process whole on one
//! node: room the pool counts but that is split across nodes is not handed out. Growth of
//! running jobs goes first, then starts, each in submission order; a job's processes are
//! placed largest first, each on the node with the least room that holds it. A job that does
//! not fit gets fewer workers, by node units, down to its minimum (a start) or its size (a
//! growth); below that, a start waits and a growth is not made, with the reason.
//!
//! What the gate does not know: processes of plans the job masters have not yet carried out
//! (the platform reports the room they will take a moment later), GPU jobs' CPU on their GPU
//! nodes, and the service roles' processes. The job master still places each process and
//! waits for a node that holds it.

use super::*;

/// A node's CPU and memory free for new processes, as the platform last reported them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRoom {
    /// How the platform names it (a Ray node: its address).
    pub name: String,
    pub cpu_millicores: u64,
    /// Free memory, bytes (read only where the cluster's memory is counted).
    #[serde(default)]
    pub memory_bytes: u64,
}

/// One process to place: its CPU (millicores) and memory (bytes).
type Process = (u64, u64);

/// Lets the CPU jobs' new processes through only where they fit on `cluster.free` (see the
/// module's documentation). Nothing changes when the cluster reports no nodes.
pub(super) fn gate(jobs: &mut [Sized], cluster: &LiveCluster) {
    if cluster.free.is_empty() {
        return;
    }
    let count_memory = cluster.memory_bytes != 0;
    let mut room: Vec<Process> = cluster
        .free
        .iter()
        .map(|n| {
            let memory = if count_memory {
                n.memory_bytes
            } else {
                u64::MAX
            };
            (n.cpu_millicores, memory)
        })
        .collect();
    let mut order: Vec<usize> = (0..jobs.len()).filter(|&i| adds(&jobs[i]) > 0).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (jobs[a].job, jobs[b].job);
        (x.state == LiveState::Queued)
            .cmp(&(y.state == LiveState::Queued))
            .then(x.submitted_s.total_cmp(&y.submitted_s))
            .then(x.id.cmp(&y.id))
    });
    for i in order {
        gate_one(&mut jobs[i], &mut room, &cluster.free);
    }
}

/// The workers a job adds in this round (a start: all of them).
fn adds(s: &Sized) -> u32 {
    match s.job.state {
        LiveState::Queued => s.to,
        LiveState::Running => s.to.saturating_sub(s.counted(s.job.workers)),
    }
}

/// Places `s`'s new processes on `room` at the most workers that fit (see [`gate`]).
fn gate_one(s: &mut Sized, room: &mut Vec<Process>, nodes: &[NodeRoom]) {
    let job = s.job;
    let start = job.state == LiveState::Queued;
    let (base, lowest) = match start {
        true => (0, job.min_workers.max(1)),
        false => {
            let base = s.counted(job.workers);
            (base, base + 1)
        }
    };
    let new_ps = if start {
        s.ps
    } else {
        s.ps.saturating_sub(job.ps)
    };
    let unit = job.node_unit.max(1);
    let wanted = s.to;
    let mut w = wanted;
    while w >= lowest {
        let mut procs = vec![(job.ps_millicores, job.ps_memory_bytes); new_ps as usize];
        procs.extend(std::iter::repeat_n(
            (job.worker_millicores, job.worker_memory_bytes),
            (w - base) as usize,
        ));
        if let Some(left) = placed(room, procs) {
            *room = left;
            if w < wanted {
                s.to = w;
                s.reasons.push(format!(
                    "{w} workers, not {wanted}: no more fit on the nodes' free room ({})",
                    freest(room, nodes)
                ));
            }
            return;
        }
        if w < unit {
            break;
        }
        w -= unit;
    }
    let what = format!(
        "{} of {} CPU{}",
        if start {
            "its processes"
        } else {
            "another worker"
        },
        millicores_shown(job.worker_millicores),
        match job.worker_memory_bytes {
            0 => String::new(),
            m => format!(" and {}", hold::memory_shown(m)),
        }
    );
    if start {
        s.to = 0;
        s.reasons.push(format!(
            "waits: no node has room for {what} at its minimum of {lowest} workers ({})",
            freest(room, nodes)
        ));
    } else {
        s.to = job.workers;
        // No change of workers is made: none is recorded for the heuristics' cool-downs.
        s.corrections
            .retain(|c| c.kind != crate::heuristics::ChangeKind::Workers);
        s.reasons.push(format!(
            "kept at {} workers: no node has room for {what} ({})",
            job.workers,
            freest(room, nodes)
        ));
    }
}

/// `room` after `procs` are placed, largest first, each on the node with the least CPU that
/// holds it; `None` when one does not fit.
fn placed(room: &[Process], mut procs: Vec<Process>) -> Option<Vec<Process>> {
    procs.sort_by(|a, b| b.cmp(a));
    let mut left = room.to_vec();
    for (cpu, memory) in procs {
        let best = left
            .iter_mut()
            .filter(|(c, m)| *c >= cpu && *m >= memory)
            .min_by_key(|(c, _)| *c)?;
        best.0 -= cpu;
        best.1 = best.1.saturating_sub(memory);
    }
    Some(left)
}

/// The freest nodes' CPU, as the reasons name it: `10.0.0.2 1.5 CPU free, 10.0.0.3 1 CPU
/// free` (three at most).
fn freest(room: &[Process], nodes: &[NodeRoom]) -> String {
    let mut by: Vec<(u64, &str)> = room
        .iter()
        .zip(nodes)
        .map(|((c, _), n)| (*c, n.name.as_str()))
        .collect();
    by.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let shown: Vec<String> = by
        .iter()
        .take(3)
        .map(|(c, n)| format!("{n} {} CPU free", millicores_shown(*c)))
        .collect();
    let more = by.len().saturating_sub(3);
    match more {
        0 => shown.join(", "),
        _ => format!("{} and {more} more", shown.join(", ")),
    }
}

/// Millicores as CPUs: `1.5`, `2`.
fn millicores_shown(m: u64) -> String {
    match m % 1000 {
        0 => format!("{}", m / 1000),
        _ => format!("{}", m as f64 / 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::job;
    use super::*;
    use crate::schedule::Fifo;

    fn node(name: &str, cpus: u64) -> NodeRoom {
        NodeRoom {
            name: name.into(),
            cpu_millicores: cpus * 1000,
            memory_bytes: 0,
        }
    }

    fn cpu_job(id: u64, state: LiveState, workers: u32, cpu: u64) -> LiveJob {
        LiveJob {
            worker_millicores: cpu * 1000,
            min_workers: workers,
            max_workers: workers,
            ..job(id, state, workers, &[(1, 10.0), (2, 19.0), (4, 36.0)])
        }
    }

    fn round(jobs: Vec<LiveJob>, free: Vec<NodeRoom>, cpus: u64) -> RoundPlan {
        let snapshot = LiveSnapshot {
            now_s: 100.0,
            cluster: LiveCluster {
                cpu_millicores: cpus * 1000,
                slot_millicores: 1000,
                max_processes: 100,
                memory_bytes: 0,
                nodes: Vec::new(),
                free,
            },
            jobs,
        };
        plan_round(
            &snapshot,
            &Fifo::default(),
            &LiveConfig::default(),
            &Heuristics::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_start_whose_processes_fit_the_pool_but_no_node_waits_with_the_nodes_room() {
        // Two nodes of 4 CPUs: one job of two 3-CPU workers fits, one per node; a second of
        // one 2-CPU worker fits the pool (2 CPUs left) but neither node (1 CPU each).
        let nodes = vec![node("10.0.0.2", 4), node("10.0.0.3", 4)];
        let jobs = vec![
            cpu_job(1, LiveState::Queued, 2, 3),
            cpu_job(2, LiveState::Queued, 1, 2),
        ];
        let plan = round(jobs.clone(), nodes.clone(), 8);
        assert_eq!(plan.decisions[0].to_workers, 2, "{:?}", plan.decisions[0]);
        let second = &plan.decisions[1];
        assert_eq!(second.to_workers, 0, "{second:?}");
        let why = second.reasons.last().unwrap();
        assert!(
            why.contains("no node has room for its processes of 2 CPU")
                && why.contains("10.0.0.2 1 CPU free, 10.0.0.3 1 CPU free"),
            "{why}"
        );
        // The same pool in one node: both start (what the round did before for every cluster,
        // and still does when the platform reports no nodes).
        let plan = round(jobs.clone(), vec![node("big", 8)], 8);
        assert_eq!(plan.decisions[1].to_workers, 1);
        let plan = round(jobs, Vec::new(), 8);
        assert_eq!(plan.decisions[1].to_workers, 1);
    }

    #[test]
    fn a_growth_is_cut_to_what_the_nodes_hold_and_goes_before_starts() {
        // A running job of 2 workers (2 CPUs each) grows to 4; the nodes have 3 and 1 CPUs
        // free besides it: one more worker fits, not two. The queued job behind it (one
        // 2-CPU worker, which the pool of 10 holds) then waits.
        let mut running = cpu_job(1, LiveState::Running, 2, 2);
        running.min_workers = 1;
        running.max_workers = 4;
        let queued = cpu_job(2, LiveState::Queued, 1, 2);
        let snapshot = LiveSnapshot {
            now_s: 100.0,
            cluster: LiveCluster {
                cpu_millicores: 10_000,
                slot_millicores: 1000,
                max_processes: 100,
                memory_bytes: 0,
                nodes: Vec::new(),
                free: vec![node("a", 3), node("b", 1)],
            },
            jobs: vec![running, queued],
        };
        let scheduler = super::super::tests::elastic();
        let run = |s: &LiveSnapshot| {
            let heuristics = super::super::tests::none();
            plan_round(s, &scheduler, &super::super::tests::config(), &heuristics).unwrap()
        };
        let mut pooled = snapshot.clone();
        pooled.cluster.free.clear();
        let before = run(&pooled);
        assert_eq!(
            (
                before.decisions[0].to_workers,
                before.decisions[1].to_workers
            ),
            (4, 1),
            "the pool alone: {before:?}"
        );
        let plan = run(&snapshot);
        let grown = &plan.decisions[0];
        assert_eq!((grown.from_workers, grown.to_workers), (2, 3), "{grown:?}");
        assert!(
            grown
                .reasons
                .iter()
                .any(|r| r.starts_with("3 workers, not 4: no more fit on the nodes' free room")),
            "{:?}",
            grown.reasons
        );
        assert_eq!(plan.decisions[1].to_workers, 0, "{:?}", plan.decisions[1]);
        // No node with 2 CPUs free: it keeps its size.
        let mut full = snapshot.clone();
        full.cluster.free = vec![node("a", 1), node("b", 1)];
        let plan = run(&full);
        let kept = &plan.decisions[0];
        assert_eq!(kept.to_workers, 2, "{kept:?}");
        let why = kept.reasons.last().unwrap();
        assert!(
            why.starts_with("kept at 2 workers: no node has room for another worker of 2 CPU"),
            "{why}"
        );
        assert!(kept.corrections.is_empty(), "{kept:?}");
        // The speed-up heuristic's growth the nodes cannot hold leaves no change behind
        // either (it would hold the next try back by its cool-down).
        let plan = plan_round(
            &full,
            &scheduler,
            &super::super::tests::config(),
            &Heuristics::default(),
        )
        .unwrap();
        assert_eq!(plan.decisions[0].to_workers, 2, "{:?}", plan.decisions[0]);
        assert!(
            !plan.decisions[0]
                .corrections
                .iter()
                .any(|c| c.kind == crate::heuristics::ChangeKind::Workers),
            "{:?}",
            plan.decisions[0]
        );
    }

    #[test]
    fn memory_is_placed_with_the_cpu_where_the_cluster_counts_it() {
        let mut j = cpu_job(1, LiveState::Queued, 2, 1);
        j.worker_memory_bytes = 3 << 30;
        let mut nodes = vec![node("a", 8), node("b", 8)];
        nodes[0].memory_bytes = 4 << 30;
        nodes[1].memory_bytes = 2 << 30;
        let snapshot = |nodes: Vec<NodeRoom>, memory: u64| LiveSnapshot {
            now_s: 100.0,
            cluster: LiveCluster {
                cpu_millicores: 16_000,
                slot_millicores: 1000,
                max_processes: 100,
                memory_bytes: memory,
                nodes: Vec::new(),
                free: nodes,
            },
            jobs: vec![j.clone()],
        };
        let plan = |s: &LiveSnapshot| {
            plan_round(
                s,
                &Fifo::default(),
                &LiveConfig::default(),
                &Heuristics::default(),
            )
            .unwrap()
        };
        // 6 GiB in the pool of 8 fits; two 3-GiB workers on nodes of 4 and 2 GiB do not.
        let waits = plan(&snapshot(nodes.clone(), 8 << 30));
        assert_eq!(waits.decisions[0].to_workers, 0, "{:?}", waits.decisions[0]);
        assert!(
            waits.decisions[0]
                .reasons
                .last()
                .unwrap()
                .contains("and 3 GiB"),
            "{:?}",
            waits.decisions[0].reasons
        );
        // Memory not counted: the nodes' memory is not read.
        assert_eq!(plan(&snapshot(nodes, 0)).decisions[0].to_workers, 2);
    }

    #[test]
    fn processes_go_largest_first_each_to_the_fullest_node_that_holds_it() {
        let room = vec![(4000, u64::MAX), (2000, u64::MAX)];
        // 2 then 2 then 1: the first 2 fills b, the second goes to a, the 1 to a.
        let left = placed(&room, vec![(1000, 0), (2000, 0), (2000, 0)]).unwrap();
        assert_eq!(left, vec![(1000, u64::MAX), (0, u64::MAX)]);
        assert_eq!(placed(&room, vec![(3000, 0), (3000, 0)]), None);
    }
}
