//! The brain's own Prometheus metrics, served as text at `GET /metrics` on the brain's port:
//! jobs by state (read from the store at each scrape), rounds and their times (the snapshot
//! taken under the store's lock, the solve, the whole round with its plans stored), plans
//! dispatched, jobs submitted and started, metric reports ingested (its `rate()` is the ingest
//! rate), points written to (or dropped before) the InfluxDB sink, calls a rate limit
//! refused (by limit), and the listener's connections: open, pending (not yet spoken) and
//! closed by it, by reason (handshake timed out or failed, idle, closed to make room at a cap),
//! and, for each running job, its effective training time, the training its restarts threw
//! away, its stragglers now and its GPU use, per job and per process (its newest report).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::store::{JobState, Store};

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
        Metrics {
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
        for row in rows.iter().filter(|r| r.state == JobState::Running) {
            self.render_gpu(&row.name, &store.gpu_use(row.id));
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

    /// The text exposition, with the job gauges read from `store` now.
    pub fn render(&self, store: &Store) -> String {
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
        }
        self.render_connections();
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}
