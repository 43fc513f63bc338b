//! Placement groups on Ray for a job's `placement:` (`vocab::spec::PlacementGroup`): one bundle
//! per process, laid over the nodes by the group's strategy all at once, before any of its
//! processes is submitted; each process is then pinned to its bundle's node (`node:<address>`,
//! the resource Ray gives every node) and asks for its own resources there as any process does.
//!
//! Why not Ray's own placement groups: a Ray job cannot make one through the Job Submission
//! API, and a driver of ours that did (tried on Ray 2.60, the version `.ci` installs) hit two
//! faults of Ray's: jobs submitted into a group's bundles never gave the bundle's resources back
//! when they ended (`bundle_group_<i>_<id>` stayed 999.999 of 1000 with every job and its
//! supervisor actor dead), and removing a group whose bundles Ray still counted as used made the
//! raylet abort (`ReturnBundle`: "Bundle resources are still in use"), taking the node and every
//! process on it down. So the master places the bundles itself, on the nodes' free room as Ray
//! reports it less what the master submitted that the report does not show yet, and keeps each
//! bundle's node for the job's life: a process that fails comes back on its bundle's node, and
//! only a process whose node is gone from Ray is laid out anew. What this gives up against
//! Ray's groups: the room is not held for the group between the layout and the submissions (a
//! process that then finds its node full waits, and says so, as any process does).
//!
//! A group that shares devices (`share_devices`) is laid out one bundle per index, holding
//! process `i` of each of its roles; a process whose partner of its index is laid out already
//! goes to its node. On that node each process asks Ray for its share of a GPU (`num_gpus:
//! 0.5`), and Ray hands shares out of one device while it has room (its fractional GPUs), so
//! the partners' `CUDA_VISIBLE_DEVICES` name one GPU; the agents report the devices they were
//! given, which the cluster test checks.

use std::collections::BTreeMap;

use super::Inner;
use super::api::{RayCluster, RayResources};
use super::describe;
use crate::error::Error;
use vocab::spec::Strategy;
use vocab::{Role, SlotKey};

/// One placement group of the job as planned: its strategy, what each of its roles' processes
/// asks for, and the processes it starts with (laid out together, before any is submitted).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupPlan {
    /// `actor+critic`.
    pub name: String,
    pub strategy: Strategy,
    /// Process `i` of each role is one bundle (they share a device).
    pub share_devices: bool,
    pub roles: BTreeMap<Role, RayResources>,
    pub initial: Vec<SlotKey>,
}

/// The resource that pins a process to the node at `ip`: a sliver of `node:<ip>`.
pub(super) fn pin(ip: &str) -> (String, f64) {
    (format!("node:{ip}"), 0.001)
}

fn plus(a: &RayResources, b: &RayResources) -> RayResources {
    let mut custom = a.custom.clone();
    for (k, v) in &b.custom {
        *custom.entry(k.clone()).or_default() += v;
    }
    RayResources {
        cpus: a.cpus + b.cpus,
        gpus: a.gpus + b.gpus,
        memory_bytes: a.memory_bytes.saturating_add(b.memory_bytes),
        custom,
    }
}

