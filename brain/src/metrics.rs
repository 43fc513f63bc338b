//! The brain's own Prometheus metrics, served as text at `GET /metrics` on the brain's port:
//! jobs by state (read from the store at each scrape), rounds and their times (the snapshot
//! taken under the store's lock, the solve, the whole round with its plans stored), plans
//! dispatched, jobs submitted and started, metric reports ingested (its `rate()` is the ingest
//! rate), points written to (or dropped before) the InfluxDB sink, calls a rate limit
//! refused (by limit), and the listener's connections: open, pending (not yet spoken) and
//! closed by it, by reason (handshake timed out or failed, idle, closed to make room at a cap),
//! and, for each running job, its effective training time, the training its restarts threw
//! away, its stragglers now and its GPU use, per job and per process (its newest report), its
//! size, processes by role (running and waiting), recent speed, CPU, memory, plan and failed
//! writes of its state; and per
//! node the brain plans on its CPU, GPUs by model and whether it is cordoned.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::store::{JobState, Store};

type Labels = Vec<(String, String)>;

/// The per-job series of running jobs.
#[derive(Default)]
struct JobGauges {
    workers: Family<Labels, Gauge>,
    processes: Family<Labels, Gauge>,
    waiting: Family<Labels, Gauge>,
    samples_per_second: Family<Labels, Gauge<f64, AtomicU64>>,
    cpu_cores: Family<Labels, Gauge<f64, AtomicU64>>,
    memory_bytes: Family<Labels, Gauge>,
    plan_version: Family<Labels, Gauge>,
    state_write_failures: Family<Labels, Gauge>,
}

impl JobGauges {
    fn register(&self, r: &mut Registry) {
        r.register(
            "job_workers",
            "Workers a running job's newest plan sets, by job",
            self.workers.clone(),
        );
        r.register(
            "job_processes",
            "A running job's processes running now, by job and role (its newest report)",
            self.processes.clone(),
        );
        r.register(
            "job_waiting_processes",
            "A running job's processes launched and waiting for room to run, by job and role",
            self.waiting.clone(),
        );
        r.register(
            "job_samples_per_second",
            "A running job's training speed, the mean of its reports over the last 30 s, by job",
            self.samples_per_second.clone(),
        );
        r.register(
            "job_cpu_cores",
            "CPU a running job's processes use, by job",
            self.cpu_cores.clone(),
        );
        r.register(
            "job_memory_bytes",
            "Resident memory of a running job's processes, by job",
            self.memory_bytes.clone(),
        );
        r.register(
            "job_plan_version",
            "The newest plan the brain made for a running job, by job",
            self.plan_version.clone(),
        );
        r.register(
            "job_state_write_failures",
            "Writes of a running job's state its master failed (a full or failing disk, its run \
             directory gone), each retried with backoff, since the master started; the job fails \
             once they fail for the policy's live.state_write_give_up_s, by job",
            self.state_write_failures.clone(),
        );
    }

    fn clear(&self) {
        self.workers.clear();
        self.processes.clear();
        self.waiting.clear();
        self.samples_per_second.clear();
        self.cpu_cores.clear();
        self.memory_bytes.clear();
        self.plan_version.clear();
        self.state_write_failures.clear();
    }

    fn set(&self, row: &crate::store::JobRow, s: &crate::store::JobSnapshot) {
        let job = vec![("job".to_string(), row.name.clone())];
        self.workers.get_or_create(&job).set(i64::from(row.workers));
        self.plan_version
            .get_or_create(&job)
            .set(row.plan_version as i64);
        if s.at_unix_ms == 0 {
            return; // no report yet
        }
        self.samples_per_second
            .get_or_create(&job)
            .set(s.samples_per_second);
        self.cpu_cores
            .get_or_create(&job)
            .set(s.cpu_millicores as f64 / 1000.0);
        self.memory_bytes
            .get_or_create(&job)
            .set(s.memory_bytes as i64);
        self.state_write_failures
            .get_or_create(&job)
            .set(s.state_write_failures as i64);
        for (role, running, waiting) in &s.roles {
            let label = vec![
                ("job".to_string(), row.name.clone()),
                ("role".to_string(), role.to_string()),
            ];
            self.processes
                .get_or_create(&label)
                .set(i64::from(*running));
            self.waiting.get_or_create(&label).set(i64::from(*waiting));
        }
    }
}

