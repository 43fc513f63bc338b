//! Placement on the Ray cluster: what a process asks Ray for, the node it fits on (counting our
//! own submissions Ray's usage report does not show yet), and the wait for room before a
//! submission (see the module above for why nothing is submitted that does not fit).

use std::time::Instant;

use tokio::sync::watch;

use super::Inner;
use super::api::{RayCluster, RayError, RayNode, RayResources, SubmitRequest};
use crate::error::Error;
use crate::platform::PlatformEvent;
use crate::spec::{Resources, Role};
use vocab::SlotKey;
use vocab::devices::DeviceUse;

/// One submission of ours that Ray's usage report may not show yet.
#[derive(Clone, Debug)]
pub(super) struct Placement {
    pub(super) submission_id: String,
    pub(super) node_id: String,
    pub(super) need: RayResources,
    pub(super) running_since: Option<Instant>,
}

/// A process's request from its resources; one CPU when it names none (Ray's default of zero
/// would let any number of agents pile onto one node).
pub fn request_of(r: Option<&Resources>) -> RayResources {
    let r = r.cloned().unwrap_or_default();
    let mut custom = r.custom;
    if let Some(model) = &r.gpu_type {
        let (name, amount) = ray_client::gpu_type_request(model);
        custom.insert(name, amount);
    }
    RayResources {
        cpus: r.cpu.map_or(1.0, |c| c.0 as f64 / 1000.0),
        gpus: r.gpu.unwrap_or_default().as_f64(),
        memory_bytes: r.memory.map_or(0, |m| m.0),
        custom,
    }
}

pub(super) fn describe(r: &RayResources) -> String {
    // To a thousandth, as Ray counts them: sums of shares print as 0.6, not 0.6000000000000001.
    let n = |x: f64| (x * 1000.0).round() / 1000.0;
    let mut s = format!("{} CPU", n(r.cpus));
    if r.gpus > 0.0 {
        s += &format!(", {} GPU", n(r.gpus));
    }
    if r.memory_bytes > 0 {
        s += &format!(", {} MiB", r.memory_bytes >> 20);
    }
    for (k, v) in &r.custom {
        s += &format!(", {} {k}", n(*v));
    }
    s
}

/// `req` pinned to node `node_id` of `cluster` (its address as a Ray resource).
fn pinned_to(cluster: &RayCluster, node_id: &str, req: &SubmitRequest) -> SubmitRequest {
    let mut pinned = req.clone();
    if let Some(n) = cluster.nodes.iter().find(|n| n.node_id == node_id) {
        let (k, v) = super::group::pin(&n.ip);
        pinned.entrypoint_resources.insert(k, v);
    }
    pinned
}

/// The node a process needing `need` fits on, counting `recent` placements of ours that
/// Ray's answer read at `read_at` does not show, and its GPUs device by device where how a
/// node's are split is known ([`devices_on`], from the devices our processes hold there,
/// `held`): the node `prefer` names (by address: where the brain's plan placed it) when it
/// has room; else, of those with room (for a process without GPUs, those without GPUs first,
/// kept for the processes that need them, as Ray's own scheduler does), the one with the
/// most CPU left (the first listed among equals), as the brain's round counts its
/// processes; `None` when none has room.
fn choose_node(
    cluster: &RayCluster,
    recent: &[Placement],
    held: &DeviceUse,
    need: &RayResources,
    prefer: Option<&str>,
    read_at: Instant,
) -> Option<String> {
    let spares_gpus = |n: &RayNode| need.gpus > 0.0 || n.total.gpus <= 0.0;
    let gpus = milli(need.gpus);
    let room_for = |n: &RayNode| {
        let room = room_on(n, recent, read_at);
        let on_devices = || {
            gpus == 0
                || devices_on(n, held, recent, read_at)
                    .is_none_or(|d| vocab::devices::fits_on_devices(&d, gpus))
        };
        (need.fits_in(&room) && on_devices()).then_some(room)
    };
    if let Some(n) = prefer.and_then(|ip| cluster.nodes.iter().find(|n| n.ip == ip))
        && room_for(n).is_some()
    {
        return Some(n.node_id.clone());
    }
    cluster
        .nodes
        .iter()
        .filter_map(|n| room_for(n).map(|room| ((spares_gpus(n), room.cpus), n.node_id.clone())))
        // A node without GPUs for a process without them, then the most CPU left; the first
        // among equals.
        .reduce(|best, x| {
            let better = (x.0.0 && !best.0.0) || (x.0.0 == best.0.0 && x.0.1 > best.0.1);
            if better { x } else { best }
        })
        .map(|(_, id)| id)
}

