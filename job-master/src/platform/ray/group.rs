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
//! given, which the cluster test checks. A bundle goes only to a node with one device that
//! holds its shares together, where how the node's GPUs are split is known (the devices the
//! job's processes hold there, `place::devices_on`): 0.5 free on each of two devices holds no
//! pair of halves. Ray still picks each partner's device on the node, one at a time by best
//! fit, so the node must also land every partner on that one device whichever is asked for
//! first (`vocab::devices::land_together`): where one device has exactly one partner's share
//! free and another the whole pair's, the first partner would take the first.

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
    /// Where the brain's round placed its first processes (a start's, `--start-nodes`), by
    /// node address: the group's first layout where it holds on the nodes as they are.
    pub named: BTreeMap<SlotKey, String>,
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

/// A node as a group's layout sees it: its address, its free room, how many of the group's
/// processes are laid out there already, and its free GPUs device by device where how they
/// are split is known (`place::devices_on`).
#[derive(Clone, Debug, Default)]
pub(super) struct GroupNode {
    pub(super) ip: String,
    pub(super) free: RayResources,
    pub(super) members: usize,
    pub(super) devices: Option<Vec<u32>>,
}

impl GroupNode {
    /// Whether bundle `b` fits in it: its room, and, where how its GPUs are split is known,
    /// its GPUs on its devices as Ray hands them out: a bundle of processes that share a
    /// device (`shares`, each one's thousandths) on one device whichever of them Ray is asked
    /// for first ([`vocab::devices::land_together`]).
    fn holds(&self, b: &RayResources, shares: &[u32]) -> bool {
        b.fits_in(&self.free)
            && self.devices.as_ref().is_none_or(|d| match shares {
                [_, _, ..] => vocab::devices::land_together(d, shares),
                _ => vocab::devices::fits_on_devices(d, super::place::milli(b.gpus)),
            })
    }

    /// Takes bundle `b` off it, as [`GroupNode::holds`] found room for it.
    fn take(&mut self, b: &RayResources, shares: &[u32]) {
        self.free = self.free.minus(b);
        if let Some(d) = &mut self.devices {
            match shares {
                [_, _, ..] => shares.iter().for_each(|&g| {
                    let _ = vocab::devices::take_on_devices(d, g);
                }),
                _ => {
                    let _ = vocab::devices::take_on_devices(d, super::place::milli(b.gpus));
                }
            }
        }
        self.members += 1;
    }
}

