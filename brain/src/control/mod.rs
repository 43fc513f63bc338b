//! The live optimisation loop: on a timer (`[live] interval_s` of the policy file) and on
//! events (a job submitted, registered, finished, its master gone), it snapshots the queued and
//! running jobs from the store with their reported speeds (under the store's lock), runs
//! [`optimizer::live::plan_round`] under the operator's scheduler (outside it: ingest never
//! waits for a solve), and carries the decisions out: a queued job that gets room
//! has its job master started, a running job whose worker count changes gets the next plan
//! version (which its job master polls). A job whose last plan is not yet acknowledged and
//! carried out is left alone, as is one in its cool-down.
//!
//! The policy file is read again when it changes on disk (or through `brainctl policy set`); a
//! file that does not parse is logged and the policy in force stays.
//!
//! `snapshot.rs` reads what a round plans on from the store; `preview.rs` tries an operator's
//! plan on the next round before it is proposed; `masters.rs` follows the job
//! masters to their end (and resumes one that died early); `nodes.rs` is the operator's view
//! of the nodes and their cordons.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use optimizer::config::PolicyConfig;
use optimizer::live::{LiveCluster, LiveState, RoundPlan};
use optimizer::schedule::{ElasticLp, SchedulerKind};
use prost::Message;
use proto::jobmaster::v1 as jm;
use tokio::sync::Notify;
use vocab::JobSpec;

use crate::BrainError;
use crate::launch::{Launcher, place_checkpoints};
use crate::metrics::Metrics;
use crate::predict::predict;
mod masters;
mod nodes;
pub use nodes::NodeState;
mod preview;
mod snapshot;
use snapshot::solve;

use crate::store::{JobId, JobState, PlanCounts, Shape, Store};

pub use crate::now_unix_ms;

/// The most of a process's output one `JobLogs` answer carries.
pub const LOG_PIECE_BYTES: u64 = 256 << 10;

/// The policy in force and where it came from.
#[derive(Clone, Debug)]
pub struct LoadedPolicy {
    pub config: PolicyConfig,
    pub text: String,
    /// The policy file's modification time when this was put in force: the file is read
    /// again once it changes (also after a policy set through the brain).
    modified: Option<SystemTime>,
    /// Set through the brain (`brainctl policy set`) at this time, kept in its database;
    /// none: read from the policy file (or the defaults).
    set_unix_ms: Option<i64>,
}

