//! The Ray platform: every worker agent runs as a Ray job, submitted through the Job Submission
//! REST API of an existing Ray cluster's dashboard (default port 8265). The entrypoint `exec`s
//! the worker-agent binary (which must exist at the same path on Ray's nodes) with the slot's
//! role, index and incarnation; the process's CPU, GPU, memory and custom resources become
//! `entrypoint_num_cpus`, `entrypoint_num_gpus`, `entrypoint_memory` and
//! `entrypoint_resources`. Each process is pinned to a node (its address as a Ray resource):
//! the one with the most CPU left that holds it (for a process without GPUs, a node without
//! GPUs while one holds it), off cordoned and avoided nodes, as the brain's round counts it; a process of a placement group (the spec's `placement:`) to the node its
//! group's layout gave it (`group`).
//!
//! How Ray's rough edges are met (the HTTP side is in [`api`], placement in `place`):
//! * A PENDING Ray job cannot be stopped until Ray places it (Ray answers "stopped" and keeps
//!   it waiting, then fails it after its start timeout, 15 min by default). So nothing is
//!   submitted that does not fit: before each submission the platform reads every node's free
//!   resources (what its alive actors hold counted at once; Ray's usage report lags placement
//!   by seconds), subtracts what it submitted itself that Ray does not run yet, and submits
//!   only when some node has room; otherwise it
//!   waits, re-reading, up to `place_timeout_ms`, then reports the agent as not placed (the job
//!   master asks again, without counting a relaunch: the process is pending, and the brain,
//!   told how long, may give it up). A process bigger than any node is refused at once. Should
//!   a submitted job still wait (another Ray user took the room), a stop is repeated once Ray
//!   places it. The job master learns that a process is placed when Ray runs it: only then
//!   does its register timeout start.
//! * Each process gets its own `submission_id` (`brain-<job>-<role>-<index>-<incarnation>-<run>`,
//!   the run part unique per job-master start). A duplicate answers HTTP 500: the platform
//!   asks Ray for that job and adopts it when it is still live (a retried submission whose
//!   first answer was lost), and reports a failure otherwise.
//! * A job deleted right after it ends can reappear as FAILED: the platform never deletes a
//!   job it watches; it stops watching a submission once it saw it end, so a late reappearance
//!   is never read as a new failure. Ray keeps the records (with their logs) as its job history.
//! * Error bodies are plain text: errors carry the HTTP status and the body's last line.
//! * A failed agent's event carries Ray's message and the last lines of its log.

pub use ray_client as api;

mod check;
mod group;
mod place;

pub use group::GroupPlan;
pub use place::request_of;
use place::{Placement, Unplaced, describe};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, mpsc, watch};

use self::api::{RayApi, RayCluster, RayJobStatus, RayResources, SubmitRequest};
use super::{AgentLaunch, Platform, PlatformEvent};
use crate::error::Error;
use crate::scale::Capacity;
use crate::spec::{Bytes, Millicores, Role};
use vocab::SlotKey;

/// How the Ray platform reaches and uses a Ray cluster.
#[derive(Clone, Debug)]
pub struct RaySettings {
    /// The dashboard, e.g. `http://127.0.0.1:8265`.
    pub address: String,
    /// The worker-agent binary, at this path on every Ray node.
    pub agent_bin: PathBuf,
    /// The job's name (part of every submission id).
    pub job_name: String,
    /// Processes of the job at once [default: the cluster's whole CPUs].
    pub max_processes: Option<u32>,
    /// How long a process may wait for room before it counts as failed to place.
    pub place_timeout: Duration,
    /// How often job status is polled.
    pub poll: Duration,
    /// Environment variables for every agent.
    pub env: BTreeMap<String, String>,
    /// The job's placement groups (`group`): each laid over the nodes whole before its
    /// processes are submitted, each process pinned to its bundle's node.
    pub placement: Vec<GroupPlan>,
}

impl RaySettings {
    pub fn new(address: &str, agent_bin: PathBuf, job_name: &str) -> RaySettings {
        RaySettings {
            address: address.into(),
            agent_bin,
            job_name: job_name.into(),
            max_processes: None,
            place_timeout: Duration::from_secs(60),
            poll: Duration::from_millis(250),
            env: BTreeMap::new(),
            placement: Vec::new(),
        }
    }
}

struct Slot {
    incarnation: u64,
    submission_id: String,
    /// Set when the master asks the slot to stop.
    cancel: watch::Sender<bool>,
    /// Set once the submission is in Ray (a stop must go to Ray then).
    submitted: watch::Receiver<bool>,
    /// Set when the watcher is done (the Ray job ended or was never submitted).
    done: watch::Receiver<bool>,
}