pub struct Metrics {
    registry: Registry,
    jobs: Family<Vec<(String, String)>, Gauge>,
    pub rounds: Counter,
    solve_seconds: Histogram,
    snapshot_seconds: Histogram,
    round_seconds: Histogram,
    pub plans: Counter,
    pub submitted: Counter,
    pub started: Counter,
    pub reports: Counter,
    pub sink_points: Counter,
    pub sink_dropped: Counter,
    /// Console sign-ins with a token this brain did not give.
    pub sign_in_failures: Counter,
    throttled: Family<Vec<(String, String)>, Counter>,
    connections: Family<Vec<(String, String)>, Gauge>,
    connections_closed: Family<Vec<(String, String)>, Counter>,
    /// Per running job, by name: effective training time (a share), training thrown away
    /// (seconds), stragglers now.
    job_effective: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    job_lost_seconds: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    job_stragglers: Family<Vec<(String, String)>, Gauge>,
    /// Per running job's GPU users (NVML on their nodes): the job's mean device utilisation
    /// (by job), and each process's device utilisation and GPU memory (by job, role, index).
    job_gpu_utilisation: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    process_gpu_utilisation: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    process_gpu_memory: Family<Vec<(String, String)>, Gauge>,
    /// Per running job: its size in force, processes by role (running, waiting), a recent
    /// speed, CPU and memory in use, its newest plan.
    job: JobGauges,
    /// Per node the brain plans on: CPU, GPUs by model, cordoned; GPUs by model in all.
    node_cpu_cores: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    node_gpus: Family<Vec<(String, String)>, Gauge>,
    node_cordoned: Family<Vec<(String, String)>, Gauge>,
    cluster_gpus: Family<Vec<(String, String)>, Gauge>,
    /// GPUs the running jobs hold, by model (their sizes in force).
    cluster_gpus_held: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    /// The listener's counts, read at each scrape.
    pub conn_stats: std::sync::Arc<auth::listen::ConnStats>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("brain");
        let jobs = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register("jobs", "Jobs the brain knows, by state", jobs.clone());
        let rounds = Counter::default();
        registry.register("rounds", "Optimisation rounds run", rounds.clone());
        let solve_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        registry.register(
            "round_solve_seconds",
            "Time the scheduler took per round",
            solve_seconds.clone(),
        );
        let snapshot_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        registry.register(
            "round_snapshot_seconds",
            "Time a round held the store's lock to read what it plans on",
            snapshot_seconds.clone(),
        );
        let round_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        registry.register(
            "round_seconds",
            "Time per round: snapshot, solve, plans stored and jobs started",
            round_seconds.clone(),
        );
        let plans = Counter::default();
        registry.register(
            "plans_dispatched",
            "Scale plans sent to running jobs",
            plans.clone(),
        );
        let submitted = Counter::default();
        registry.register(
            "jobs_submitted",
            "Jobs submitted without resources",
            submitted.clone(),
        );
        let started = Counter::default();
        registry.register(
            "jobs_started",
            "Job masters the brain started",
            started.clone(),
        );
        let reports = Counter::default();
        registry.register("metric_reports", "Metric reports stored", reports.clone());
        let sink_points = Counter::default();
        registry.register(
            "sink_points",
            "Raw metric points written to the InfluxDB sink",
            sink_points.clone(),
        );
        let sink_dropped = Counter::default();
        registry.register(
            "sink_dropped_points",
            "Raw metric points dropped while the sink was unreachable or too far behind",
            sink_dropped.clone(),
        );
        let sign_in_failures = Counter::default();
        registry.register(
            "console_sign_in_failures",
            "Console sign-ins with a token this brain did not give (each logged with its address)",
            sign_in_failures.clone(),
        );
        let throttled = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "throttled",
            "Calls refused by a rate limit of [limits], by limit",
            throttled.clone(),
        );
        let connections = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "connections",
            "Connections to the brain's address now, by state (open; pending: not yet through \
             its handshake)",
            connections.clone(),
        );
        let connections_closed = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "connections_closed",
            "Connections the listener closed, by reason (handshake_timeout, handshake_failed, \
             idle, evicted: closed to make room at a cap)",
            connections_closed.clone(),
        );
        let job_effective = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "job_effective_training_ratio",
            "Share of a running job's wall time its training group spent making progress that \
             was kept, by job",
            job_effective.clone(),
        );
        let job_lost_seconds = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "job_lost_training_seconds",
            "Training a running job's restarts threw away (since its last checkpoint), by job",
            job_lost_seconds.clone(),
        );
        let job_stragglers = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "job_stragglers",
            "Training processes a running job flags as stragglers now, by job",
            job_stragglers.clone(),
        );
        let job_gpu_utilisation = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "job_gpu_utilisation_pct",
            "Mean utilisation (0 to 100) of the GPUs a running job's processes use, by job",
            job_gpu_utilisation.clone(),
        );
        let process_gpu_utilisation =
            Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "process_gpu_utilisation_pct",
            "Utilisation (0 to 100) of the GPUs a running job's process was given, as NVML on \
             its node sees them, by job, role and index",
            process_gpu_utilisation.clone(),
        );
        let process_gpu_memory = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "process_gpu_memory_bytes",
            "GPU memory a running job's process holds, by job, role and index",
            process_gpu_memory.clone(),
        );
        let job = JobGauges::default();
        job.register(&mut registry);
        let node_cpu_cores = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "node_cpu_cores",
            "CPU a node offers the brain's jobs (without Ray: the local pool), by node",
            node_cpu_cores.clone(),
        );
        let node_gpus = Family::<Labels, Gauge>::default();
        registry.register(
            "node_gpus",
            "GPUs of a node, by node and GPU model",
            node_gpus.clone(),
        );
        let node_cordoned = Family::<Labels, Gauge>::default();
        registry.register(
            "node_cordoned",
            "1 while a node is cordoned (out of every round's capacity), else 0, by node",
            node_cordoned.clone(),
        );
        let cluster_gpus = Family::<Labels, Gauge>::default();
        let cluster_gpus_held = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "cluster_gpus_held",
            "GPUs the running jobs hold (their sizes in force), by GPU model; 'any' for jobs \
             that name none",
            cluster_gpus_held.clone(),
        );
        registry.register(
            "cluster_gpus",
            "GPUs the brain plans on (cordoned nodes' left out), by GPU model",
            cluster_gpus.clone(),
        );
        Metrics {
            job,
            node_cpu_cores,
            node_gpus,
            node_cordoned,
            cluster_gpus,
            cluster_gpus_held,
            job_gpu_utilisation,
            process_gpu_utilisation,
            process_gpu_memory,
            job_effective,
            job_lost_seconds,
            job_stragglers,
            connections,
            connections_closed,
            conn_stats: Default::default(),
            throttled,
            registry,
            jobs,
            rounds,
            solve_seconds,
            snapshot_seconds,
            round_seconds,
            plans,
            submitted,
            started,
            reports,
            sink_points,
            sink_dropped,
            sign_in_failures,
        }
    }
}

