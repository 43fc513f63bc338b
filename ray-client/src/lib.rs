//! A client for the parts of a Ray cluster's dashboard HTTP API the Ray platform uses: the Job
//! Submission REST API (`/api/jobs/`) and the cluster state (`/api/v0/nodes`,
//! `/api/cluster_status`, `/api/v0/actors`).
//!
//! Ray's rough edges, handled here or by the platform:
//! * error bodies are plain text (often a Python traceback), never JSON: an error keeps the
//!   HTTP status and the body's last line;
//! * a duplicate `submission_id` answers HTTP 500 (the agent-side 400 is wrapped): it is told
//!   apart by its text ([`RayError::Duplicate`]);
//! * `/api/cluster_status` camel-cases resource names (`object_store_memory` →
//!   `objectStoreMemory`, a custom `brain_slot` → `brainSlot`) and is empty until the
//!   autoscaler's monitor has reported, so node totals come from the state API and usage is
//!   matched to them by name;
//! * usage lags placement by a few seconds: a node's free room is its total less the larger of
//!   the usage report and what its alive actors hold (`/api/v0/actors`, current as soon as an
//!   actor runs; a Ray job's entrypoint resources are its supervisor actor's); the job master's
//!   Ray platform also keeps its own account of what it submitted recently
//!   (`job_master::platform::ray`).
//!
//! The job master's Ray platform submits agents through it; the brain reads capacity with it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What went wrong talking to Ray.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RayError {
    #[error("cannot reach Ray's dashboard at {url}: {problem}")]
    Unreachable { url: String, problem: String },
    #[error("Ray answered HTTP {status} to {what}: {text}")]
    Http {
        what: String,
        status: u16,
        text: String,
    },
    #[error("Ray already has a job with submission_id {0:?}")]
    Duplicate(String),
    #[error("unexpected answer from Ray to {what}: {problem}")]
    Unexpected { what: String, problem: String },
}

impl RayError {
    /// Whether asking again later may succeed: the dashboard unreachable, or busy (Ray's own
    /// "No available agent to submit job, please try again later", HTTP 503).
    pub fn is_transient(&self) -> bool {
        match self {
            RayError::Unreachable { .. } => true,
            RayError::Http { status, text, .. } => {
                *status == 503 || (*status >= 500 && text.contains("try again later"))
            }
            _ => false,
        }
    }
}

/// A Ray job's life as the Jobs API reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RayJobStatus {
    Pending,
    Running,
    Stopped,
    Succeeded,
    Failed,
}

impl std::fmt::Display for RayJobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RayJobStatus::Pending => "PENDING",
            RayJobStatus::Running => "RUNNING",
            RayJobStatus::Stopped => "STOPPED",
            RayJobStatus::Succeeded => "SUCCEEDED",
            RayJobStatus::Failed => "FAILED",
        })
    }
}

impl RayJobStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RayJobStatus::Stopped | RayJobStatus::Succeeded | RayJobStatus::Failed
        )
    }
}

/// The fields of `GET /api/jobs/{submission_id}` the platform reads.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RayJobInfo {
    pub submission_id: Option<String>,
    pub status: RayJobStatus,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub driver_node_id: Option<String>,
    #[serde(default)]
    pub driver_exit_code: Option<i64>,
    #[serde(default)]
    pub entrypoint: Option<String>,
}

impl RayJobInfo {
    /// How the job ended, in one line: `Ray job ID STATUS (exit code N): what Ray says` (the
    /// first line of Ray's message, which may go on with a copy of the job's output).
    pub fn headline(&self, id: &str) -> String {
        let mut d = format!("Ray job {id} {}", self.status);
        if let Some(code) = self.driver_exit_code {
            d += &format!(" (exit code {code})");
        }
        if let Some(m) = self.message.as_deref().and_then(|m| m.lines().next())
            && !m.trim().is_empty()
        {
            d += &format!(": {}", m.trim().trim_end_matches(','));
        }
        d
    }
}