struct Inner {
    api: RayApi,
    settings: RaySettings,
    run: String,
    events: mpsc::Sender<PlatformEvent>,
    slots: Mutex<BTreeMap<SlotKey, Slot>>,
    /// One placement decision at a time, so two launches never count the same room.
    placing: Mutex<()>,
    /// Parameter servers of this job waiting for room: no worker is placed meanwhile, so
    /// workers never take the room a PS needs (a PS job cannot train without its PS, and
    /// workers given up for room would leave it waiting for ever).
    waiting_ps: std::sync::atomic::AtomicUsize,
    recent: std::sync::Mutex<Vec<Placement>>,
    /// Each alive node's totals, as last read.
    totals: std::sync::Mutex<Vec<RayResources>>,
    /// Each placement group's layout (each process's node address), by its place in
    /// `settings.placement`.
    groups: Mutex<Vec<BTreeMap<SlotKey, String>>>,
    /// Nodes the brain cordoned (addresses): not offered to new processes.
    cordoned: std::sync::RwLock<Vec<String>>,
    /// Nodes the job avoids (addresses where a straggler of it ran): not offered either.
    avoided: std::sync::RwLock<Vec<String>>,
    /// The GPUs the job's alive processes hold, device by device on their nodes, as the
    /// master last told them ([`Platform::devices_held`]).
    held: std::sync::RwLock<vocab::devices::DeviceUse>,
    /// The GPUs the brain's other jobs hold, as the brain last told them
    /// ([`Platform::others_devices`]).
    others: std::sync::RwLock<vocab::devices::DeviceUse>,
}

impl Inner {
    /// The GPUs known held, device by device: the job's own processes' and, where the brain
    /// told them, its other jobs'.
    fn devices_known(&self) -> vocab::devices::DeviceUse {
        let mut held = self.held.read().expect("not poisoned").clone();
        held.merge(&self.others.read().expect("not poisoned"));
        held
    }

    /// `cluster` less the nodes the brain cordoned and those the job avoids: where new
    /// processes may go.
    fn offered(&self, mut cluster: RayCluster) -> RayCluster {
        let out = self.cordoned.read().expect("not poisoned");
        let avoided = self.avoided.read().expect("not poisoned");
        cluster
            .nodes
            .retain(|n| !out.contains(&n.ip) && !avoided.contains(&n.ip));
        cluster
    }
}

pub struct RayPlatform {
    inner: Arc<Inner>,
    capacity: Capacity,
}

impl RayPlatform {
    /// Checks that Ray answers and reads its nodes.
    pub async fn connect(
        settings: RaySettings,
        events: mpsc::Sender<PlatformEvent>,
    ) -> Result<RayPlatform, Error> {
        let api = RayApi::new(&settings.address)?;
        let version = api.version().await?;
        let cluster = api.cluster().await?;
        let largest = |f: &dyn Fn(&RayResources) -> f64| {
            cluster
                .nodes
                .iter()
                .map(|n| f(&n.total))
                .fold(0.0, f64::max)
        };
        let total_cpus = cluster.sum(|n| &n.total).cpus;
        let capacity = Capacity {
            max_processes: settings
                .max_processes
                .unwrap_or((total_cpus.floor() as u32).max(1)),
            cpu: Millicores((largest(&|r| r.cpus) * 1000.0) as u64),
            memory: Bytes(largest(&|r| r.memory_bytes as f64) as u64),
            gpus: largest(&|r| r.gpus) as u32,
        };
        tracing::info!(
            address = api.address(),
            ray = version,
            nodes = cluster.nodes.len(),
            cpus = total_cpus,
            "connected to Ray"
        );
        let run = format!(
            "{:x}{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64 & 0xffff_ffff)
        );
        let totals = cluster.nodes.iter().map(|n| n.total.clone()).collect();
        let groups = Mutex::new(vec![BTreeMap::new(); settings.placement.len()]);
        Ok(RayPlatform {
            inner: Arc::new(Inner {
                api,
                settings,
                run,
                events,
                slots: Mutex::default(),
                placing: Mutex::default(),
                waiting_ps: Default::default(),
                recent: std::sync::Mutex::default(),
                totals: std::sync::Mutex::new(totals),
                groups,
                cordoned: std::sync::RwLock::default(),
                avoided: std::sync::RwLock::default(),
                held: std::sync::RwLock::default(),
                others: std::sync::RwLock::default(),
            }),
            capacity,
        })
    }