impl LoadedPolicy {
    /// The scheduler of the live rounds: the file's, or `elastic_lp` with its defaults.
    pub fn scheduler(&self) -> SchedulerKind {
        self.config
            .scheduler
            .clone()
            .unwrap_or_else(|| SchedulerKind::ElasticLp(ElasticLp::default()))
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reads the policy file; a missing file means the defaults.
pub fn load_policy(path: Option<&Path>) -> Result<LoadedPolicy, BrainError> {
    let text = match path {
        Some(p) if p.exists() => std::fs::read_to_string(p)?,
        _ => String::new(),
    };
    let config = PolicyConfig::from_toml(&text).map_err(|source| BrainError::Policy {
        path: path.map(Path::to_path_buf).unwrap_or_default(),
        source,
    })?;
    Ok(LoadedPolicy {
        config,
        text,
        modified: path.and_then(modified),
        set_unix_ms: None,
    })
}

/// The policy a brain starts with: the one set through it (kept in `store`) when that is newer
/// than the policy file, else the file's: the operator's last word either way.
fn starting_policy(store: &Store, path: Option<&Path>) -> Result<LoadedPolicy, BrainError> {
    let from_file = load_policy(path)?;
    let Some((text, set_unix_ms)) = store.stored_policy()? else {
        return Ok(from_file);
    };
    let file_ms = from_file.modified.map_or(i64::MIN, |t| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    });
    if file_ms > set_unix_ms {
        return Ok(from_file);
    }
    let config = PolicyConfig::from_toml(&text).map_err(|e| BrainError::Stored {
        what: "the policy set through the brain".into(),
        problem: e.to_string(),
    })?;
    Ok(LoadedPolicy {
        config,
        text,
        set_unix_ms: Some(set_unix_ms),
        ..from_file
    })
}

/// The round's decisions and how long the scheduler took.
pub struct RoundOutcome {
    pub plan: RoundPlan,
    pub solve_ms: f64,
    pub cluster: LiveCluster,
}

pub struct Control {
    pub store: Arc<Mutex<Store>>,
    policy: RwLock<LoadedPolicy>,
    policy_path: Option<PathBuf>,
    /// The capacity as last read, with its nodes (cordoned ones included).
    cluster: std::sync::RwLock<(LiveCluster, Vec<crate::capacity::NodeInfo>)>,
    capacity: crate::capacity::Source,
    launcher: Launcher,
    wake: Notify,
    /// One round at a time (timer, events and dry runs).
    round_lock: tokio::sync::Mutex<()>,
    /// Why each queued job waits, as the last dispatching round said.
    waiting: RwLock<std::collections::HashMap<JobId, String>>,
    pub metrics: Arc<Metrics>,
    /// Raw metric time series, when an InfluxDB is configured.
    pub sink: Option<crate::sink::Sink>,
    /// How often each job's master was started again after it died (this brain's lifetime).
    resumes: Mutex<std::collections::HashMap<JobId, u32>>,
    /// The tokens callers may present; a job's secret is added when it is minted.
    pub keys: Arc<crate::auth::Keys>,
    /// Nodes a job's report found faulty that were not cordoned on its word (the last healthy
    /// node), with what the report said: shown to the operator (`brainctl nodes`) until the
    /// next cordon period.
    flagged: std::sync::Mutex<std::collections::BTreeMap<String, (String, i64)>>,
}

/// What the brain's ingest feeds besides the store: its Prometheus counters and, when an
/// InfluxDB is configured, the raw time series.
pub struct Outputs {
    pub metrics: Arc<Metrics>,
    pub sink: Option<crate::sink::Sink>,
}

impl Control {
    pub fn new(
        store: Arc<Mutex<Store>>,
        policy_path: Option<PathBuf>,
        (cluster, capacity): (
            (LiveCluster, Vec<crate::capacity::NodeInfo>),
            crate::capacity::Source,
        ),
        launcher: Launcher,
        outputs: Outputs,
        keys: Arc<crate::auth::Keys>,
    ) -> Result<Control, BrainError> {
        let policy = starting_policy(
            &store.lock().expect("no panic while the store is held"),
            policy_path.as_deref(),
        )?;
        launcher.set_state_write_give_up(policy.config.live.state_write_give_up_s);
        Ok(Control {
            store,
            policy: RwLock::new(policy),
            policy_path,
            cluster: std::sync::RwLock::new(cluster),
            capacity,
            launcher,
            wake: Notify::new(),
            round_lock: tokio::sync::Mutex::new(()),
            waiting: Default::default(),
            metrics: outputs.metrics,
            sink: outputs.sink,
            resumes: Mutex::default(),
            keys,
            flagged: Default::default(),
        })
    }

    /// Mints a token of `job`'s `holder` (its master's secret, or its owner's token): its
    /// digest goes to the store and the keys, the token to whoever hands it over.
    pub async fn mint(
        &self,
        job: JobId,
        holder: crate::auth::Holder,
    ) -> Result<auth::Token, BrainError> {
        let token = auth::Token::generate();
        let digest = token.digest();
        self.with_store(move |s| s.add_job_token(job, digest, holder, now_unix_ms()))
            .await?;
        self.keys.add(digest, job, holder);
        Ok(token)
    }

    /// What the brain may hand out, as last read (cordoned nodes included: what a job could
    /// ever run on).
    pub fn cluster(&self) -> LiveCluster {
        self.cluster
            .read()
            .expect("no panic under the lock")
            .0
            .clone()
    }

