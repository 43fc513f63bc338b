//! A job's placement groups (`placement:` without `share_devices`) in the nodes' gate: the
//! processes of one group are laid out together by its strategy, as the job master lays
//! their bundles out on Ray (`job_master::platform::ray::group::lay_out`), before the job's
//! other processes are placed; so a start or growth the round lets through is one the
//! master can lay out on the nodes as they are, and the nodes the round names for them
//! (the start's, a plan's) are a layout the master can take as it is.
//!
//! By strategy, over the nodes the most CPU free first (the first among equals):
//! `strict_pack` puts them all on the first node that holds them together (the node the
//! group runs on already, where it runs); `strict_spread` each on a node without another
//! of the group; `pack` each where the group has the most processes, `spread` where it has
//! the fewest, among the nodes that hold it (the largest processes first).

use std::cmp::Reverse;

use vocab::spec::Strategy;

use super::super::room::{Process, Room};
use super::super::*;

/// A placement group of a job's roles, as the round lays their processes out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveGroup {
    /// Its roles, the training group as `worker` whatever the job calls it.
    pub roles: Vec<Role>,
    pub strategy: Strategy,
    /// Its roles' processes of one index share a device (`share_devices`, a group without
    /// the training group: one with it is the workers' bundles, [`LiveRole::beside_workers`]):
    /// they are one bundle, placed whole on one node (`layout::roles_of`), and one a
    /// growth adds goes to the node of its index's partners.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_devices: bool,
}

impl LiveGroup {
    /// `rollout (strict_spread)`, `reward+reference (pack, sharing devices)`: how the round's
    /// reasons name it.
    pub fn shown(&self) -> String {
        let roles: Vec<String> = self.roles.iter().map(|r| r.to_string()).collect();
        let sharing = match self.share_devices {
            true => ", sharing devices",
            false => "",
        };
        format!("{} ({}{sharing})", roles.join("+"), self.strategy.as_str())
    }
}

/// The processes to place, each with the group it belongs to (an index into `list`), and how
/// many of each group's processes each node holds already.
pub(in crate::live) struct Groups<'a> {
    pub(in crate::live) list: &'a [LiveGroup],
    pub(in crate::live) of: Vec<Option<usize>>,
    pub(in crate::live) here: Vec<Vec<u32>>,
}

impl<'a> Groups<'a> {
    /// No groups: every process placed on its own.
    #[cfg(test)]
    pub(in crate::live) fn none() -> Groups<'a> {
        Groups {
            list: &[],
            of: Vec::new(),
            here: Vec::new(),
        }
    }

    /// The groups of `job`'s processes laid out as `laid` lists them (each entry by its
    /// first role), on `nodes` nodes, where `job` runs already as its reports say (`free`
    /// names the nodes).
    pub(in crate::live) fn of_job(
        job: &'a LiveJob,
        laid: &[Vec<Role>],
        free: &super::Free,
    ) -> Groups<'a> {
        let group = |r: &Role| job.groups.iter().position(|g| g.roles.contains(r));
        let here = job
            .groups
            .iter()
            .map(|g| {
                // A group's processes on each node; of a group that shares devices, its
                // bundles (the most of one role's processes there).
                let mut on = vec![0; free.node_count()];
                for &r in &g.roles {
                    let mut of_role = vec![0; free.node_count()];
                    for node in running_on(job, r) {
                        if let Some(i) = free.node(node) {
                            of_role[i] += 1;
                        }
                    }
                    for (n, k) in on.iter_mut().zip(of_role) {
                        *n = match g.share_devices {
                            true => (*n).max(k),
                            false => *n + k,
                        };
                    }
                }
                on
            })
            .collect();
        Groups {
            list: &job.groups,
            of: laid
                .iter()
                .map(|roles| roles.first().and_then(group))
                .collect(),
            here,
        }
    }

    fn group_of(&self, k: usize) -> Option<usize> {
        self.of.get(k).copied().flatten()
    }
}

impl super::Free {
    /// Up to `n` more processes `p` of `job`'s `role`, which is in one of its placement
    /// groups: each beside the group's processes by its strategy, one at a time; the nodes
    /// they went to, in their order (fewer than `n`: no node holds another so).
    pub(in crate::live) fn take_in_group(
        &mut self,
        job: &LiveJob,
        role: Role,
        n: u32,
        p: Process,
    ) -> Vec<String> {
        let mut groups = Groups::of_job(job, &[vec![role]], self);
        let mut went = Vec::new();
        for _ in 0..n {
            let Ok(on) = self.take_pinned(Vec::new(), vec![p], &groups) else {
                break;
            };
            if let Some(g) = groups.group_of(0) {
                groups.here[g][on[0]] += 1;
            }
            went.push(on[0]);
        }
        self.names_of(&went)
    }