/// The custom resource by which Ray marks a node's GPU model (`accelerator_type:V100`: Ray
/// declares it for the GPUs it detects; `ray start --resources` declares it by hand).
pub const GPU_TYPE_PREFIX: &str = "accelerator_type:";

/// What a process asks for to land on a node with GPU model `model`, as Ray's own
/// `accelerator_type` option does: a sliver of the node's marker, so any number fit.
pub fn gpu_type_request(model: &str) -> (String, f64) {
    (format!("{GPU_TYPE_PREFIX}{model}"), 0.001)
}

/// What one process asks Ray for: CPUs, GPUs, memory and custom resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RayResources {
    pub cpus: f64,
    pub gpus: f64,
    pub memory_bytes: u64,
    pub custom: BTreeMap<String, f64>,
}

impl RayResources {
    /// Whether `self` fits into `room`.
    pub fn fits_in(&self, room: &RayResources) -> bool {
        const EPS: f64 = 1e-9;
        self.cpus <= room.cpus + EPS
            && self.gpus <= room.gpus + EPS
            && self.memory_bytes <= room.memory_bytes
            && self
                .custom
                .iter()
                .all(|(k, v)| *v <= room.custom.get(k).copied().unwrap_or(0.0) + EPS)
    }

    /// The GPU model these resources mark (a node's `accelerator_type:MODEL`), if any.
    pub fn gpu_type(&self) -> Option<&str> {
        self.custom
            .keys()
            .find_map(|k| k.strip_prefix(GPU_TYPE_PREFIX))
    }

    /// `self − other`, never below zero.
    pub fn minus(&self, other: &RayResources) -> RayResources {
        let mut custom = self.custom.clone();
        for (k, v) in &other.custom {
            if let Some(x) = custom.get_mut(k) {
                *x = (*x - v).max(0.0);
            }
        }
        RayResources {
            cpus: (self.cpus - other.cpus).max(0.0),
            gpus: (self.gpus - other.gpus).max(0.0),
            memory_bytes: self.memory_bytes.saturating_sub(other.memory_bytes),
            custom,
        }
    }

    fn from_map(m: &BTreeMap<String, f64>) -> RayResources {
        let mut r = RayResources::default();
        for (k, v) in m {
            match k.as_str() {
                "CPU" => r.cpus = *v,
                "GPU" => r.gpus = *v,
                "memory" => r.memory_bytes = v.max(0.0) as u64,
                // Ray's own bookkeeping, not something a process asks for (`node:ADDRESS`
                // is: a sliver of it pins a process to that node).
                "object_store_memory" => {}
                k if k.starts_with("node:__internal") => {}
                _ => {
                    r.custom.insert(k.clone(), *v);
                }
            }
        }
        r
    }
}

/// One node of a Ray cluster: what it has and what is free.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RayNode {
    pub node_id: String,
    pub ip: String,
    pub is_head: bool,
    pub total: RayResources,
    pub available: RayResources,
}

/// The alive nodes of a Ray cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RayCluster {
    pub nodes: Vec<RayNode>,
}

impl RayCluster {
    /// Sum over nodes of `f`.
    pub fn sum(&self, f: impl Fn(&RayNode) -> &RayResources) -> RayResources {
        let mut s = RayResources::default();
        for n in &self.nodes {
            let r = f(n);
            s.cpus += r.cpus;
            s.gpus += r.gpus;
            s.memory_bytes = s.memory_bytes.saturating_add(r.memory_bytes);
            for (k, v) in &r.custom {
                *s.custom.entry(k.clone()).or_default() += v;
            }
        }
        s
    }
}

/// A node's free resources: each of `total` less what is used, the larger of the autoscaler's
/// `usage` report (`{name: [used, total]}` under camel-cased names, or the names themselves)
/// and what its alive actors hold (`held`).
fn free_of(
    total: &BTreeMap<String, f64>,
    usage: Option<&serde_json::Map<String, serde_json::Value>>,
    held: Option<&BTreeMap<String, f64>>,
) -> BTreeMap<String, f64> {
    let mut free = BTreeMap::new();
    for (name, total) in total {
        let reported = usage
            .and_then(|u| u.get(&camel_case(name)).or_else(|| u.get(name)))
            .and_then(|pair| pair.get(0))
            .and_then(|x| x.as_f64())
            .unwrap_or(0.0);
        let by_actors = held.and_then(|h| h.get(name)).copied().unwrap_or(0.0);
        free.insert(name.clone(), (total - reported.max(by_actors)).max(0.0));
    }
    free
}