/// Lays `bundles` over `nodes` (address, free room, and how many of the group's processes are
/// laid out there already) by `strategy`; returns each bundle's node address, or why the nodes
/// cannot hold them.
pub(super) fn lay_out(
    strategy: Strategy,
    bundles: &[RayResources],
    nodes: &[(String, RayResources, usize)],
) -> Result<Vec<String>, String> {
    let free: Vec<RayResources> = nodes.iter().map(|(_, r, _)| r.clone()).collect();
    let mut room = free.clone();
    // The nodes with the most free CPU first, as Ray's own spread would.
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|a, b| room[*b].cpus.total_cmp(&room[*a].cpus));
    let mut at: Vec<Option<usize>> = vec![None; bundles.len()];
    match strategy {
        Strategy::StrictPack => {
            let all = bundles
                .iter()
                .fold(RayResources::default(), |s, b| plus(&s, b));
            // Where the group is already, if it is anywhere.
            let home = order.iter().copied().find(|n| nodes[*n].2 > 0);
            let n = order
                .iter()
                .copied()
                .filter(|n| home.is_none_or(|h| h == *n))
                .find(|n| all.fits_in(&room[*n]))
                .ok_or_else(|| match home {
                    Some(h) => format!(
                        "its node {} has no room for {} more of its processes ({})",
                        nodes[h].0,
                        bundles.len(),
                        describe(&all)
                    ),
                    None => format!(
                        "no node has room for its {} processes together ({})",
                        bundles.len(),
                        describe(&all)
                    ),
                })?;
            at.iter_mut().for_each(|a| *a = Some(n));
        }
        Strategy::Pack | Strategy::Spread | Strategy::StrictSpread => {
            // The largest first, so that the small ones fill what is left.
            let mut big: Vec<usize> = (0..bundles.len()).collect();
            big.sort_by(|a, b| bundles[*b].cpus.total_cmp(&bundles[*a].cpus));
            let mut members: Vec<usize> = nodes.iter().map(|(_, _, m)| *m).collect();
            for b in big {
                let fits = order
                    .iter()
                    .copied()
                    .filter(|n| bundles[b].fits_in(&room[*n]))
                    .filter(|n| strategy != Strategy::StrictSpread || members[*n] == 0);
                // `fits` goes most free first, and `min_by_key` keeps the first of equals.
                let chosen = match strategy {
                    // Where the group is most, then the most free.
                    Strategy::Pack => fits.min_by_key(|n| std::cmp::Reverse(members[*n])),
                    // Where the group is least, then the most free.
                    _ => fits.min_by_key(|n| members[*n]),
                };
                let Some(n) = chosen else {
                    return Err(match strategy {
                        Strategy::StrictSpread => format!(
                            "it needs {} nodes each with room for one of its processes ({}), \
                             and {} of the {} nodes have that room",
                            bundles.len() + nodes.iter().map(|(_, _, m)| m).sum::<usize>(),
                            describe(&bundles[b]),
                            free.iter().filter(|r| bundles[b].fits_in(r)).count(),
                            nodes.len()
                        ),
                        _ => format!(
                            "no node has room for its process {} ({})",
                            b,
                            describe(&bundles[b])
                        ),
                    });
                };
                room[n] = room[n].minus(&bundles[b]);
                members[n] += 1;
                at[b] = Some(n);
            }
        }
    }
    Ok(at
        .into_iter()
        .map(|n| nodes[n.expect("every bundle laid")].0.clone())
        .collect())
}

impl Inner {
    /// The node address of `key`'s bundle in group `g`. The group's first processes are laid
    /// out together at the first launch; a process beyond them (the role grown) is laid out
    /// beside the group as its strategy says; a process whose node is gone from Ray is laid out
    /// anew. `Err`: why the cluster cannot hold it now (the process stays pending and is asked
    /// for again).
    pub(super) async fn bundle_node(&self, g: usize, key: SlotKey) -> Result<String, Error> {
        let plan = &self.settings.placement[g];
        let unplaced = |problem: String| Error::Launch {
            platform: "ray",
            what: format!("placement group {} ({})", plan.name, plan.strategy.as_str()),
            problem,
        };
        let mut layouts = self.groups.lock().await;
        let layout = &mut layouts[g];
        if let Some(node) = layout.get(&key) {
            return Ok(node.clone());
        }
        // A node gone from Ray, or cordoned by the brain: its processes are laid out anew.
        let read_at = std::time::Instant::now();
        let cluster = self.offered(self.api.cluster().await?);
        layout.retain(|_, ip| cluster.nodes.iter().any(|n| n.ip == *ip));
        if plan.share_devices
            && let Some(ip) = layout
                .iter()
                .find(|(k, _)| k.index == key.index)
                .map(|(_, ip)| ip.clone())
        {
            layout.insert(key, ip.clone());
            return Ok(ip);
        }
        let keys: Vec<SlotKey> = if layout.is_empty() {
            let mut first = plan.initial.clone();
            if !first.contains(&key) {
                first.push(key);
            }
            first
        } else {
            vec![key]
        };
        let (units, bundles) = bundles_of(plan, &keys).map_err(unplaced)?;
        let nodes = self
            .lay_out_group(plan, (&cluster, read_at), layout, &bundles)
            .map_err(unplaced)?;
        self.note(format!(
            "placement group {} ({}) laid out: {}{}",
            plan.name,
            plan.strategy.as_str(),
            units
                .iter()
                .zip(&bundles)
                .zip(&nodes)
                .map(|((unit, r), n)| {
                    let names: Vec<String> = unit.iter().map(|k| k.to_string()).collect();
                    format!("{} ({}) on {n}", names.join("+"), describe(r))
                })
                .collect::<Vec<_>>()
                .join(", "),
            if layout.is_empty() {
                String::new()
            } else {
                format!(", beside {} of the group", layout.len())
            }
        ))
        .await;
        for (unit, node) in units.into_iter().zip(nodes) {
            layout.extend(unit.into_iter().map(|k| (k, node.clone())));
        }
        Ok(layout[&key].clone())
    }