/// What the job's events say when `key`'s process goes to node `node_id`, not to the node
/// the plan placed it on (`prefer`): that node, gone or without room now, and where it went.
fn not_where_planned(
    cluster: &RayCluster,
    key: SlotKey,
    prefer: Option<&str>,
    node_id: &str,
) -> Option<String> {
    let planned = prefer?;
    let went = cluster.nodes.iter().find(|n| n.node_id == node_id)?;
    if went.ip == planned {
        return None;
    }
    let why = match cluster.nodes.iter().any(|n| n.ip == planned) {
        true => "has no room for it now",
        false => "is not among the nodes offered to the job (gone, cordoned or avoided)",
    };
    Some(format!(
        "{key}: the plan placed it on {planned}, which {why}; placed on {} instead",
        went.ip
    ))
}

/// Whether a placement of ours read at `read_at` is not in Ray's answer yet: not running by
/// then. A running one is: the cluster's free room counts what its supervisor actor holds
/// (`ray_client::RayApi::cluster`), alive before Ray calls the job running.
fn not_shown(p: &Placement, read_at: Instant) -> bool {
    p.running_since.is_none_or(|t| t >= read_at)
}

/// What is free on node `n`: what Ray answered when read at `read_at`, less `recent`
/// placements of ours there that its answer does not show.
pub(super) fn room_on(n: &RayNode, recent: &[Placement], read_at: Instant) -> RayResources {
    let mut room = n.available.clone();
    for p in recent
        .iter()
        .filter(|p| p.node_id == n.node_id && not_shown(p, read_at))
    {
        room = room.minus(&p.need);
    }
    room
}

/// Thousandths of a device.
pub(super) fn milli(gpus: f64) -> u32 {
    (gpus.max(0.0) * 1000.0).round() as u32
}

/// Node `n`'s free GPUs device by device (each device's free thousandths), where how they
/// are split is known: rebuilt from Ray's free amount and the devices our processes hold
/// there (`held`), as [`vocab::devices::free_by_device`] lays the rest out, less `recent`
/// placements of ours that Ray's answer read at `read_at` does not show, taken as Ray will
/// hand them out. `None` for a node without GPUs, or one none of whose devices we hold and
/// whose GPUs Ray counts neither all free nor all used.
pub(super) fn devices_on(
    n: &RayNode,
    held: &DeviceUse,
    recent: &[Placement],
    read_at: Instant,
) -> Option<Vec<u32>> {
    let total = n.total.gpus.round() as u32;
    if total == 0 {
        return None;
    }
    let mut devices =
        vocab::devices::free_by_device(total, milli(n.available.gpus), held.on(&n.ip))?;
    for p in recent
        .iter()
        .filter(|p| p.node_id == n.node_id && not_shown(p, read_at))
    {
        // One that does not fit so (a view already off) is left to Ray's amount.
        let _ = vocab::devices::take_on_devices(&mut devices, milli(p.need.gpus));
    }
    Some(devices)
}

/// Node `n`'s free room as a message says it, its GPUs' split where it is known and they
/// are split (`4 CPU, 0.6 GPU (0.3 + 0.3 by device)`).
pub(super) fn free_shown(
    n: &RayNode,
    held: &DeviceUse,
    recent: &[Placement],
    read_at: Instant,
) -> String {
    let mut s = describe(&room_on(n, recent, read_at));
    if let Some(split) = devices_on(n, held, recent, read_at)
        .as_deref()
        .and_then(vocab::devices::shown)
    {
        s += &format!(" ({split} by device)");
    }
    s
}

/// Why an agent never got into Ray.
pub(super) enum Unplaced {
    /// The master stopped the slot first.
    Stopped,
    /// No node had room within `place_timeout`: the process is still pending.
    NoRoom(Error),
    /// Ray refused the submission.
    Refused(Error),
}