/// The name `/api/cluster_status` gives resource `name`: each `_` dropped and the letter after
/// it upper-cased (`object_store_memory` → `objectStoreMemory`,
/// `node:__internal_head__` → `node:InternalHead`).
pub fn camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The body of `POST /api/jobs/`.
#[derive(Clone, Debug, Serialize)]
pub struct SubmitRequest {
    pub entrypoint: String,
    pub submission_id: String,
    pub entrypoint_num_cpus: f64,
    pub entrypoint_num_gpus: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_memory: Option<u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub entrypoint_resources: BTreeMap<String, f64>,
    pub runtime_env: RuntimeEnv,
    pub metadata: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RuntimeEnv {
    pub env_vars: BTreeMap<String, String>,
}

/// A Ray cluster's dashboard, e.g. `http://127.0.0.1:8265`.
#[derive(Clone, Debug)]
pub struct RayApi {
    base: String,
    http: reqwest::Client,
}

impl RayApi {
    /// `address` is `http(s)://host:port` or `host:port` (then http).
    pub fn new(address: &str) -> Result<RayApi, RayError> {
        let a = address.trim().trim_end_matches('/');
        if a.is_empty() {
            return Err(RayError::Unreachable {
                url: address.into(),
                problem: "the Ray address is empty".into(),
            });
        }
        let base = if a.starts_with("http://") || a.starts_with("https://") {
            a.to_string()
        } else {
            format!("http://{a}")
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| RayError::Unreachable {
                url: base.clone(),
                problem: e.to_string(),
            })?;
        Ok(RayApi { base, http })
    }

    pub fn address(&self) -> &str {
        &self.base
    }