    /// [`Self::bundle_node`], asked again every poll until the place timeout (or a stop) while
    /// the cluster cannot hold the process.
    pub(super) async fn bundle_node_within(
        &self,
        g: usize,
        key: SlotKey,
        cancel: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<String, Error> {
        let deadline = std::time::Instant::now() + self.settings.place_timeout;
        loop {
            match self.bundle_node(g, key).await {
                Ok(ip) => return Ok(ip),
                Err(e) if std::time::Instant::now() >= deadline || *cancel.borrow() => {
                    return Err(e);
                }
                Err(_) => {
                    tokio::select! {
                        _ = tokio::time::sleep(self.settings.poll) => {}
                        _ = cancel.changed() => {}
                    }
                }
            }
        }
    }

    /// Lays `bundles` out beside the group's `layout` on the nodes' free room (`cluster`, as
    /// read at that instant) less what this master submitted that Ray's answer does not show.
    fn lay_out_group(
        &self,
        plan: &GroupPlan,
        (cluster, read_at): (&RayCluster, std::time::Instant),
        layout: &BTreeMap<SlotKey, String>,
        bundles: &[RayResources],
    ) -> Result<Vec<String>, String> {
        let room: Vec<(String, RayResources, usize)> = {
            let recent = self.recent.lock().expect("not poisoned");
            cluster
                .nodes
                .iter()
                .map(|n| {
                    let free = super::place::room_on(n, &recent, read_at);
                    let members = layout.values().filter(|ip| **ip == n.ip).count();
                    (n.ip.clone(), free, members)
                })
                .collect()
        };
        lay_out(plan.strategy, bundles, &room).map_err(|why| {
            format!(
                "the cluster cannot hold it now: {why} (free: {})",
                room.iter()
                    .map(|(ip, r, _)| format!("{ip}: {}", describe(r)))
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })
    }
}

/// `keys` as the group's bundles: one a process, or the processes of one index when the
/// group shares devices; with what each bundle asks for together. `Err`: a key of no role of
/// the group.
fn bundles_of(
    plan: &GroupPlan,
    keys: &[SlotKey],
) -> Result<(Vec<Vec<SlotKey>>, Vec<RayResources>), String> {
    let units: Vec<Vec<SlotKey>> = if plan.share_devices {
        let mut by_index: BTreeMap<u32, Vec<SlotKey>> = BTreeMap::new();
        for k in keys {
            by_index.entry(k.index).or_default().push(*k);
        }
        by_index.into_values().collect()
    } else {
        keys.iter().map(|k| vec![*k]).collect()
    };
    let bundles = units
        .iter()
        .map(|unit| {
            unit.iter().try_fold(RayResources::default(), |sum, k| {
                plan.roles
                    .get(&k.role)
                    .map(|r| plus(&sum, r))
                    .ok_or_else(|| format!("{k} is not of its roles"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((units, bundles))
}

/// Every process of the group, with its pinning resource added.
pub(super) fn pinned(need: &RayResources, ip: &str) -> RayResources {
    let mut r = need.clone();
    let (k, v) = pin(ip);
    r.custom.insert(k, v);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(n: f64) -> RayResources {
        RayResources {
            cpus: n,
            ..Default::default()
        }
    }

    fn nodes(free: &[f64]) -> Vec<(String, RayResources, usize)> {
        free.iter()
            .enumerate()
            .map(|(i, c)| (format!("10.0.0.{i}"), cpus(*c), 0))
            .collect()
    }

    #[test]
    fn each_strategy_lays_the_bundles_out_as_rays_would_or_says_why_not() {
        let three = [cpus(1.0), cpus(1.0), cpus(1.0)];
        // strict_pack: one node with room for all three, the freest.
        assert_eq!(
            lay_out(Strategy::StrictPack, &three, &nodes(&[2.0, 4.0, 3.0])).unwrap(),
            vec!["10.0.0.1"; 3]
        );
        let e = lay_out(Strategy::StrictPack, &three, &nodes(&[2.0, 2.0, 2.0])).unwrap_err();
        assert!(
            e.contains("no node has room for its 3 processes together (3 CPU)"),
            "{e}"
        );
        // strict_spread: one per node, or none.
        let mut spread = lay_out(Strategy::StrictSpread, &three, &nodes(&[1.0, 4.0, 2.0])).unwrap();
        spread.sort();
        assert_eq!(spread, vec!["10.0.0.0", "10.0.0.1", "10.0.0.2"]);
        let four = [cpus(0.5), cpus(0.5), cpus(0.5), cpus(0.5)];
        let e = lay_out(Strategy::StrictSpread, &four, &nodes(&[4.0, 4.0, 4.0])).unwrap_err();
        assert!(
            e.contains("it needs 4 nodes") && e.contains("3 of the 3 nodes"),
            "{e}"
        );
        let e = lay_out(Strategy::StrictSpread, &three, &nodes(&[4.0, 0.5, 4.0])).unwrap_err();
        assert!(e.contains("2 of the 3 nodes have that room"), "{e}");
        // pack: as few nodes as the room allows.
        let packed = lay_out(Strategy::Pack, &three, &nodes(&[2.0, 1.0, 0.0])).unwrap();
        assert_eq!(packed.iter().filter(|n| *n == "10.0.0.0").count(), 2);
        // Between equal nodes, the freest first: node 1 here.
        assert_eq!(
            lay_out(Strategy::Pack, &[cpus(1.0)], &nodes(&[2.0, 3.0])).unwrap(),
            vec!["10.0.0.1"]
        );
        // spread: as many as the room allows.
        let spread = lay_out(Strategy::Spread, &three, &nodes(&[3.0, 3.0])).unwrap();
        assert!(spread.contains(&"10.0.0.0".into()) && spread.contains(&"10.0.0.1".into()));
        assert!(lay_out(Strategy::Spread, &[cpus(5.0)], &nodes(&[4.0])).is_err());
    }

    #[test]
    fn a_grown_group_is_laid_out_beside_the_processes_it_has() {
        // Members on nodes 0 and 1 already.
        let mut at = nodes(&[4.0, 4.0, 4.0, 1.0]);
        at[0].2 = 1;
        at[1].2 = 1;
        // strict_spread: a node free of the group, with room.
        assert_eq!(
            lay_out(Strategy::StrictSpread, &[cpus(1.0)], &at).unwrap(),
            vec!["10.0.0.2"]
        );
        at[2].2 = 1;
        at[3].1 = cpus(0.5);
        let e = lay_out(Strategy::StrictSpread, &[cpus(1.0)], &at).unwrap_err();
        assert!(
            e.contains("it needs 4 nodes") && e.contains("3 of the 4 nodes"),
            "{e}"
        );
        // spread: the node with the fewest of the group.
        assert_eq!(
            lay_out(Strategy::Spread, &[cpus(0.5)], &at).unwrap(),
            vec!["10.0.0.3"]
        );
        // pack: where the group is; strict_pack: only there.
        let mut home = nodes(&[4.0, 1.0, 4.0]);
        home[1].2 = 2;
        assert_eq!(
            lay_out(Strategy::Pack, &[cpus(1.0)], &home).unwrap(),
            vec!["10.0.0.1"]
        );
        assert_eq!(
            lay_out(Strategy::StrictPack, &[cpus(1.0)], &home).unwrap(),
            vec!["10.0.0.1"]
        );
        let e = lay_out(Strategy::StrictPack, &[cpus(2.0)], &home).unwrap_err();
        assert!(
            e.contains("its node 10.0.0.1 has no room for 1 more"),
            "{e}"
        );
    }

    #[test]
    fn a_group_that_shares_devices_is_one_bundle_per_index() {
        let (w, r): (Role, Role) = ("worker".parse().unwrap(), "rollout".parse().unwrap());
        let half = RayResources {
            cpus: 1.0,
            gpus: 0.5,
            ..Default::default()
        };
        let plan = GroupPlan {
            name: "worker+rollout".into(),
            strategy: Strategy::StrictSpread,
            share_devices: true,
            roles: [(w, half.clone()), (r, half.clone())].into(),
            initial: Vec::new(),
        };
        let k = |role, index| SlotKey { role, index };
        let keys = [k(w, 0), k(w, 1), k(r, 0), k(r, 1), k(r, 2)];
        let (units, bundles) = bundles_of(&plan, &keys).unwrap();
        assert_eq!(
            units,
            vec![
                vec![k(w, 0), k(r, 0)],
                vec![k(w, 1), k(r, 1)],
                vec![k(r, 2)]
            ]
        );
        assert_eq!((bundles[0].cpus, bundles[0].gpus), (2.0, 1.0));
        assert_eq!((bundles[2].cpus, bundles[2].gpus), (1.0, 0.5));
        // Without sharing: a bundle a process.
        let apart = GroupPlan {
            share_devices: false,
            ..plan.clone()
        };
        assert_eq!(bundles_of(&apart, &keys).unwrap().0.len(), 5);
        let critic: Role = "critic".parse().unwrap();
        assert!(bundles_of(&plan, &[k(critic, 0)]).is_err());
    }

    #[test]
    fn a_pinned_process_asks_for_a_sliver_of_its_node() {
        let r = pinned(&cpus(1.5), "10.0.0.7");
        assert_eq!(r.cpus, 1.5);
        assert_eq!(r.custom.get("node:10.0.0.7"), Some(&0.001));
    }
}