    /// The nodes the capacity was last read from.
    pub fn nodes(&self) -> Vec<crate::capacity::NodeInfo> {
        self.cluster
            .read()
            .expect("no panic under the lock")
            .1
            .clone()
    }

    /// Asks for a round now (an event happened).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// A job's diagnosis, as its master's `job-master diagnose` prints it.
    pub async fn diagnose(&self, job: JobId, all: bool) -> Result<String, BrainError> {
        let name = self.with_store(move |s| s.name(job)).await?;
        self.launcher.diagnose(&name, all).await
    }

    /// A job's events, one a line, from its run directory.
    pub async fn events(&self, job: JobId) -> Result<String, BrainError> {
        let name = self.with_store(move |s| s.name(job)).await?;
        self.launcher.events(&name).await
    }

    /// A piece of one process's output (see [`Launcher::logs`]), and whether the job ended.
    pub async fn logs(
        &self,
        job: JobId,
        process: String,
        incarnation: u64,
        from: crate::launch::LogFrom,
    ) -> Result<(vocab::run_dir::ProcessLog, String, u64, bool), BrainError> {
        let row = self.with_store(move |s| s.job(job)).await?;
        let ended = !matches!(row.state, JobState::Queued | JobState::Running);
        let (log, text, next) =
            self.launcher
                .logs(&row.name, &process, incarnation, from, LOG_PIECE_BYTES)?;
        Ok((log, text, next, ended))
    }

    /// Why `job` waits, if it is queued and the last round said.
    pub fn waiting_reason(&self, job: JobId) -> String {
        self.waiting
            .read()
            .expect("no panic under the lock")
            .get(&job)
            .cloned()
            .unwrap_or_default()
    }

    pub fn policy(&self) -> (LoadedPolicy, Option<PathBuf>) {
        (
            self.policy.read().expect("no panic under the lock").clone(),
            self.policy_path.clone(),
        )
    }

    /// Where the policy in force came from, for `brainctl policy show`.
    pub fn policy_source(&self) -> String {
        let (policy, path) = self.policy();
        let file = path.map(|p| p.display().to_string());
        match (policy.set_unix_ms, file) {
            (Some(at), Some(file)) => format!(
                "set with `brainctl policy set` (unix ms {at}), kept in the brain's database; \
                 {file} is read again once it changes"
            ),
            (Some(at), None) => format!(
                "set with `brainctl policy set` (unix ms {at}), kept in the brain's database"
            ),
            (None, Some(file)) => file,
            (None, None) => String::new(),
        }
    }

    /// Puts `policy` in force; the job masters started from now on get its give-up time for
    /// failing writes of their job's state.
    fn put_policy(&self, policy: LoadedPolicy) {
        self.launcher
            .set_state_write_give_up(policy.config.live.state_write_give_up_s);
        *self.policy.write().expect("no panic under the lock") = policy;
    }

    /// Checks `text`, keeps it in the store (the policy file is never written) and puts it in
    /// force; an edit of the policy file later puts the file's in force again.
    pub fn set_policy(&self, text: &str) -> Result<LoadedPolicy, BrainError> {
        let config = PolicyConfig::from_toml(text)
            .map_err(|e| BrainError::InvalidArgument(format!("the policy is not valid: {e}")))?;
        let now = now_unix_ms();
        self.store
            .lock()
            .expect("no panic while the store is held")
            .set_policy(text, now)?;
        let loaded = LoadedPolicy {
            config,
            text: text.to_string(),
            modified: self.policy_path.as_deref().and_then(modified),
            set_unix_ms: Some(now),
        };
        self.put_policy(loaded.clone());
        tracing::info!("policy set through the brain: in force from the next round");
        self.wake();
        Ok(loaded)
    }