/// Lays `bundles` over `nodes` by `strategy`; returns each bundle's node address, or why the
/// nodes cannot hold them. `shares[i]`: the GPU thousandths of each process of bundle `i`
/// where they share one device (none past its end, or fewer than two: one process).
pub(super) fn lay_out(
    strategy: Strategy,
    bundles: &[RayResources],
    shares: &[Vec<u32>],
    nodes: &[GroupNode],
) -> Result<Vec<String>, String> {
    let shares = |b: usize| shares.get(b).map_or(&[][..], Vec::as_slice);
    let mut room = nodes.to_vec();
    // The nodes with the most free CPU first, as Ray's own spread would.
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|a, b| room[*b].free.cpus.total_cmp(&room[*a].free.cpus));
    let mut at: Vec<Option<usize>> = vec![None; bundles.len()];
    match strategy {
        Strategy::StrictPack => {
            let all = bundles
                .iter()
                .fold(RayResources::default(), |s, b| plus(&s, b));
            // Where the group is already, if it is anywhere.
            let home = order.iter().copied().find(|n| nodes[*n].members > 0);
            let holds_all = |n: usize| {
                let mut node = nodes[n].clone();
                bundles.iter().enumerate().all(|(i, b)| {
                    let fits = node.holds(b, shares(i));
                    node.take(b, shares(i));
                    fits
                })
            };
            let n = order
                .iter()
                .copied()
                .filter(|n| home.is_none_or(|h| h == *n))
                .find(|n| holds_all(*n))
                .ok_or_else(|| match home {
                    Some(h) => format!(
                        "its node {} has no room for {} more of its processes ({})",
                        nodes[h].ip,
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
            for b in big {
                let fits = order
                    .iter()
                    .copied()
                    .filter(|n| room[*n].holds(&bundles[b], shares(b)))
                    .filter(|n| strategy != Strategy::StrictSpread || room[*n].members == 0);
                // `fits` goes most free first, and `min_by_key` keeps the first of equals.
                let chosen = match strategy {
                    // Where the group is most, then the most free.
                    Strategy::Pack => fits.min_by_key(|n| std::cmp::Reverse(room[*n].members)),
                    // Where the group is least, then the most free.
                    _ => fits.min_by_key(|n| room[*n].members),
                };
                let Some(n) = chosen else {
                    return Err(match strategy {
                        Strategy::StrictSpread => format!(
                            "it needs {} nodes each with room for one of its processes ({}), \
                             and {} of the {} nodes have that room",
                            bundles.len() + nodes.iter().map(|n| n.members).sum::<usize>(),
                            describe(&bundles[b]),
                            nodes
                                .iter()
                                .filter(|n| n.holds(&bundles[b], shares(b)))
                                .count(),
                            nodes.len()
                        ),
                        _ => format!(
                            "no node has room for its process {} ({})",
                            b,
                            describe(&bundles[b])
                        ),
                    });
                };
                room[n].take(&bundles[b], shares(b));
                at[b] = Some(n);
            }
        }
    }
    Ok(at
        .into_iter()
        .map(|n| nodes[n.expect("every bundle laid")].ip.clone())
        .collect())
}

/// `bundles` on the nodes `named` gives each (by address), if the nodes hold them there now
/// and the layout keeps `strategy`; `Err`: why not.
pub(super) fn lay_out_named(
    strategy: Strategy,
    bundles: &[RayResources],
    shares: &[Vec<u32>],
    nodes: &[GroupNode],
    named: &[String],
) -> Result<Vec<String>, String> {
    let shares = |b: usize| shares.get(b).map_or(&[][..], Vec::as_slice);
    let mut room = nodes.to_vec();
    for (b, (bundle, ip)) in bundles.iter().zip(named).enumerate() {
        let n = room
            .iter()
            .position(|n| n.ip == *ip)
            .ok_or_else(|| format!("{ip} is not among the nodes offered to the job"))?;
        if strategy == Strategy::StrictSpread && room[n].members > 0 {
            return Err(format!("two of its processes on {ip}"));
        }
        if !room[n].holds(bundle, shares(b)) {
            return Err(format!(
                "{ip} has no room for its process {b} ({}) now",
                describe(bundle)
            ));
        }
        room[n].take(bundle, shares(b));
    }
    let homes = room.iter().filter(|n| n.members > 0).count();
    if strategy == Strategy::StrictPack && homes > 1 {
        return Err(format!("its processes on {homes} nodes"));
    }
    Ok(named.to_vec())
}

impl Inner {
    /// The node address of `key`'s bundle in group `g`. The group's first processes are laid
    /// out together at the first launch (where the brain's round placed them, if it did and
    /// that holds); a process beyond them (the role grown) is laid out beside the group as its
    /// strategy says, on `prefer` (the plan's node for it) where that keeps the strategy and
    /// holds it; a process whose node is gone from Ray is laid out anew. `Err`: why the
    /// cluster cannot hold it now (the process stays pending and is asked for again).
    pub(super) async fn bundle_node(
        &self,
        g: usize,
        key: SlotKey,
        prefer: Option<&str>,
    ) -> Result<String, Error> {
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
        // The group's first layout as the brain's round placed it, where it named every unit.
        let named = match layout.is_empty() {
            true => units
                .iter()
                .map(|u| plan.named.get(&u[0]).cloned())
                .collect::<Option<Vec<_>>>(),
            false => prefer.map(|ip| vec![ip.to_string()]),
        };
        let (nodes, how) = self
            .lay_out_group(plan, (&cluster, read_at), layout, (&units, &bundles), named)
            .map_err(unplaced)?;
        self.note(format!(
            "placement group {} ({}) laid out{how}: {}{}",
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
        prefer: Option<&str>,
        cancel: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<String, Error> {
        let deadline = std::time::Instant::now() + self.settings.place_timeout;
        loop {
            match self.bundle_node(g, key, prefer).await {
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
    /// read at that instant) less what this master submitted that Ray's answer does not show:
    /// on the nodes `named` gives each where they hold them so ([`lay_out_named`]), else by
    /// the group's strategy. Each bundle's node, and how the events say it was chosen.
    fn lay_out_group(
        &self,
        plan: &GroupPlan,
        (cluster, read_at): (&RayCluster, std::time::Instant),
        layout: &BTreeMap<SlotKey, String>,
        (units, bundles): (&[Vec<SlotKey>], &[RayResources]),
        named: Option<Vec<String>>,
    ) -> Result<(Vec<String>, String), String> {
        let shares = shares_of(plan, units);
        let held = self.devices_known();
        let recent = self.recent.lock().expect("not poisoned").clone();
        let room: Vec<GroupNode> = cluster
            .nodes
            .iter()
            .map(|n| GroupNode {
                ip: n.ip.clone(),
                free: super::place::room_on(n, &recent, read_at),
                members: layout.values().filter(|ip| **ip == n.ip).count(),
                devices: super::place::devices_on(n, &held, &recent, read_at),
            })
            .collect();
        let how = match named.map(|on| lay_out_named(plan.strategy, bundles, &shares, &room, &on)) {
            Some(Ok(on)) => return Ok((on, " as the brain's round placed it".into())),
            Some(Err(why)) => {
                format!(" (not as the brain's round placed it, which does not hold now: {why})")
            }
            None => String::new(),
        };
        let on = lay_out(plan.strategy, bundles, &shares, &room).map_err(|why| {
            format!(
                "the cluster cannot hold it now: {why} (free: {})",
                cluster
                    .nodes
                    .iter()
                    .map(|n| format!(
                        "{}: {}",
                        n.ip,
                        super::place::free_shown(n, &held, &recent, read_at)
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })?;
        Ok((on, how))
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

/// The GPU thousandths of each process of each of `units` whose processes share one device
/// (a `share_devices` group's bundle of two or more with GPUs); empty for the others.
fn shares_of(plan: &GroupPlan, units: &[Vec<SlotKey>]) -> Vec<Vec<u32>> {
    units
        .iter()
        .map(|unit| match plan.share_devices && unit.len() > 1 {
            true => unit
                .iter()
                .filter_map(|k| plan.roles.get(&k.role))
                .map(|r| super::place::milli(r.gpus))
                .filter(|&g| g > 0)
                .collect(),
            false => Vec::new(),
        })
        .collect()
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

    fn nodes(free: &[f64]) -> Vec<GroupNode> {
        free.iter()
            .enumerate()
            .map(|(i, c)| GroupNode {
                ip: format!("10.0.0.{i}"),
                free: cpus(*c),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn each_strategy_lays_the_bundles_out_as_rays_would_or_says_why_not() {
        let three = [cpus(1.0), cpus(1.0), cpus(1.0)];
        // strict_pack: one node with room for all three, the freest.
        assert_eq!(
            lay_out(Strategy::StrictPack, &three, &[], &nodes(&[2.0, 4.0, 3.0])).unwrap(),
            vec!["10.0.0.1"; 3]
        );
        let e = lay_out(Strategy::StrictPack, &three, &[], &nodes(&[2.0, 2.0, 2.0])).unwrap_err();
        assert!(
            e.contains("no node has room for its 3 processes together (3 CPU)"),
            "{e}"
        );
        // strict_spread: one per node, or none.
        let mut spread = lay_out(
            Strategy::StrictSpread,
            &three,
            &[],
            &nodes(&[1.0, 4.0, 2.0]),
        )
        .unwrap();
        spread.sort();
        assert_eq!(spread, vec!["10.0.0.0", "10.0.0.1", "10.0.0.2"]);
        let four = [cpus(0.5), cpus(0.5), cpus(0.5), cpus(0.5)];
        let e = lay_out(Strategy::StrictSpread, &four, &[], &nodes(&[4.0, 4.0, 4.0])).unwrap_err();
        assert!(
            e.contains("it needs 4 nodes") && e.contains("3 of the 3 nodes"),
            "{e}"
        );
        let e = lay_out(
            Strategy::StrictSpread,
            &three,
            &[],
            &nodes(&[4.0, 0.5, 4.0]),
        )
        .unwrap_err();
        assert!(e.contains("2 of the 3 nodes have that room"), "{e}");
        // pack: as few nodes as the room allows.
        let packed = lay_out(Strategy::Pack, &three, &[], &nodes(&[2.0, 1.0, 0.0])).unwrap();
        assert_eq!(packed.iter().filter(|n| *n == "10.0.0.0").count(), 2);
        // Between equal nodes, the freest first: node 1 here.
        assert_eq!(
            lay_out(Strategy::Pack, &[cpus(1.0)], &[], &nodes(&[2.0, 3.0])).unwrap(),
            vec!["10.0.0.1"]
        );
        // spread: as many as the room allows.
        let spread = lay_out(Strategy::Spread, &three, &[], &nodes(&[3.0, 3.0])).unwrap();
        assert!(spread.contains(&"10.0.0.0".into()) && spread.contains(&"10.0.0.1".into()));
        assert!(lay_out(Strategy::Spread, &[cpus(5.0)], &[], &nodes(&[4.0])).is_err());
    }

    #[test]
    fn a_grown_group_is_laid_out_beside_the_processes_it_has() {
        // Members on nodes 0 and 1 already.
        let mut at = nodes(&[4.0, 4.0, 4.0, 1.0]);
        at[0].members = 1;
        at[1].members = 1;
        // strict_spread: a node free of the group, with room.
        assert_eq!(
            lay_out(Strategy::StrictSpread, &[cpus(1.0)], &[], &at).unwrap(),
            vec!["10.0.0.2"]
        );
        at[2].members = 1;
        at[3].free = cpus(0.5);
        let e = lay_out(Strategy::StrictSpread, &[cpus(1.0)], &[], &at).unwrap_err();
        assert!(
            e.contains("it needs 4 nodes") && e.contains("3 of the 4 nodes"),
            "{e}"
        );
        // spread: the node with the fewest of the group.
        assert_eq!(
            lay_out(Strategy::Spread, &[cpus(0.5)], &[], &at).unwrap(),
            vec!["10.0.0.3"]
        );
        // pack: where the group is; strict_pack: only there.
        let mut home = nodes(&[4.0, 1.0, 4.0]);
        home[1].members = 2;
        assert_eq!(
            lay_out(Strategy::Pack, &[cpus(1.0)], &[], &home).unwrap(),
            vec!["10.0.0.1"]
        );
        assert_eq!(
            lay_out(Strategy::StrictPack, &[cpus(1.0)], &[], &home).unwrap(),
            vec!["10.0.0.1"]
        );
        let e = lay_out(Strategy::StrictPack, &[cpus(2.0)], &[], &home).unwrap_err();
        assert!(
            e.contains("its node 10.0.0.1 has no room for 1 more"),
            "{e}"
        );
    }

    #[test]
    fn the_brains_layout_is_taken_where_it_holds_and_keeps_the_strategy() {
        let one = [cpus(1.0), cpus(1.0)];
        let on = |ips: &[&str]| ips.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let at = nodes(&[4.0, 1.0, 2.0]);
        // Not where the group's own layout would put them (the freest), but they hold there.
        let named = on(&["10.0.0.1", "10.0.0.2"]);
        let taken = lay_out_named(Strategy::StrictSpread, &one, &[], &at, &named);
        assert_eq!(taken.unwrap(), named);
        assert_ne!(
            lay_out(Strategy::StrictSpread, &one, &[], &at).unwrap(),
            named
        );
        // Two on one node breaks strict_spread; two nodes break strict_pack.
        let two = on(&["10.0.0.0", "10.0.0.0"]);
        let e = lay_out_named(Strategy::StrictSpread, &one, &[], &at, &two).unwrap_err();
        assert!(e.contains("two of its processes on 10.0.0.0"), "{e}");
        assert!(lay_out_named(Strategy::StrictPack, &one, &[], &at, &two).is_ok());
        let e = lay_out_named(Strategy::StrictPack, &one, &[], &at, &named).unwrap_err();
        assert!(e.contains("its processes on 2 nodes"), "{e}");
        // A node without the room now, or not offered.
        let full = on(&["10.0.0.1", "10.0.0.1"]);
        let e = lay_out_named(Strategy::Pack, &one, &[], &at, &full).unwrap_err();
        assert!(
            e.contains("10.0.0.1 has no room for its process 1 (1 CPU) now"),
            "{e}"
        );
        let gone = on(&["10.0.0.9", "10.0.0.1"]);
        let e = lay_out_named(Strategy::Spread, &one, &[], &at, &gone).unwrap_err();
        assert!(e.contains("10.0.0.9 is not among the nodes offered"), "{e}");
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
            named: BTreeMap::new(),
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
        assert_eq!(
            shares_of(&plan, &units),
            vec![vec![500, 500], vec![500, 500], vec![]]
        );
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
    fn a_bundle_of_shares_goes_only_where_one_device_holds_them_together() {
        let pair = RayResources {
            cpus: 1.0,
            gpus: 1.0,
            ..Default::default()
        };
        let gpu_node = |i: usize, devices: Option<Vec<u32>>| GroupNode {
            ip: format!("10.0.0.{i}"),
            free: RayResources {
                gpus: devices
                    .as_ref()
                    .map_or(1.0, |d| d.iter().sum::<u32>() as f64 / 1000.0),
                ..cpus(4.0 - i as f64)
            },
            devices,
            ..Default::default()
        };
        let halves = vec![vec![500, 500]; 3];
        // Node 0 has a whole GPU's room by its amount, split 0.5 + 0.5 over two devices: the
        // two halves of a pair would land on two devices there.
        let nodes = vec![
            gpu_node(0, Some(vec![500, 500])),
            gpu_node(1, Some(vec![1000, 0])),
            gpu_node(2, Some(vec![1000, 1000])),
        ];
        let mut spread = lay_out(
            Strategy::StrictSpread,
            &[pair.clone(), pair.clone()],
            &halves,
            &nodes,
        )
        .unwrap();
        spread.sort();
        assert_eq!(spread, vec!["10.0.0.1", "10.0.0.2"]);
        let e = lay_out(
            Strategy::StrictSpread,
            &vec![pair.clone(); 3],
            &halves,
            &nodes,
        )
        .unwrap_err();
        assert!(e.contains("2 of the 3 nodes have that room"), "{e}");
        // strict_pack of two pairs: node 2 holds a device for each.
        assert_eq!(
            lay_out(
                Strategy::StrictPack,
                &[pair.clone(), pair.clone()],
                &halves,
                &nodes
            )
            .unwrap(),
            vec!["10.0.0.2"; 2]
        );
        // 0.3 + 0.7: on node 0 of 0.3 + 1 free, the 0.3 asked for first fits device 0 best and
        // the 0.7 cannot follow; node 1 (0.7 and nothing free) holds no whole GPU; node 2 holds
        // the pair on one device whichever comes first.
        let mut uneven = nodes.clone();
        (uneven[0].devices, uneven[0].free.gpus) = (Some(vec![300, 1000]), 1.3);
        (uneven[1].devices, uneven[1].free.gpus) = (Some(vec![700, 0]), 0.7);
        assert_eq!(
            lay_out(
                Strategy::Pack,
                std::slice::from_ref(&pair),
                &[vec![300, 700]],
                &uneven
            )
            .unwrap(),
            vec!["10.0.0.2"]
        );
        // Where the split is not known, the amount decides, as before.
        let unknown = vec![gpu_node(0, None)];
        assert_eq!(
            lay_out(Strategy::Pack, std::slice::from_ref(&pair), &[], &unknown).unwrap(),
            vec!["10.0.0.0"]
        );
    }

    #[test]
    fn a_pinned_process_asks_for_a_sliver_of_its_node() {
        let r = pinned(&cpus(1.5), "10.0.0.7");
        assert_eq!(r.cpus, 1.5);
        assert_eq!(r.custom.get("node:10.0.0.7"), Some(&0.001));
    }
}