    /// The submission id of a slot's incarnation in this run of the job master.
    pub fn submission_id(&self, key: SlotKey, incarnation: u64) -> String {
        let job = self.inner.job_part();
        format!("brain-{job}-{key}-{incarnation}-{}", self.inner.run)
    }
}

impl Inner {
    /// The job's name as it goes into submission ids.
    fn job_part(&self) -> String {
        self.settings
            .job_name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect()
    }

    /// Something for the job's events.
    async fn note(&self, text: String) {
        self.tell(PlatformEvent::Note(text)).await;
    }

    async fn tell(&self, event: PlatformEvent) {
        let _ = self.events.send(event).await;
    }

    fn forget(&self, submission_id: &str) {
        self.recent
            .lock()
            .expect("not poisoned")
            .retain(|p| p.submission_id != submission_id);
    }

    /// Follows a submitted job to its end, telling the master when Ray runs it; returns how
    /// it ended.
    async fn watch(
        &self,
        id: &str,
        cancel: &watch::Receiver<bool>,
        key: SlotKey,
        incarnation: u64,
    ) -> String {
        let mut failures = 0u32;
        let mut stop_sent_while_running = false;
        let mut placed = false;
        loop {
            tokio::time::sleep(self.settings.poll).await;
            match self.api.job(id).await {
                Ok(Some(info)) => {
                    failures = 0;
                    if info.status == RayJobStatus::Running {
                        if !placed {
                            placed = true;
                            self.tell(PlatformEvent::Placed { key, incarnation }).await;
                        }
                        {
                            let mut recent = self.recent.lock().expect("not poisoned");
                            if let Some(p) = recent.iter_mut().find(|p| p.submission_id == id)
                                && p.running_since.is_none()
                            {
                                p.running_since = Some(Instant::now());
                                if let Some(node) = &info.driver_node_id {
                                    p.node_id = node.clone();
                                }
                            }
                        }
                        // A stop sent while Ray still held the job PENDING did nothing.
                        if *cancel.borrow() && !stop_sent_while_running {
                            stop_sent_while_running = true;
                            if let Err(e) = self.api.stop(id).await {
                                tracing::warn!(id, "stopping a Ray job: {e}");
                            }
                        }
                    }
                    if info.status.is_terminal() {
                        return self.ending(id, &info).await;
                    }
                }
                Ok(None) => return format!("Ray job {id} is gone from Ray"),
                Err(e) => {
                    failures += 1;
                    // Ray's dashboard restarting for a moment is not the agent failing.
                    if failures as u128 * self.settings.poll.as_millis() > 30_000 {
                        return format!("lost contact with Ray while watching {id}: {e}");
                    }
                }
            }
        }
    }

    async fn ending(&self, id: &str, info: &api::RayJobInfo) -> String {
        let mut d = info.headline(id);
        if info.status == RayJobStatus::Failed {
            match self.api.logs(id).await {
                Ok(logs) if !logs.trim().is_empty() => {
                    d += &format!("; {}", super::last_lines(&logs, 10));
                }
                Ok(_) => {}
                Err(e) => d += &format!("; its log could not be read: {e}"),
            }
        }
        d
    }
}