    /// Up to `n` more processes `p` of `job`'s `role`, which is in its group `g` that shares
    /// devices: each to the node its index's partners run on (the job master lays the
    /// processes of one index out as one bundle), as far as they run and it fits there; the
    /// ones past them beside the group by its strategy ([`Free::take_in_group`]). The nodes
    /// they went to, in their order.
    pub(in crate::live) fn take_sharing(
        &mut self,
        job: &LiveJob,
        (g, role): (&LiveGroup, &LiveRole),
        n: u32,
        p: Process,
    ) -> Vec<String> {
        let partner = |k: u32| {
            g.roles
                .iter()
                .filter(|&&r| r != role.role)
                .filter_map(|&r| job.roles.iter().find(|x| x.role == r))
                .find_map(|x| x.nodes.get(k as usize).filter(|n| !n.is_empty()))
                .and_then(|n| self.node(n))
        };
        let pins: Vec<usize> = (role.count..role.count + n).map_while(partner).collect();
        let mut went = self.take_in_order(pins.len() as u32, p, |k| Some(pins[k as usize]));
        if went.len() == pins.len() && (went.len() as u32) < n {
            went.extend(self.take_in_group(job, role.role, n - went.len() as u32, p));
        }
        went
    }
}

/// The nodes `job`'s processes of `role` run on, as its reports say (none not known).
fn running_on(job: &LiveJob, role: Role) -> Vec<&str> {
    let named: Vec<&str> = if role == Role::WORKER {
        super::worker_nodes(job)
    } else if role == Role::PS {
        job.ps.processes.iter().map(|p| p.node.as_str()).collect()
    } else {
        job.roles
            .iter()
            .filter(|r| r.role == role)
            .flat_map(|r| r.nodes.iter().map(String::as_str))
            .collect()
    };
    named.into_iter().filter(|n| !n.is_empty()).collect()
}

/// `room` after `procs` are placed, and the node each went to, in their order: each group's
/// processes together by its strategy ([`lay_group`]), then the others largest first (those
/// with GPUs first), each on the node with the most CPU left that holds it. `Err`: the group
/// that could not be laid out (`None`: a process of no group found no node).
pub(in crate::live) fn placed(
    mut left: Vec<Room>,
    procs: &[Process],
    groups: &Groups,
) -> Result<(Vec<Room>, Vec<usize>), Option<usize>> {
    let nodes = left.len();
    let mut went = vec![0; procs.len()];
    for (g, group) in groups.list.iter().enumerate() {
        let members: Vec<usize> = (0..procs.len())
            .filter(|&k| groups.group_of(k) == Some(g))
            .collect();
        let mut here = groups
            .here
            .get(g)
            .cloned()
            .unwrap_or_else(|| vec![0; nodes]);
        if !members.is_empty() {
            lay_group(
                &mut left,
                procs,
                &members,
                group.strategy,
                &mut here,
                &mut went,
            )
            .ok_or(Some(g))?;
        }
    }
    let mut order: Vec<usize> = (0..procs.len())
        .filter(|&k| groups.group_of(k).is_none())
        .collect();
    order.sort_by(|&a, &b| procs[b].cmp(&procs[a]));
    for k in order {
        let i = super::freest(&left, procs[k]).ok_or(None)?;
        procs[k].take_from(&mut left[i]);
        went[k] = i;
    }
    Ok((left, went))
}