    fn reload_if_changed(&self) {
        let Some(path) = &self.policy_path else {
            return;
        };
        let now = modified(path);
        if now
            == self
                .policy
                .read()
                .expect("no panic under the lock")
                .modified
        {
            return;
        }
        match load_policy(Some(path)) {
            Ok(p) => {
                tracing::info!(path = %path.display(), "policy file changed: reloaded");
                self.put_policy(p);
            }
            Err(e) => {
                tracing::warn!(
                    "policy file changed but is not valid, the policy in force stays: {e}"
                );
                // Do not warn again until the file changes again.
                self.policy
                    .write()
                    .expect("no panic under the lock")
                    .modified = now;
            }
        }
    }

    async fn with_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, BrainError> + Send + 'static,
    ) -> Result<T, BrainError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&mut store.lock().expect("no panic under the lock")))
            .await
            .map_err(|e| BrainError::Internal(format!("store task: {e}")))?
    }

    /// Sizes a submitted spec, records it queued, and asks for a round.
    pub async fn submit(
        &self,
        spec_yaml: &str,
        origin: &str,
    ) -> Result<(JobId, Shape, Vec<String>), BrainError> {
        let origin = if origin.is_empty() {
            "the spec".to_string()
        } else {
            origin.to_string()
        };
        let spec: JobSpec = JobSpec::from_yaml(spec_yaml)
            .map_err(|e| BrainError::InvalidArgument(format!("{origin}: {e}")))?;
        let run_dir = self.launcher.run_dir(&spec.name);
        crate::store::check_name(&spec.name)
            .and_then(|()| {
                crate::admission::admit(&spec, &self.policy().0.config.submissions, &run_dir)
                    .map_err(BrainError::InvalidArgument)
            })
            .map_err(|e| BrainError::InvalidArgument(format!("{origin}: {e}")))?;
        if let Some(why) = self.launcher.jobs_refused() {
            return Err(BrainError::FailedPrecondition(format!("{origin}: {why}")));
        }
        let name = spec.name.clone();
        let taken = self.with_store(move |s| s.job_by_name(&name)).await?;
        if let Some(row) = taken {
            return Err(BrainError::AlreadyExists(format!(
                "the name {:?} is taken by {} ({}); give the job another name",
                row.name,
                row.id,
                row.state.as_str()
            )));
        }
        // The run directory is new: made here, or the submission is refused (anything already
        // at its path, a planted link included, is never used). A refusal from here on
        // leaves nothing behind.
        vocab::paths::make_dir(&run_dir)
            .and_then(|made| {
                made.then_some(()).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!(
                            "{} exists already (left by an earlier brain?): remove it or give \
                             the job another name",
                            run_dir.display()
                        ),
                    )
                })
            })
            .map_err(|e| BrainError::InvalidArgument(format!("{origin}: {e}")))?;
        let r = self.submit_in(spec, &run_dir, &origin).await;
        if r.is_err() {
            let _ = std::fs::remove_dir_all(&run_dir);
        }
        r
    }

    /// [`Self::submit`] once the job's run directory is made.
    async fn submit_in(
        &self,
        mut spec: JobSpec,
        run_dir: &std::path::Path,
        origin: &str,
    ) -> Result<(JobId, Shape, Vec<String>), BrainError> {
        place_checkpoints(&mut spec, run_dir);
        vocab::paths::inside(run_dir, &spec.checkpoint.dir)
            .map(|resolved| spec.checkpoint.dir = resolved)
            .map_err(|e| {
                BrainError::InvalidArgument(format!(
                    "{origin}: checkpoint.dir: {e} (it must stay inside the job's run directory)"
                ))
            })?;
        vocab::paths::clear_of_master(&spec.checkpoint.dir, &run_dir.join("master"))
            .map_err(|e| BrainError::InvalidArgument(format!("{origin}: {e}")))?;
        spec.validate()
            .and_then(|()| vocab::spec::host::check(&spec))
            .map_err(|e| BrainError::InvalidArgument(format!("{origin}: {e}")))?;
        let origin = origin.to_string();
        let cluster = self.cluster();
        let nodes = self.nodes();
        let spread = !nodes.iter().any(|n| n.name == crate::capacity::LOCAL_NODE);
        let node_cpus = crate::predict::NodeCpus {
            cpus: nodes
                .iter()
                .map(|n| n.cpu_millicores)
                .filter(|&m| m > 0)
                .collect(),
            memory: nodes
                .iter()
                .map(|n| n.memory_bytes)
                .filter(|&m| m > 0)
                .collect(),
            // Without Ray the CPU is one pool and the processes run beside the brain.
            spread,
            sizes: match spread {
                true => nodes
                    .iter()
                    .map(|n| optimizer::live::NodeSize {
                        cpu_millicores: n.cpu_millicores,
                        memory_bytes: n.memory_bytes,
                        gpus: n.gpus,
                        gpu_type: n.gpu_type.clone(),
                    })
                    .collect(),
                false => Vec::new(),
            },
        };
        let (id, shape, reasons) = self
            .with_store(move |s| {
                let history = s.jobs()?;
                let ps_speeds = s.all_ps_speeds()?;
                let model = s
                    .model(crate::train::MODEL_NAME)?
                    .map(|(body, _)| serde_json::from_str(&body))
                    .transpose()
                    .map_err(|e| BrainError::Stored {
                        what: format!("job-profile model {:?}", crate::train::MODEL_NAME),
                        problem: e.to_string(),
                    })?;
                let now = now_unix_ms();
                let p = predict(
                    &spec,
                    &history,
                    &ps_speeds,
                    &cluster,
                    &node_cpus,
                    model.as_ref(),
                    now as f64 / 1000.0,
                )
                .map_err(|e| match e {
                    BrainError::InvalidArgument(m) => {
                        BrainError::InvalidArgument(format!("{origin}: {m}"))
                    }
                    other => other,
                })?;
                p.spec
                    .validate()
                    .and_then(|()| vocab::spec::host::check(&p.spec))
                    .map_err(|e| BrainError::InvalidArgument(format!("{origin}: {e}")))?;
                let yaml = serde_norway::to_string(&p.spec)
                    .map_err(|e| BrainError::Internal(format!("writing the spec: {e}")))?;
                let mut reasons = p.reasons;
                reasons.extend(crate::admission::programs(&p.spec));
                let id = s.submit(&p.spec.name, &yaml, &p.shape, &reasons, now_unix_ms())?;
                Ok((id, p.shape, reasons))
            })
            .await?;
        self.metrics.submitted.inc();
        self.wake();
        Ok((id, shape, reasons))
    }

    /// One round; with `dispatch`, its decisions are carried out.
    pub async fn round(&self, dispatch: bool) -> Result<RoundOutcome, BrainError> {
        let _one = self.round_lock.lock().await;
        self.reload_if_changed();
        let policy = self.policy.read().expect("no panic under the lock").clone();
        let round_started = Instant::now();
        let (snap, planned, snapshot_ms) = self.snapshot().await?;
        let (plan, solve_ms) = solve(snap, policy).await?;
        self.metrics.observe_round(snapshot_ms, solve_ms);
        if dispatch {
            *self.waiting.write().expect("no panic under the lock") = plan
                .decisions
                .iter()
                .filter(|d| d.state == LiveState::Queued && !d.starts())
                .map(|d| {
                    let why = if d.reasons.is_empty() {
                        "the round gave it no room".to_string()
                    } else {
                        d.reasons.join("; ")
                    };
                    (JobId(d.job.0), why)
                })
                .collect();
            for d in plan.decisions.iter().filter(|d| d.changes()) {
                let job = JobId(d.job.0);
                let why = d.reasons.join("; ");
                if d.starts() {
                    if let Err(e) = self.start(job, d).await {
                        tracing::warn!("cannot start {job}: {e}");
                        let msg = e.to_string();
                        let _ = self
                            .with_store(move |s| {
                                s.finish(job, JobState::Failed, &msg, 0, now_unix_ms())
                            })
                            .await;
                    }
                    continue;
                }
                if d.state != LiveState::Running {
                    continue;
                }
                let (to, d) = (d.to_workers(), d.clone());
                let ps = (d.to_ps() != d.ps()).then_some(d.to_ps());
                let (from, migrations) = (d.from_workers(), d.migrations.len());
                let r = self
                    .with_store(move |s| {
                        // The plan names the training group as the job does.
                        let trainer = s
                            .job(job)?
                            .shape
                            .map_or(vocab::Role::WORKER, |x| x.training);
                        let body = |version| {
                            jm::ScalePlan::from(&d.scale_plan(version, trainer)).encode_to_vec()
                        };
                        // What the plan sizes, under the job's names (the version aside).
                        let counts = PlanCounts::of(&d.scale_plan(0, trainer), trainer);
                        s.propose_plan(job, &body, &why, counts, &d.corrections, now_unix_ms())
                    })
                    .await;
                match r {
                    Ok(v) => {
                        self.metrics.plans.inc();
                        tracing::info!(%job, version = v, from, to, ps = ?ps, migrations, "plan dispatched");
                    }
                    Err(e) => tracing::warn!("cannot store a plan for {job}: {e}"),
                }
            }
        }
        self.metrics
            .observe_round_total(round_started.elapsed().as_secs_f64() * 1000.0);
        Ok(RoundOutcome {
            plan,
            solve_ms,
            cluster: planned,
        })
    }

    /// Starts a queued job's master at the size `d` gives it, told where `d` placed its
    /// processes; a GPU job's on the GPU model `d` starts it on, which its workers then ask
    /// the platform for.
    async fn start(&self, job: JobId, d: &optimizer::live::Decision) -> Result<(), BrainError> {
        let (workers, gpu_type) = (d.to_workers(), d.gpu_type.clone());
        let row = self.with_store(move |s| s.job(job)).await?;
        if row.state != JobState::Queued {
            tracing::info!(%job, state = row.state.as_str(), "not started: no longer queued");
            return Ok(());
        }
        let mut spec: JobSpec = serde_norway::from_str(row.spec.as_deref().unwrap_or_default())
            .map_err(|e| BrainError::Stored {
                what: format!("spec of {job}"),
                problem: e.to_string(),
            })?;
        if let Some(model) = &gpu_type {
            let worker = spec.roles.entry(spec.training_role()).or_default();
            worker.resources.get_or_insert_default().gpu_type = Some(model.clone());
        }
        let token = self.mint(job, crate::auth::Holder::Master).await?;
        // Where the round placed its processes, under the names the job gives its roles.
        let trainer = row
            .shape
            .as_ref()
            .map_or(vocab::Role::WORKER, |x| x.training);
        let nodes = d.start_nodes(trainer);
        let run_dir = self
            .launcher
            .start(job, &spec, (workers, nodes.clone()), &token)
            .await?;
        let dir = run_dir.display().to_string();
        self.with_store(move |s| {
            s.started(job, workers, gpu_type.as_deref(), &dir, now_unix_ms())?;
            // Their room is held there until they run (the round's snapshot).
            s.started_on(job, &nodes)
        })
        .await?;
        self.metrics.started.inc();
        tracing::info!(%job, workers, run_dir = %run_dir.display(), "job master started");
        Ok(())
    }

    /// Rounds until `shutdown`: every `interval_s`, and at once after an event.
    pub async fn run(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            let interval = {
                let p = self.policy.read().expect("no panic under the lock");
                Duration::from_secs_f64(p.config.live.interval_s)
            };
            if let Err(e) = self.round(true).await {
                tracing::warn!("round: {e}");
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = self.wake.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}
