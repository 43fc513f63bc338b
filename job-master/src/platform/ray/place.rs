//! Placement on the Ray cluster: what a process asks Ray for, the node it fits on (counting our
//! own submissions Ray's usage report does not show yet), and the wait for room before a
//! submission (see the module above for why nothing is submitted that does not fit).

use std::time::Instant;

use tokio::sync::watch;

use super::Inner;
use super::api::{RayCluster, RayError, RayNode, RayResources, SubmitRequest};
use crate::error::Error;
use crate::spec::{Resources, Role};

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
    let mut s = format!("{} CPU", r.cpus);
    if r.gpus > 0.0 {
        s += &format!(", {} GPU", r.gpus);
    }
    if r.memory_bytes > 0 {
        s += &format!(", {} MiB", r.memory_bytes >> 20);
    }
    for (k, v) in &r.custom {
        s += &format!(", {v} {k}");
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
/// Ray's answer read at `read_at` does not show: of those with room (for a process without
/// GPUs, those without GPUs first, kept for the processes that need them, as Ray's own
/// scheduler does), the one with the most CPU left (the first listed among equals), as the
/// brain's round counts its processes; `None` when none has room.
fn choose_node(
    cluster: &RayCluster,
    recent: &[Placement],
    need: &RayResources,
    read_at: Instant,
) -> Option<String> {
    let spares_gpus = |n: &RayNode| need.gpus > 0.0 || n.total.gpus <= 0.0;
    cluster
        .nodes
        .iter()
        .filter_map(|n| {
            let room = room_on(n, recent, read_at);
            need.fits_in(&room)
                .then(|| ((spares_gpus(n), room.cpus), n.node_id.clone()))
        })
        // A node without GPUs for a process without them, then the most CPU left; the first
        // among equals.
        .reduce(|best, x| {
            let better = (x.0.0 && !best.0.0) || (x.0.0 == best.0.0 && x.0.1 > best.0.1);
            if better { x } else { best }
        })
        .map(|(_, id)| id)
}

/// What is free on node `n`: what Ray answered when read at `read_at`, less `recent`
/// placements of ours there that its answer does not show: those not running by then. A
/// running one does show: the cluster's free room counts what its supervisor actor holds
/// (`ray_client::RayApi::cluster`), alive before Ray calls the job running.
pub(super) fn room_on(n: &RayNode, recent: &[Placement], read_at: Instant) -> RayResources {
    let mut room = n.available.clone();
    for p in recent.iter().filter(|p| p.node_id == n.node_id) {
        if p.running_since.is_none_or(|t| t >= read_at) {
            room = room.minus(&p.need);
        }
    }
    room
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
        role: Role,
        cancel: &mut watch::Receiver<bool>,
    ) -> Result<(), Unplaced> {
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
                        let node = {
                            let recent = self.recent.lock().expect("not poisoned");
                            choose_node(&cluster, &recent, need, read_at)
                        };
                        if let Some(node_id) = node {
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
                            let free = cluster
                                .nodes
                                .iter()
                                .map(|n| format!("{}: {}", n.ip, describe(&n.available)))
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
            choose_node(&cluster, &[], &cpus(2.0), read_at).as_deref(),
            Some("a")
        );
        let mut recent = vec![Placement {
            submission_id: "x".into(),
            node_id: "a".into(),
            need: cpus(3.0),
            running_since: None,
        }];
        assert_eq!(choose_node(&cluster, &recent, &cpus(2.0), read_at), None);
        // One CPU is left on each node.
        assert!(choose_node(&cluster, &recent, &cpus(1.0), read_at).is_some());
        assert_eq!(choose_node(&cluster, &recent, &cpus(1.5), read_at), None);
        // Running only after the cluster was read: the answer did not show it yet.
        recent[0].running_since = Some(read_at + Duration::from_millis(5));
        assert_eq!(choose_node(&cluster, &recent, &cpus(2.0), read_at), None);
        // Running before: Ray's answer counts it (its supervisor actor), so we no longer do.
        recent[0].running_since = Some(read_at - Duration::from_millis(5));
        assert_eq!(
            choose_node(&cluster, &recent, &cpus(2.0), read_at).as_deref(),
            Some("a")
        );
        assert_eq!(choose_node(&cluster, &recent, &cpus(5.0), read_at), None);
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
        assert_eq!(
            choose_node(&cluster, &[], &cpus(2.0), now).as_deref(),
            Some("c")
        );
        assert_eq!(
            choose_node(&cluster, &[], &cpus(3.0), now).as_deref(),
            Some("g")
        );
        let gpus = RayResources {
            gpus: 1.0,
            ..cpus(1.0)
        };
        assert_eq!(choose_node(&cluster, &[], &gpus, now).as_deref(), Some("g"));
    }

    #[test]
    fn a_process_goes_to_the_freest_node_the_first_of_equals_and_is_pinned_there() {
        let mut b = node("b", 4.0, 3.0);
        b.ip = "10.0.0.2".into();
        let cluster = RayCluster {
            nodes: vec![node("a", 4.0, 2.0), b, node("c", 4.0, 3.0)],
        };
        let now = Instant::now();
        assert_eq!(
            choose_node(&cluster, &[], &cpus(1.0), now).as_deref(),
            Some("b")
        );
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