impl Metrics {
    /// A round's snapshot and solve times.
    pub fn observe_round(&self, snapshot_ms: f64, solve_ms: f64) {
        self.rounds.inc();
        self.snapshot_seconds.observe(snapshot_ms / 1000.0);
        self.solve_seconds.observe(solve_ms / 1000.0);
    }

    /// A whole round's time, its decisions carried out.
    pub fn observe_round_total(&self, ms: f64) {
        self.round_seconds.observe(ms / 1000.0);
    }

    /// A call a rate limit (`limits.<limit>`) refused.
    pub fn throttled(&self, limit: &str) {
        self.throttled
            .get_or_create(&vec![("limit".to_string(), limit.to_string())])
            .inc();
    }

    /// How many calls `limits.<limit>` refused.
    pub fn throttled_count(&self, limit: &str) -> u64 {
        self.throttled
            .get_or_create(&vec![("limit".to_string(), limit.to_string())])
            .get()
    }

    fn render_connections(&self) {
        let c = self.conn_stats.counts();
        let label = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        for (state, n) in [("open", c.open), ("pending", c.pending)] {
            self.connections
                .get_or_create(&label("state", state))
                .set(n as i64);
        }
        for (reason, total) in [
            ("handshake_timeout", c.handshake_timeouts),
            ("handshake_failed", c.handshake_failures),
            ("idle", c.idle_closed),
            ("evicted", c.evicted),
        ] {
            let counter = self
                .connections_closed
                .get_or_create(&label("reason", reason));
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    /// Each running job's effective training time and stragglers; jobs that ended leave.
    fn render_jobs(&self, store: &Store, rows: &[crate::store::JobRow]) {
        self.job_effective.clear();
        self.job_lost_seconds.clear();
        self.job_stragglers.clear();
        self.job_gpu_utilisation.clear();
        self.process_gpu_utilisation.clear();
        self.process_gpu_memory.clear();
        self.job.clear();
        for row in rows.iter().filter(|r| r.state == JobState::Running) {
            self.render_gpu(&row.name, &store.gpu_use(row.id));
            self.job.set(row, &store.snapshot(row.id));
            let label = vec![("job".to_string(), row.name.clone())];
            let crate::store::JobStability {
                effective,
                stragglers,
                ..
            } = store.stability(row.id);
            if let Some(e) = effective {
                self.job_effective.get_or_create(&label).set(e.share);
                self.job_lost_seconds
                    .get_or_create(&label)
                    .set(e.lost_ms as f64 / 1000.0);
            }
            self.job_stragglers
                .get_or_create(&label)
                .set(stragglers.len() as i64);
        }
    }

    /// A running job's GPU series; none for a job none of whose processes uses a GPU.
    fn render_gpu(&self, job: &str, gpu: &crate::store::JobGpuUse) {
        if gpu.processes.is_empty() {
            return;
        }
        self.job_gpu_utilisation
            .get_or_create(&vec![("job".to_string(), job.to_string())])
            .set(gpu.utilisation_pct);
        for p in &gpu.processes {
            let label = vec![
                ("job".to_string(), job.to_string()),
                ("role".to_string(), p.process.role.to_string()),
                ("index".to_string(), p.process.index.to_string()),
            ];
            self.process_gpu_utilisation
                .get_or_create(&label)
                .set(p.utilisation_pct);
            self.process_gpu_memory
                .get_or_create(&label)
                .set(p.memory_bytes as i64);
        }
    }

    /// The nodes the brain plans on, with the cordons in force.
    fn render_nodes(&self, nodes: &[crate::capacity::NodeInfo], cordoned: &[String]) {
        self.node_cpu_cores.clear();
        self.node_gpus.clear();
        self.node_cordoned.clear();
        self.cluster_gpus.clear();
        let mut by_model: std::collections::BTreeMap<&str, i64> = Default::default();
        for n in nodes {
            let node = vec![("node".to_string(), n.name.clone())];
            let out = cordoned.contains(&n.name);
            if n.cpu_millicores > 0 {
                self.node_cpu_cores
                    .get_or_create(&node)
                    .set(n.cpu_millicores as f64 / 1000.0);
            }
            if n.gpus > 0 {
                let model = if n.gpu_type.is_empty() {
                    "any"
                } else {
                    &n.gpu_type
                };
                self.node_gpus
                    .get_or_create(&vec![
                        ("node".to_string(), n.name.clone()),
                        ("gpu_type".to_string(), model.to_string()),
                    ])
                    .set(i64::from(n.gpus));
                if !out {
                    *by_model.entry(model).or_default() += i64::from(n.gpus);
                }
            }
            self.node_cordoned.get_or_create(&node).set(i64::from(out));
        }
        for (model, gpus) in by_model {
            self.cluster_gpus
                .get_or_create(&vec![("gpu_type".to_string(), model.to_string())])
                .set(gpus);
        }
    }

    /// The GPUs the running jobs hold by model: each one's workers and parameter servers at
    /// its size in force, and its service roles that do not share the workers' devices.
    fn render_gpus_held(&self, rows: &[crate::store::JobRow]) {
        self.cluster_gpus_held.clear();
        let mut by_model: std::collections::BTreeMap<String, u64> = Default::default();
        for row in rows.iter().filter(|r| r.state == JobState::Running) {
            let Some(s) = &row.shape else { continue };
            // Each role group's processes with GPUs of their own, on their model (none: the
            // training group's); the training group at its size in force.
            for (&role, g) in s.roles.iter().filter(|(_, g)| !g.shares_worker_devices) {
                let count = match role == s.training {
                    true => row.workers,
                    false => g.count,
                };
                let milli = u64::from(g.gpus.milli()) * u64::from(count);
                if milli > 0 {
                    let model = s.model_of(g).unwrap_or("any");
                    *by_model.entry(model.to_string()).or_default() += milli;
                }
            }
        }
        for (model, milli) in by_model {
            self.cluster_gpus_held
                .get_or_create(&vec![("gpu_type".to_string(), model)])
                .set(milli as f64 / 1000.0);
        }
    }

    /// The text exposition, with the job gauges read from `store` now and the nodes the brain
    /// plans on.
    pub fn render(&self, store: &Store, nodes: &[crate::capacity::NodeInfo]) -> String {
        let cordoned: Vec<String> = store
            .cordons(crate::now_unix_ms())
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.node)
            .collect();
        self.render_nodes(nodes, &cordoned);
        if let Ok(rows) = store.jobs() {
            for state in [
                JobState::Queued,
                JobState::Running,
                JobState::Succeeded,
                JobState::Failed,
                JobState::Cancelled,
            ] {
                let n = rows.iter().filter(|r| r.state == state).count();
                self.jobs
                    .get_or_create(&vec![("state".to_string(), state.as_str().to_string())])
                    .set(n as i64);
            }
            self.render_jobs(store, &rows);
            self.render_gpus_held(&rows);
        }
        self.render_connections();
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}