/// Lays `members` of `procs` out on `left` by `strategy` (see the module), beside the
/// group's processes `here` counts per node; `went[k]`: the node of process `k`. `None`:
/// the nodes cannot hold them so (`left` is then of no use).
fn lay_group(
    left: &mut [Room],
    procs: &[Process],
    members: &[usize],
    strategy: Strategy,
    here: &mut [u32],
    went: &mut [usize],
) -> Option<()> {
    let mut order: Vec<usize> = (0..left.len()).collect();
    order.sort_by(|&a, &b| left[b].cpu.cmp(&left[a].cpu));
    match strategy {
        Strategy::StrictPack => {
            let home = order.iter().copied().find(|&n| here[n] > 0);
            let holds_all = |n: usize| {
                let mut r = left[n].clone();
                members.iter().all(|&k| {
                    let fits = procs[k].fits_in(&r);
                    if fits {
                        procs[k].take_from(&mut r);
                    }
                    fits
                })
            };
            let n = order
                .iter()
                .copied()
                .filter(|&n| home.is_none_or(|h| h == n))
                .find(|&n| holds_all(n))?;
            for &k in members {
                procs[k].take_from(&mut left[n]);
                here[n] += 1;
                went[k] = n;
            }
        }
        Strategy::Pack | Strategy::Spread | Strategy::StrictSpread => {
            let mut big = members.to_vec();
            big.sort_by(|&a, &b| procs[b].cmp(&procs[a]));
            for k in big {
                let fits = order
                    .iter()
                    .copied()
                    .filter(|&n| procs[k].fits_in(&left[n]))
                    .filter(|&n| strategy != Strategy::StrictSpread || here[n] == 0);
                let n = match strategy {
                    Strategy::Pack => fits.min_by_key(|&n| Reverse(here[n])),
                    _ => fits.min_by_key(|&n| here[n]),
                }?;
                procs[k].take_from(&mut left[n]);
                here[n] += 1;
                went[k] = n;
            }
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(n: &[u64]) -> Vec<Room> {
        n.iter()
            .map(|&c| Room {
                cpu: c * 1000,
                memory: u64::MAX,
                gpus: 0,
                model: None,
                devices: Vec::new(),
            })
            .collect()
    }

    fn p(cpus: u64) -> Process {
        Process {
            gpus: 0,
            cpu: cpus * 1000,
            memory: 0,
            model: None,
        }
    }

    fn group(strategy: Strategy) -> Vec<LiveGroup> {
        vec![LiveGroup {
            share_devices: false,
            roles: vec![Role::new("rollout").unwrap()],
            strategy,
        }]
    }

    fn of(list: &[LiveGroup], tags: Vec<Option<usize>>, nodes: usize) -> Groups<'_> {
        Groups {
            list,
            of: tags,
            here: vec![vec![0; nodes]; list.len()],
        }
    }

    #[test]
    fn each_strategy_lays_its_group_out_as_the_job_master_would() {
        let room = cpus(&[8, 7, 4]);
        let procs = vec![p(1); 3];
        let tags = vec![Some(0); 3];
        let went = |s: Strategy| {
            let list = group(s);
            placed(room.clone(), &procs, &of(&list, tags.clone(), 3)).map(|(_, w)| w)
        };
        assert_eq!(went(Strategy::StrictPack), Ok(vec![0, 0, 0]));
        assert_eq!(went(Strategy::Pack), Ok(vec![0, 0, 0]));
        assert_eq!(went(Strategy::StrictSpread), Ok(vec![0, 1, 2]));
        assert_eq!(went(Strategy::Spread), Ok(vec![0, 1, 2]));
        // Without the group, each goes where the most CPU is left.
        let none = placed(room.clone(), &procs, &Groups::none()).unwrap().1;
        assert_eq!(none, vec![0, 0, 1]);
    }

    #[test]
    fn a_group_the_nodes_cannot_hold_so_is_named_and_the_others_are_not() {
        let room = cpus(&[8, 6, 4]);
        // Four strictly spread over three nodes.
        let list = group(Strategy::StrictSpread);
        let procs = vec![p(1); 4];
        let err = placed(room.clone(), &procs, &of(&list, vec![Some(0); 4], 3));
        assert_eq!(err.unwrap_err(), Some(0));
        // Nine CPUs packed strictly: no node has nine.
        let list = group(Strategy::StrictPack);
        let procs = vec![p(5), p(4)];
        assert_eq!(
            placed(room.clone(), &procs, &of(&list, vec![Some(0); 2], 3)).unwrap_err(),
            Some(0)
        );
        // A process of no group that fits nowhere.
        let procs = vec![p(9)];
        assert_eq!(
            placed(room.clone(), &procs, &Groups::none()).unwrap_err(),
            None
        );
    }

    #[test]
    fn a_groups_added_processes_go_beside_those_it_runs_already_by_its_strategy() {
        let room = cpus(&[8, 6, 4]);
        let procs = vec![p(1); 2];
        let beside = |s: Strategy, here: Vec<u32>| {
            let list = group(s);
            let g = Groups {
                list: &list,
                of: vec![Some(0); 2],
                here: vec![here],
            };
            placed(room.clone(), &procs, &g).map(|(_, w)| w)
        };
        // Strictly packed on the node the group runs on, though another has more room.
        assert_eq!(beside(Strategy::StrictPack, vec![0, 0, 1]), Ok(vec![2, 2]));
        // Strictly spread on the nodes without one of the group.
        assert_eq!(
            beside(Strategy::StrictSpread, vec![1, 0, 0]),
            Ok(vec![1, 2])
        );
        assert_eq!(beside(Strategy::StrictSpread, vec![1, 1, 0]), Err(Some(0)));
        // Packed where the group is most.
        assert_eq!(beside(Strategy::Pack, vec![0, 2, 1]), Ok(vec![1, 1]));
    }

    #[test]
    fn processes_outside_the_group_take_what_the_group_leaves() {
        let room = cpus(&[4, 4]);
        // A group of two 2-CPU processes strictly packed, and a 3-CPU worker: the group
        // first on node 0, the worker on node 1 (placed alone first, the worker would take
        // node 0 and leave no node for the pair).
        let list = group(Strategy::StrictPack);
        let procs = vec![p(3), p(2), p(2)];
        let g = of(&list, vec![None, Some(0), Some(0)], 2);
        assert_eq!(placed(room.clone(), &procs, &g).unwrap().1, vec![1, 0, 0]);
    }
}