#[async_trait::async_trait]
impl Platform for RayPlatform {
    fn name(&self) -> &'static str {
        "ray"
    }

    async fn launch(&self, l: AgentLaunch) -> Result<(), Error> {
        self.stop(l.key, Duration::ZERO).await;
        let inner = &self.inner;
        let need = request_of(l.resources.as_ref());
        let fits_a_node = inner
            .totals
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|t| need.fits_in(t));
        if !fits_a_node {
            return Err(Error::Launch {
                platform: "ray",
                what: format!("agent {}", l.key),
                problem: format!(
                    "it needs {}, more than any node of the Ray cluster at {} has",
                    describe(&need),
                    inner.api.address()
                ),
            });
        }
        let id = self.submission_id(l.key, l.incarnation);
        let group = inner
            .settings
            .placement
            .iter()
            .position(|g| g.roles.contains_key(&l.key.role));
        let command = [
            inner.settings.agent_bin.to_string_lossy().into_owned(),
            "agent".into(),
            "--master".into(),
            format!("http://{}", l.master_addr),
            "--role".into(),
            l.key.role.to_string(),
            "--index".into(),
            l.key.index.to_string(),
            "--incarnation".into(),
            l.incarnation.to_string(),
        ];
        let command =
            shlex::try_join(command.iter().map(String::as_str)).map_err(|e| Error::Launch {
                platform: "ray",
                what: format!("agent {}", l.key),
                problem: format!("cannot quote its command line: {e}"),
            })?;
        let mut env = inner.settings.env.clone();
        // What the spec set for its agents, its processes get too (nothing else of the
        // agent's environment reaches them).
        let passed: Vec<&str> = inner.settings.env.keys().map(String::as_str).collect();
        if !passed.is_empty() {
            env.insert(vocab::sandbox::PASS_ENV.into(), passed.join(","));
        }
        env.insert("BRAIN_RAY_SUBMISSION_ID".into(), id.clone());
        // The path of the job's secret, not the secret: Ray shows a job's environment on its
        // dashboard. The run directory is shared with the nodes, as the checkpoints are.
        env.insert(
            auth::JOB_TOKEN_ENV.into(),
            l.token_file.to_string_lossy().into_owned(),
        );
        if let Some(dir) = &l.tls_dir {
            env.insert(
                auth::tls::JOB_TLS_ENV.into(),
                dir.to_string_lossy().into_owned(),
            );
        }
        // Ray keeps the output in files: no colour codes in them.
        env.entry("NO_COLOR".into()).or_insert_with(|| "1".into());
        for var in ["RUST_LOG", "RUST_BACKTRACE"] {
            if let Ok(v) = std::env::var(var) {
                env.entry(var.into()).or_insert(v);
            }
        }
        // How the brain confines `command:` processes, to the agent on whichever node.
        if let Ok(v) = std::env::var(vocab::sandbox::SANDBOX_ENV) {
            env.insert(vocab::sandbox::SANDBOX_ENV.into(), v);
        }
        let req = SubmitRequest {
            // exec: the agent is the job's process, so Ray's stop signals reach it.
            entrypoint: format!("exec {command}"),
            submission_id: id.clone(),
            entrypoint_num_cpus: need.cpus,
            entrypoint_num_gpus: need.gpus,
            entrypoint_memory: (need.memory_bytes > 0).then_some(need.memory_bytes),
            entrypoint_resources: need.custom.clone(),
            runtime_env: api::RuntimeEnv { env_vars: env },
            metadata: [
                ("brain_job".to_string(), inner.settings.job_name.clone()),
                ("brain_slot".to_string(), l.key.to_string()),
                ("brain_incarnation".to_string(), l.incarnation.to_string()),
            ]
            .into(),
        };
        let (cancel_tx, mut cancel_rx) = watch::channel(false);
        let (submitted_tx, submitted_rx) = watch::channel(false);
        let (done_tx, done_rx) = watch::channel(false);
        inner.slots.lock().await.insert(
            l.key,
            Slot {
                incarnation: l.incarnation,
                submission_id: id.clone(),
                cancel: cancel_tx,
                submitted: submitted_rx,
                done: done_rx,
            },
        );
        let inner = self.inner.clone();
        let (key, incarnation) = (l.key, l.incarnation);
        // A process of a placement group goes to its bundle's node (the plan's node where
        // its group's layout takes it).
        let (prefer, bundle_prefer) = match group {
            None => (l.node, None),
            Some(_) => (None, l.node),
        };
        if key.role == Role::PS {
            // Counted now, not when its task first runs: a worker launched right after it
            // must see it waiting, or it may take the room the PS needs.
            inner
                .waiting_ps
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        tokio::spawn(async move {
            let (mut req, mut need) = (req, need);
            let pinned = match group {
                None => Ok(()),
                // On its bundle's node; the group is laid out first, asked again until the
                // place timeout when the cluster cannot hold it.
                Some(g) => inner
                    .bundle_node_within(g, key, bundle_prefer.as_deref(), &mut cancel_rx)
                    .await
                    .map(|ip| {
                        need = group::pinned(&need, &ip);
                        req.entrypoint_resources = need.custom.clone();
                    }),
            };
            let placed = match pinned {
                Ok(()) => {
                    let prefer = prefer.as_deref();
                    inner.place(&req, &need, key, prefer, &mut cancel_rx).await
                }
                Err(_) if *cancel_rx.borrow() => Err(Unplaced::Stopped),
                Err(e) => Err(Unplaced::NoRoom(e)),
            };
            let event = match placed {
                Ok(()) => {
                    let _ = submitted_tx.send(true);
                    tracing::debug!(%key, incarnation, id, "agent submitted to Ray");
                    let description = inner.watch(&id, &cancel_rx, key, incarnation).await;
                    inner.forget(&id);
                    Some(PlatformEvent::AgentExited {
                        key,
                        incarnation,
                        description,
                    })
                }
                Err(Unplaced::NoRoom(why)) => Some(PlatformEvent::NotPlaced {
                    key,
                    incarnation,
                    description: why.to_string(),
                }),
                Err(Unplaced::Refused(why)) => Some(PlatformEvent::AgentExited {
                    key,
                    incarnation,
                    description: why.to_string(),
                }),
                // The master stopped it: nothing to tell.
                Err(Unplaced::Stopped) => None,
            };
            {
                let mut slots = inner.slots.lock().await;
                if slots
                    .get(&key)
                    .is_some_and(|s| s.incarnation == incarnation)
                {
                    slots.remove(&key);
                }
            }
            let _ = done_tx.send(true);
            if let Some(event) = event {
                inner.tell(event).await;
            }
        });
        Ok(())
    }

    fn reports_placement(&self) -> bool {
        true
    }

    fn avoid(&self, nodes: &[String]) {
        let mut now = self.inner.avoided.write().expect("not poisoned");
        if *now == nodes {
            return;
        }
        *now = nodes.to_vec();
        let said = format!(
            "nodes this job avoids (its pre-run check or a straggler of it found them slow or faulty): {}; no new process of it goes there",
            nodes.join(", ")
        );
        let events = self.inner.events.clone();
        tokio::spawn(async move {
            let _ = events.send(PlatformEvent::Note(said)).await;
        });
    }

    fn devices_held(&self, held: vocab::devices::DeviceUse) {
        *self.inner.held.write().expect("not poisoned") = held;
    }

    fn counts_devices(&self) -> bool {
        true
    }

    fn others_devices(&self, held: vocab::devices::DeviceUse) {
        *self.inner.others.write().expect("not poisoned") = held;
    }

    fn cordon(&self, nodes: &[String]) {
        let mut now = self.inner.cordoned.write().expect("not poisoned");
        if *now == nodes {
            return;
        }
        *now = nodes.to_vec();
        let said = if nodes.is_empty() {
            "no node is cordoned any more: every node is offered to new processes".to_string()
        } else {
            format!(
                "nodes cordoned by the brain: {}; no new process goes there",
                nodes.join(", ")
            )
        };
        let events = self.inner.events.clone();
        tokio::spawn(async move {
            let _ = events.send(PlatformEvent::Note(said)).await;
        });
    }

    async fn stop(&self, key: SlotKey, grace: Duration) {
        let slot = self.inner.slots.lock().await.get(&key).map(|s| {
            let _ = s.cancel.send(true);
            (
                s.submission_id.clone(),
                *s.submitted.borrow(),
                s.done.clone(),
            )
        });
        let Some((id, submitted, mut done)) = slot else {
            return;
        };
        if submitted && let Err(e) = self.inner.api.stop(&id).await {
            tracing::warn!(%key, id, "stopping a Ray job: {e}");
        }
        // Ray sends SIGTERM and, after its own grace period (3 s by default), SIGKILL.
        let wait = grace + Duration::from_secs(10);
        if tokio::time::timeout(wait, done.wait_for(|d| *d))
            .await
            .is_err()
        {
            tracing::warn!(%key, id, "Ray job still running {} s after the stop", wait.as_secs());
        }
    }

    async fn stop_all(&self, grace: Duration) {
        let keys: Vec<SlotKey> = self.inner.slots.lock().await.keys().copied().collect();
        let mut all = tokio::task::JoinSet::new();
        for key in keys {
            let me = RayPlatform {
                inner: self.inner.clone(),
                capacity: self.capacity.clone(),
            };
            all.spawn(async move { me.stop(key, grace).await });
        }
        while all.join_next().await.is_some() {}
    }

    async fn running(&self) -> usize {
        self.inner.slots.lock().await.len()
    }

    fn capacity(&self) -> Capacity {
        self.capacity.clone()
    }

    /// The alive nodes neither the brain cordoned nor the job avoids.
    async fn check_nodes(&self) -> Result<Vec<super::CheckNode>, Error> {
        self.inner.check_nodes().await
    }

    /// A Ray job pinned to the node (`check`).
    async fn run_check(
        &self,
        node: &super::CheckNode,
        c: super::CheckLaunch,
    ) -> Result<(), super::CheckEnd> {
        self.inner.run_check(node, c).await
    }
}