    async fn call(
        &self,
        what: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<(u16, String), RayError> {
        let resp = req.send().await.map_err(|e| RayError::Unreachable {
            url: self.base.clone(),
            problem: format!("{what}: {e}"),
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| RayError::Unreachable {
            url: self.base.clone(),
            problem: format!("{what}: reading the answer: {e}"),
        })?;
        Ok((status, text))
    }

    fn http_error(what: &str, status: u16, text: &str) -> RayError {
        // Plain text, often a traceback: its last non-empty line says what happened.
        let line = text
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty() && *l != ".")
            .unwrap_or("(empty body)");
        RayError::Http {
            what: what.into(),
            status,
            text: line.chars().take(500).collect(),
        }
    }

    fn json<T: for<'de> Deserialize<'de>>(what: &str, text: &str) -> Result<T, RayError> {
        serde_json::from_str(text).map_err(|e| RayError::Unexpected {
            what: what.into(),
            problem: format!("{e}: {}", text.chars().take(300).collect::<String>()),
        })
    }

    /// What the alive actors hold, by node id and resource name (their `required_resources`):
    /// current as soon as an actor runs, where the autoscaler's usage report lags by seconds. A
    /// Ray job's entrypoint resources are its supervisor actor's.
    async fn held_by_actors(&self) -> Result<BTreeMap<String, BTreeMap<String, f64>>, RayError> {
        #[derive(Deserialize)]
        struct Envelope {
            data: Data,
        }
        #[derive(Deserialize)]
        struct Data {
            result: Listed,
        }
        #[derive(Deserialize)]
        struct Listed {
            result: Vec<Actor>,
        }
        #[derive(Deserialize)]
        struct Actor {
            #[serde(default)]
            node_id: Option<String>,
            state: String,
            #[serde(default)]
            required_resources: BTreeMap<String, f64>,
        }
        let what = "GET /api/v0/actors";
        let (status, text) = self
            .call(
                what,
                self.http.get(format!(
                    "{}/api/v0/actors?detail=1&limit=10000&filter_keys=state&\
                     filter_predicates=%3D&filter_values=ALIVE",
                    self.base
                )),
            )
            .await?;
        if status != 200 {
            return Err(Self::http_error(what, status, &text));
        }
        let mut held: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
        for a in Self::json::<Envelope>(what, &text)?.data.result.result {
            let Some(node) = a.node_id.filter(|_| a.state == "ALIVE") else {
                continue;
            };
            let on = held.entry(node).or_default();
            for (name, amount) in a.required_resources {
                *on.entry(name).or_default() += amount;
            }
        }
        Ok(held)
    }

    /// Ray's version, e.g. "2.60.0".
    pub async fn version(&self) -> Result<String, RayError> {
        #[derive(Deserialize)]
        struct V {
            ray_version: String,
        }
        let what = "GET /api/version";
        let (status, text) = self
            .call(what, self.http.get(format!("{}/api/version", self.base)))
            .await?;
        if status != 200 {
            return Err(Self::http_error(what, status, &text));
        }
        Ok(Self::json::<V>(what, &text)?.ray_version)
    }

    /// Submits a job. A duplicate `submission_id` is [`RayError::Duplicate`].
    pub async fn submit(&self, req: &SubmitRequest) -> Result<(), RayError> {
        let what = format!("submitting {}", req.submission_id);
        let (status, text) = self
            .call(
                &what,
                self.http
                    .post(format!("{}/api/jobs/", self.base))
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(serde_json::to_vec(req).expect("plain struct")),
            )
            .await?;
        if status == 200 {
            return Ok(());
        }
        if text.contains("already exists") {
            return Err(RayError::Duplicate(req.submission_id.clone()));
        }
        Err(Self::http_error(&what, status, &text))
    }

    /// A job's status; `None` when Ray does not know it.
    pub async fn job(&self, submission_id: &str) -> Result<Option<RayJobInfo>, RayError> {
        let what = format!("GET job {submission_id}");
        let (status, text) = self
            .call(
                &what,
                self.http
                    .get(format!("{}/api/jobs/{submission_id}", self.base)),
            )
            .await?;
        match status {
            200 => Ok(Some(Self::json(&what, &text)?)),
            404 => Ok(None),
            _ => Err(Self::http_error(&what, status, &text)),
        }
    }

    /// Asks Ray to stop a job (SIGTERM, SIGKILL after Ray's grace period). Returns whether Ray
    /// said it stopped something; a PENDING job is "stopped" in the answer but keeps waiting.
    pub async fn stop(&self, submission_id: &str) -> Result<bool, RayError> {
        #[derive(Deserialize)]
        struct S {
            stopped: bool,
        }
        let what = format!("stopping {submission_id}");
        let (status, text) = self
            .call(
                &what,
                self.http
                    .post(format!("{}/api/jobs/{submission_id}/stop", self.base)),
            )
            .await?;
        match status {
            200 => Ok(Self::json::<S>(&what, &text)?.stopped),
            404 => Ok(false),
            _ => Err(Self::http_error(&what, status, &text)),
        }
    }

    /// Deletes a finished job's record. Ray refuses while the job runs.
    pub async fn delete(&self, submission_id: &str) -> Result<bool, RayError> {
        let what = format!("deleting {submission_id}");
        let (status, text) = self
            .call(
                &what,
                self.http
                    .delete(format!("{}/api/jobs/{submission_id}", self.base)),
            )
            .await?;
        match status {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(Self::http_error(&what, status, &text)),
        }
    }

    /// The job's output so far (its driver's stdout and stderr).
    pub async fn logs(&self, submission_id: &str) -> Result<String, RayError> {
        #[derive(Deserialize)]
        struct L {
            logs: String,
        }
        let what = format!("logs of {submission_id}");
        let (status, text) = self
            .call(
                &what,
                self.http
                    .get(format!("{}/api/jobs/{submission_id}/logs", self.base)),
            )
            .await?;
        if status != 200 {
            return Err(Self::http_error(&what, status, &text));
        }
        Ok(Self::json::<L>(&what, &text)?.logs)
    }

    /// The alive nodes with their total resources (state API) and what is free on each
    /// (`usageByNode` of the cluster status). A node the status does not cover yet (the
    /// monitor reports every few seconds) counts as wholly free: callers that must not
    /// over-commit keep their own account of recent placements.
    pub async fn cluster(&self) -> Result<RayCluster, RayError> {
        #[derive(Deserialize)]
        struct NodesEnvelope {
            data: NodesData,
        }
        #[derive(Deserialize)]
        struct NodesData {
            result: NodesResult,
        }
        #[derive(Deserialize)]
        struct NodesResult {
            result: Vec<NodeState>,
        }
        #[derive(Deserialize)]
        struct NodeState {
            node_id: String,
            node_ip: String,
            #[serde(default)]
            is_head_node: bool,
            state: String,
            #[serde(default)]
            resources_total: BTreeMap<String, f64>,
        }
        let what = "GET /api/v0/nodes";
        let (status, text) = self
            .call(
                what,
                self.http
                    .get(format!("{}/api/v0/nodes?detail=1&limit=10000", self.base)),
            )
            .await?;
        if status != 200 {
            return Err(Self::http_error(what, status, &text));
        }
        let nodes = Self::json::<NodesEnvelope>(what, &text)?.data.result.result;

        let what = "GET /api/cluster_status";
        let (status, text) = self
            .call(
                what,
                self.http.get(format!("{}/api/cluster_status", self.base)),
            )
            .await?;
        if status != 200 {
            return Err(Self::http_error(what, status, &text));
        }
        let v: serde_json::Value = Self::json(what, &text)?;
        let by_node = v
            .pointer("/data/clusterStatus/loadMetricsReport/usageByNode")
            .and_then(|u| u.as_object())
            .cloned()
            .unwrap_or_default();

        let held = self.held_by_actors().await?;

        let mut out = RayCluster::default();
        for n in nodes.into_iter().filter(|n| n.state == "ALIVE") {
            let usage = by_node.get(&n.node_id).and_then(|u| u.as_object());
            let free = free_of(&n.resources_total, usage, held.get(&n.node_id));
            out.nodes.push(RayNode {
                node_id: n.node_id,
                ip: n.node_ip,
                is_head: n.is_head_node,
                total: RayResources::from_map(&n.resources_total),
                available: RayResources::from_map(&free),
            });
        }
        if out.nodes.is_empty() {
            return Err(RayError::Unexpected {
                what: what.into(),
                problem: "the cluster has no alive node".into(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_or_unreachable_dashboard_is_worth_asking_again() {
        let http = |status, text: &str| RayError::Http {
            what: "submitting x".into(),
            status,
            text: text.into(),
        };
        assert!(
            http(
                500,
                "No available agent to submit job, please try again later."
            )
            .is_transient()
        );
        assert!(http(503, "busy").is_transient());
        assert!(!http(500, "RuntimeError: bad entrypoint").is_transient());
        assert!(!http(400, "try again later").is_transient());
        assert!(!RayError::Duplicate("x".into()).is_transient());
    }

    #[test]
    fn a_nodes_gpu_model_is_its_accelerator_type_resource() {
        let mut m = BTreeMap::new();
        m.insert("GPU".to_string(), 2.0);
        m.insert("accelerator_type:V100".to_string(), 1.0);
        let r = RayResources::from_map(&m);
        assert_eq!((r.gpus, r.gpu_type()), (2.0, Some("V100")));
        assert_eq!(RayResources::default().gpu_type(), None);
        let (name, amount) = gpu_type_request("A100");
        assert_eq!(name, "accelerator_type:A100");
        assert!(amount > 0.0 && amount < 0.01);
    }

    #[test]
    fn resource_names_are_camel_cased_as_the_cluster_status_does() {
        assert_eq!(camel_case("object_store_memory"), "objectStoreMemory");
        assert_eq!(camel_case("node:__internal_head__"), "node:InternalHead");
        assert_eq!(camel_case("brain_slot"), "brainSlot");
        assert_eq!(camel_case("CPU"), "CPU");
        assert_eq!(camel_case("node:127.0.0.1"), "node:127.0.0.1");
    }

    #[test]
    fn fitting_counts_every_resource() {
        let room = RayResources {
            cpus: 2.0,
            gpus: 0.0,
            memory_bytes: 1 << 30,
            custom: [("slot".to_string(), 1.0)].into(),
        };
        let mut p = RayResources {
            cpus: 2.0,
            memory_bytes: 1 << 30,
            ..Default::default()
        };
        assert!(p.fits_in(&room));
        p.custom.insert("slot".into(), 1.0);
        assert!(p.fits_in(&room));
        p.custom.insert("other".into(), 0.5);
        assert!(!p.fits_in(&room));
        p.custom.remove("other");
        p.gpus = 1.0;
        assert!(!p.fits_in(&room));
        p.gpus = 0.0;
        assert!(!p.fits_in(&room.minus(&RayResources {
            cpus: 0.5,
            ..Default::default()
        })));
    }

    #[test]
    fn resource_maps_drop_rays_bookkeeping_and_keep_the_node_marker() {
        let m: BTreeMap<String, f64> = [
            ("CPU", 4.0),
            ("GPU", 1.0),
            ("memory", 1e9),
            ("object_store_memory", 5e8),
            ("node:__internal_head__", 1.0),
            ("node:127.0.0.1", 1.0),
            ("brain_slot", 3.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let r = RayResources::from_map(&m);
        assert_eq!((r.cpus, r.gpus, r.memory_bytes), (4.0, 1.0, 1_000_000_000));
        // A process may ask for a sliver of `node:ADDRESS` to be pinned to that node.
        assert_eq!(
            r.custom,
            [
                ("brain_slot".to_string(), 3.0),
                ("node:127.0.0.1".to_string(), 1.0)
            ]
            .into()
        );
    }

    #[test]
    fn addresses_get_a_scheme_and_lose_a_trailing_slash() {
        assert_eq!(
            RayApi::new("127.0.0.1:8265").unwrap().address(),
            "http://127.0.0.1:8265"
        );
        assert_eq!(
            RayApi::new("https://ray.example:443/").unwrap().address(),
            "https://ray.example:443"
        );
        assert!(RayApi::new("  ").is_err());
    }

    #[test]
    fn error_bodies_keep_their_last_line() {
        let e = RayApi::http_error(
            "x",
            500,
            "Traceback (most recent call last):\n  File \"a.py\"\nValueError: boom\n.\n",
        );
        assert_eq!(
            e,
            RayError::Http {
                what: "x".into(),
                status: 500,
                text: "ValueError: boom".into()
            }
        );
    }

    #[test]
    fn a_nodes_free_room_counts_the_larger_of_the_usage_report_and_its_actors() {
        let total: BTreeMap<String, f64> = [("CPU".to_string(), 4.0), ("memory".to_string(), 8.0)]
            .into_iter()
            .collect();
        let usage = serde_json::json!({"CPU": [1.0, 4.0], "memory": [6.0, 8.0]});
        let usage = usage.as_object();
        // The report is behind: an actor placed since holds 3 CPUs.
        let held: BTreeMap<String, f64> = [("CPU".to_string(), 3.0), ("memory".to_string(), 2.0)]
            .into_iter()
            .collect();
        let free = free_of(&total, usage, Some(&held));
        assert_eq!((free["CPU"], free["memory"]), (1.0, 2.0));
        // No report yet (the monitor has not run), nor actors: all of it is free.
        let free = free_of(&total, None, None);
        assert_eq!((free["CPU"], free["memory"]), (4.0, 8.0));
        // Never below nothing.
        let held: BTreeMap<String, f64> = [("CPU".to_string(), 9.0)].into_iter().collect();
        assert_eq!(free_of(&total, usage, Some(&held))["CPU"], 0.0);
    }
}