impl Inner {
    /// Waits for room and submits; `Err` says why the agent never got into Ray.
    pub(super) async fn place(
        &self,
        req: &SubmitRequest,
        need: &RayResources,
        key: SlotKey,
        prefer: Option<&str>,
        cancel: &mut watch::Receiver<bool>,
    ) -> Result<(), Unplaced> {
        let role = key.role;
        use std::sync::atomic::Ordering::SeqCst;
        struct Waiting<'a>(Option<&'a std::sync::atomic::AtomicUsize>);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if let Some(n) = self.0 {
                    n.fetch_sub(1, SeqCst);
                }
            }
        }
        // Counted by `launch` already (before any worker could look), given back here.
        let _waiting = Waiting((role == Role::PS).then_some(&self.waiting_ps));
        let refused = |problem: String| Error::Launch {
            platform: "ray",
            what: format!("agent {}", req.submission_id),
            problem,
        };
        let deadline = Instant::now() + self.settings.place_timeout;
        let mut last: String;
        loop {
            if *cancel.borrow() {
                return Err(Unplaced::Stopped);
            }
            if role == Role::WORKER && self.waiting_ps.load(SeqCst) > 0 {
                last = "a parameter server of the job is placed first".into();
            } else {
                let _one_at_a_time = self.placing.lock().await;
                let read_at = Instant::now();
                match self.api.cluster().await {
                    Ok(cluster) => {
                        *self.totals.lock().expect("not poisoned") =
                            cluster.nodes.iter().map(|n| n.total.clone()).collect();
                        let cluster = self.offered(cluster);
                        let held = self.devices_known();
                        let node = {
                            let recent = self.recent.lock().expect("not poisoned");
                            choose_node(&cluster, &recent, &held, need, prefer, read_at)
                        };
                        if let Some(node_id) = node {
                            if let Some(note) = not_where_planned(&cluster, key, prefer, &node_id) {
                                self.tell(PlatformEvent::Note(note)).await;
                            }
                            // Ray would place a job wherever it has room: the process is
                            // pinned to the node chosen here (off cordoned and avoided nodes,
                            // where the brain's round counted it).
                            let pinned = pinned_to(&cluster, &node_id, req);
                            self.recent.lock().expect("not poisoned").push(Placement {
                                submission_id: req.submission_id.clone(),
                                node_id,
                                need: need.clone(),
                                running_since: None,
                            });
                            match self.api.submit(&pinned).await {
                                Ok(()) => return Ok(()),
                                Err(RayError::Duplicate(id)) => {
                                    return self.adopt(&id).await.map_err(Unplaced::Refused);
                                }
                                // Asked again on the next pass, until the deadline.
                                Err(e) if e.is_transient() => {
                                    self.forget(&req.submission_id);
                                    tracing::warn!(id = %req.submission_id, "{e}; trying again");
                                    last = e.to_string();
                                }
                                Err(e) => {
                                    self.forget(&req.submission_id);
                                    return Err(Unplaced::Refused(e.into()));
                                }
                            }
                        } else {
                            let recent = self.recent.lock().expect("not poisoned");
                            let free = cluster
                                .nodes
                                .iter()
                                .map(|n| {
                                    format!("{}: {}", n.ip, free_shown(n, &held, &recent, read_at))
                                })
                                .collect::<Vec<_>>()
                                .join("; ");
                            last = format!("no node has room (free: {free})");
                        }
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            if Instant::now() >= deadline {
                return Err(Unplaced::NoRoom(refused(format!(
                    "Ray could not place {} within {} s: {last}",
                    describe(need),
                    self.settings.place_timeout.as_secs()
                ))));
            }
            tokio::select! {
                _ = tokio::time::sleep(self.settings.poll) => {}
                _ = cancel.changed() => {}
            }
        }
    }

    /// A duplicate submission id: ours if Ray still runs it (a retried submission whose first
    /// answer was lost), a failure if it already ended.
    async fn adopt(&self, id: &str) -> Result<(), Error> {
        let refused = |problem: String| Error::Launch {
            platform: "ray",
            what: format!("agent {id}"),
            problem,
        };
        match self.api.job(id).await {
            Ok(Some(info)) if !info.status.is_terminal() => {
                tracing::info!(id, "Ray already had this submission; watching it");
                Ok(())
            }
            Ok(Some(info)) => {
                self.forget(id);
                Err(refused(format!(
                    "Ray already has a job with submission_id {id}, and it ended ({:?})",
                    info.status
                )))
            }
            Ok(None) => {
                self.forget(id);
                Err(refused(format!(
                    "Ray refused submission_id {id} as a duplicate but does not know it"
                )))
            }
            Err(e) => {
                self.forget(id);
                Err(e.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::api::RayNode;
    use super::*;
    use crate::spec::{Bytes, Millicores};
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn node(id: &str, cpus: f64, free: f64) -> RayNode {
        RayNode {
            node_id: id.into(),
            ip: "127.0.0.1".into(),
            is_head: id == "a",
            total: RayResources {
                cpus,
                ..Default::default()
            },
            available: RayResources {
                cpus: free,
                ..Default::default()
            },
        }
    }

    /// [`choose_node`] where no device of any node is known held.
    fn chosen(
        cluster: &RayCluster,
        recent: &[Placement],
        need: &RayResources,
        read_at: Instant,
    ) -> Option<String> {
        choose_node(cluster, recent, &DeviceUse::default(), need, None, read_at)
    }

    fn cpus(n: f64) -> RayResources {
        RayResources {
            cpus: n,
            ..Default::default()
        }
    }

    #[test]
    fn recent_placements_count_until_ray_shows_them_running() {
        let cluster = RayCluster {
            nodes: vec![node("a", 4.0, 4.0), node("b", 2.0, 1.0)],
        };
        let read_at = Instant::now();
        assert_eq!(
            chosen(&cluster, &[], &cpus(2.0), read_at).as_deref(),
            Some("a")
        );
        let mut recent = vec![Placement {
            submission_id: "x".into(),
            node_id: "a".into(),
            need: cpus(3.0),
            running_since: None,
        }];
        assert_eq!(chosen(&cluster, &recent, &cpus(2.0), read_at), None);
        // One CPU is left on each node.
        assert!(chosen(&cluster, &recent, &cpus(1.0), read_at).is_some());
        assert_eq!(chosen(&cluster, &recent, &cpus(1.5), read_at), None);
        // Running only after the cluster was read: the answer did not show it yet.
        recent[0].running_since = Some(read_at + Duration::from_millis(5));
        assert_eq!(chosen(&cluster, &recent, &cpus(2.0), read_at), None);
        // Running before: Ray's answer counts it (its supervisor actor), so we no longer do.
        recent[0].running_since = Some(read_at - Duration::from_millis(5));
        assert_eq!(
            chosen(&cluster, &recent, &cpus(2.0), read_at).as_deref(),
            Some("a")
        );
        assert_eq!(chosen(&cluster, &recent, &cpus(5.0), read_at), None);
    }

    #[test]
    fn a_process_goes_where_the_plan_placed_it_while_that_node_has_room() {
        let on = |id: &str, ip: &str, free: f64| RayNode {
            ip: ip.into(),
            ..node(id, 4.0, free)
        };
        let cluster = RayCluster {
            nodes: vec![on("a", "10.0.0.1", 4.0), on("b", "10.0.0.2", 2.0)],
        };
        let now = Instant::now();
        let key = SlotKey {
            role: Role::WORKER,
            index: 3,
        };
        let go = |need: f64, prefer: Option<&str>| {
            choose_node(
                &cluster,
                &[],
                &DeviceUse::default(),
                &cpus(need),
                prefer,
                now,
            )
        };
        // b has less CPU left than a, but the plan named it.
        assert_eq!(go(2.0, None).as_deref(), Some("a"));
        assert_eq!(go(2.0, Some("10.0.0.2")).as_deref(), Some("b"));
        assert_eq!(
            not_where_planned(&cluster, key, Some("10.0.0.2"), "b"),
            None
        );
        // b no longer holds it: the freest that does, and the events say why.
        assert_eq!(go(3.0, Some("10.0.0.2")).as_deref(), Some("a"));
        assert_eq!(
            not_where_planned(&cluster, key, Some("10.0.0.2"), "a").as_deref(),
            Some(
                "worker-3: the plan placed it on 10.0.0.2, which has no room for it now; \
                 placed on 10.0.0.1 instead"
            )
        );
        // A node not offered (gone, cordoned or avoided).
        assert_eq!(go(2.0, Some("10.0.0.9")).as_deref(), Some("a"));
        assert!(
            not_where_planned(&cluster, key, Some("10.0.0.9"), "a")
                .unwrap()
                .contains("10.0.0.9, which is not among the nodes offered to the job")
        );
        assert_eq!(go(5.0, Some("10.0.0.1")), None);
    }

    #[test]
    fn a_process_without_gpus_goes_to_a_node_without_them_while_one_holds_it() {
        let mut gpu = node("g", 8.0, 8.0);
        gpu.total.gpus = 2.0;
        gpu.available.gpus = 2.0;
        let cluster = RayCluster {
            nodes: vec![gpu, node("c", 4.0, 2.0)],
        };
        let now = Instant::now();
        // g has more CPU left, but c holds it.
        assert_eq!(chosen(&cluster, &[], &cpus(2.0), now).as_deref(), Some("c"));
        assert_eq!(chosen(&cluster, &[], &cpus(3.0), now).as_deref(), Some("g"));
        let gpus = RayResources {
            gpus: 1.0,
            ..cpus(1.0)
        };
        assert_eq!(chosen(&cluster, &[], &gpus, now).as_deref(), Some("g"));
    }

    #[test]
    fn a_share_goes_only_to_a_node_with_a_device_that_holds_it() {
        let gpu_node = |id: &str, cpus: f64, free_cpus: f64, free_gpus: f64| {
            let mut n = node(id, cpus, free_cpus);
            n.ip = format!("10.0.0.{}", id.len());
            (n.total.gpus, n.available.gpus) = (2.0, free_gpus);
            n
        };
        // v: 0.6 free by Ray's amount, more CPU than w; w: both devices free.
        let cluster = RayCluster {
            nodes: vec![gpu_node("v", 8.0, 6.0, 0.6), gpu_node("ww", 8.0, 2.0, 2.0)],
        };
        let share = RayResources {
            gpus: 0.5,
            ..cpus(1.0)
        };
        let now = Instant::now();
        let mut held = DeviceUse::default();
        assert_eq!(
            choose_node(&cluster, &[], &held, &share, None, now).as_deref(),
            Some("v"),
            "not known how v's GPUs are split: its amount holds the share"
        );
        // Ours hold 0.7 of v's device 0, so the other 0.7 Ray counts used is on device 1.
        held.add("10.0.0.1", "0", vocab::Gpus::from_milli(700));
        assert_eq!(
            choose_node(&cluster, &[], &held, &share, None, now).as_deref(),
            Some("ww")
        );
        assert_eq!(
            free_shown(&cluster.nodes[0], &held, &[], now),
            "6 CPU, 0.6 GPU (0.3 + 0.3 by device)"
        );
        // Two 0.7 shares of ours placed on w that Ray does not show yet, taken as Ray will
        // hand them out: 0.3 + 0.3 left there too, and the share waits.
        let placed = |id: &str| Placement {
            submission_id: id.into(),
            node_id: "ww".into(),
            need: RayResources {
                gpus: 0.7,
                ..cpus(0.0)
            },
            running_since: None,
        };
        let recent = vec![placed("a"), placed("b")];
        assert_eq!(
            choose_node(&cluster, &recent, &held, &share, None, now),
            None
        );
        assert_eq!(
            free_shown(&cluster.nodes[1], &held, &recent, now),
            "2 CPU, 0.6 GPU (0.3 + 0.3 by device)"
        );
        // A smaller share still fits on either: v has more CPU.
        let small = RayResources {
            gpus: 0.3,
            ..cpus(1.0)
        };
        assert_eq!(
            choose_node(&cluster, &recent, &held, &small, None, now).as_deref(),
            Some("v")
        );
    }

    #[test]
    fn a_process_goes_to_the_freest_node_the_first_of_equals_and_is_pinned_there() {
        let mut b = node("b", 4.0, 3.0);
        b.ip = "10.0.0.2".into();
        let cluster = RayCluster {
            nodes: vec![node("a", 4.0, 2.0), b, node("c", 4.0, 3.0)],
        };
        let now = Instant::now();
        assert_eq!(chosen(&cluster, &[], &cpus(1.0), now).as_deref(), Some("b"));
        let req = SubmitRequest {
            entrypoint: "exec agent".into(),
            submission_id: "x".into(),
            entrypoint_num_cpus: 1.0,
            entrypoint_num_gpus: 0.0,
            entrypoint_memory: None,
            entrypoint_resources: BTreeMap::new(),
            runtime_env: Default::default(),
            metadata: BTreeMap::new(),
        };
        let pinned = pinned_to(&cluster, "b", &req);
        assert_eq!(
            pinned.entrypoint_resources,
            [("node:10.0.0.2".to_string(), 0.001)].into()
        );
        assert_eq!(pinned.entrypoint_num_cpus, 1.0);
    }

    #[test]
    fn a_process_without_resources_asks_for_one_cpu() {
        assert_eq!(request_of(None), cpus(1.0));
        let r = Resources {
            cpu: Some(Millicores(500)),
            memory: Some(Bytes(1 << 30)),
            gpu: Some(vocab::Gpus::ONE),
            gpu_type: Some("V100".into()),
            custom: [("slot".to_string(), 2.0)].into(),
        };
        let q = request_of(Some(&r));
        assert_eq!((q.cpus, q.gpus, q.memory_bytes), (0.5, 1.0, 1 << 30));
        assert_eq!(q.custom.get("slot"), Some(&2.0));
        assert!(
            q.custom.contains_key("accelerator_type:V100"),
            "lands on a V100 node only: {q:?}"
        );
    }
}
