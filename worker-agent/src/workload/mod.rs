//! The built-in reference workload: real training of a sparse CTR model (logistic regression
//! over hashed features, Adagrad) on the deterministic data of [`ctr`].
//!
//! * [`ps_server`] holds one partition of the model (keys `k` with `k % num_ps == index`).
//! * [`ps_worker`] leases shards, pulls, computes gradients, pushes (asynchronous SGD).
//! * [`allreduce_worker`] keeps a full replica and averages gradients with [`ring`] all-reduce.
//! * [`mod@reference`] trains the same model in one process, the yardstick for the distributed runs.
//! * [`model`] is the shared math and the checkpoint file formats.
//! * [`ctr`] generates the data: every sample is a pure function of `(seed, index)`, so any
//!   process can produce any shard without a file, and the generator knows the ground-truth
//!   model, so the log-loss a run reaches can be judged against the best one possible.
//!
//! A training process learns who it is from the environment its agent set (`BRAIN_*`, the
//! torchrun variables, TF_CONFIG) and talks to the job master through [`MasterLink`].

pub mod allreduce_worker;
pub mod ctr;
pub mod model;
pub mod ps_server;
pub mod ps_worker;
pub mod reference;
pub mod ring;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use proto::checkpoint::Manifest;
use proto::jobmaster::v1 as pb;

use crate::agent::{MasterClient, connect};
use crate::error::Error;

/// Who this training process is, from its environment.
#[derive(Clone, Debug)]
pub struct ProcessEnv {
    pub master: String,
    pub role: vocab::Role,
    pub index: u32,
    pub incarnation: u64,
    pub service_addr: String,
    pub resume_from: Option<PathBuf>,
    pub rank: u32,
    pub world_size: u32,
    pub ring_peers: Vec<String>,
    pub round: u64,
    /// The step of a cut held in memory whose state rank 0 of `round` sends every rank over
    /// the ring as it forms (`state_from_rank0` of the join): this process does not read
    /// `resume_from` (older) but takes what it gets. None: it restores as usual.
    pub state_from_rank0: Option<u64>,
    pub ps_addrs: Vec<String>,
    /// ps jobs: the version of the PS set in `ps_addrs`.
    pub ps_version: u64,
    /// The job's secret, which the master, the parameter servers and ring peers expect, and
    /// the job's TLS when it runs with it.
    pub creds: auth::JobCreds,
}

/// The variable that carries the join's `state_from_rank0` to the built-in workload.
pub const STATE_FROM_RANK0_ENV: &str = "BRAIN_STATE_FROM_RANK0";

/// How long a process that reported its checkpoint damaged waits for the group's restart to
/// stop it before it exits with the error.
pub const FALLBACK_WAIT: Duration = Duration::from_secs(120);

fn var(name: &'static str) -> Result<String, Error> {
    std::env::var(name).map_err(|e| Error::Env {
        name,
        problem: e.to_string(),
    })
}

fn parse<T: std::str::FromStr>(name: &'static str) -> Result<T, Error>
where
    T::Err: std::fmt::Display,
{
    var(name)?.parse().map_err(|e: T::Err| Error::Env {
        name,
        problem: e.to_string(),
    })
}

fn list(name: &'static str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl ProcessEnv {
    pub fn from_env() -> Result<Self, Error> {
        let role = parse::<vocab::Role>("BRAIN_ROLE")?;
        let resume = std::env::var("BRAIN_RESUME_FROM").unwrap_or_default();
        Ok(Self {
            master: var("BRAIN_MASTER_ADDR")?,
            role,
            index: parse("BRAIN_INDEX")?,
            incarnation: parse("BRAIN_INCARNATION")?,
            service_addr: var("BRAIN_SERVICE_ADDR")?,
            resume_from: (!resume.is_empty()).then(|| PathBuf::from(resume)),
            rank: parse("RANK")?,
            world_size: parse("WORLD_SIZE")?,
            ring_peers: list("BRAIN_RING_PEERS"),
            round: parse("BRAIN_RENDEZVOUS_ROUND").unwrap_or(0),
            state_from_rank0: parse::<u64>(STATE_FROM_RANK0_ENV).ok().filter(|&s| s != 0),
            ps_addrs: list("BRAIN_PS_ADDRS"),
            ps_version: parse("BRAIN_PS_VERSION").unwrap_or(0),
            creds: auth::JobCreds::from_env().map_err(|e| Error::Secret(e.to_string()))?,
        })
    }

    pub fn me(&self) -> pb::ProcessRef {
        pb::ProcessRef {
            role: self.role.to_string(),
            index: self.index,
            incarnation: self.incarnation,
        }
    }

    /// The checkpoint manifest to resume from, if any.
    pub fn manifest(&self) -> Result<Option<Manifest>, Error> {
        let Some(path) = &self.resume_from else {
            return Ok(None);
        };
        let bytes = std::fs::read(path).map_err(|e| Error::Io {
            path: path.clone(),
            source: e,
        })?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Checkpoint {
                path: path.clone(),
                problem: e.to_string(),
            })
    }
}

/// A restore that failed: where the checkpoint is damaged, the master is told (and falls back
/// to an older one); the error to exit with.
pub async fn damaged(master: &mut MasterLink, env: &ProcessEnv, e: Error) -> Error {
    match &env.resume_from {
        Some(manifest) if e.is_damaged_checkpoint() => master.checkpoint_damaged(manifest, e).await,
        _ => e,
    }
}

/// The training process's calls to the job master.
pub struct MasterLink {
    client: MasterClient,
    me: pb::ProcessRef,
}

fn refused(call: &'static str) -> impl Fn(tonic::Status) -> Error {
    move |status| Error::Refused { call, status }
}

impl MasterLink {
    pub async fn connect(env: &ProcessEnv) -> Result<Self, Error> {
        Ok(Self {
            client: connect(&env.master, Duration::from_secs(30), &env.creds).await?,
            me: env.me(),
        })
    }

    /// The checkpoint this process was told to resume from (`manifest`) is damaged
    /// (`problem`): the master drops it and restarts the group from an older one kept, which
    /// stops this process, or fails the job where it keeps none. Waits to be stopped (at most
    /// [`FALLBACK_WAIT`]); what to exit with if that does not come.
    pub async fn checkpoint_damaged(
        &mut self,
        manifest: &std::path::Path,
        problem: Error,
    ) -> Error {
        tracing::warn!(manifest = %manifest.display(), %problem, "the checkpoint to resume from is damaged");
        let r = self
            .client
            .report_checkpoint_damaged(pb::CheckpointDamaged {
                process: Some(self.me.clone()),
                manifest: manifest.display().to_string(),
                problem: problem.to_string(),
            })
            .await
            .map_err(refused("ReportCheckpointDamaged"));
        match r {
            Ok(a) => match a.into_inner().step {
                Some(step) => tracing::warn!(
                    step,
                    "the group falls back to the checkpoint of step {step}: waiting to be restarted"
                ),
                None => {
                    tracing::error!("the job keeps no older checkpoint: it fails");
                    return problem;
                }
            },
            // Another process of the group reported it first: the restart is under way.
            Err(e) if e.is_stale() => tracing::info!("the group restarts already ({e})"),
            Err(e) => {
                tracing::error!("{e}");
                return problem;
            }
        }
        tokio::time::sleep(FALLBACK_WAIT).await;
        problem
    }

    pub async fn workload(&mut self) -> Result<pb::WorkloadConfig, Error> {
        Ok(self
            .client
            .get_workload(self.me.clone())
            .await
            .map_err(refused("GetWorkload"))?
            .into_inner())
    }

    /// Asks for a shard; a ps worker says which PS-set version it uses (0: not a ps worker),
    /// an allreduce member the rendezvous round it trains in (0: not said).
    pub async fn lease(
        &mut self,
        ps_version: u64,
        round: u64,
    ) -> Result<pb::LeaseShardResponse, Error> {
        Ok(self
            .client
            .lease_shard(pb::LeaseShardRequest {
                process: Some(self.me.clone()),
                cluster_version: ps_version,
                round,
            })
            .await
            .map_err(refused("LeaseShard"))?
            .into_inner())
    }

    /// Joins the rendezvous again from inside the training process (a re-formed allreduce
    /// group, or a ps worker switching to a new PS set) and waits until it is ready. `None`:
    /// a scale plan removed this process.
    pub async fn rejoin(&mut self) -> Result<Option<pb::JoinRendezvousResponse>, Error> {
        loop {
            let r = self
                .client
                .join_rendezvous(pb::JoinRendezvousRequest {
                    service_addr: String::new(),
                    process: Some(self.me.clone()),
                })
                .await
                .map_err(refused("JoinRendezvous"))?
                .into_inner();
            if r.removed {
                return Ok(None);
            }
            if r.ready {
                return Ok(Some(r));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn done(&mut self, shard: &pb::Shard) -> Result<(), Error> {
        self.client
            .report_shard_done(pb::ShardDone {
                process: Some(self.me.clone()),
                shard_id: shard.id,
                epoch: shard.epoch,
                samples: shard.end - shard.start,
            })
            .await
            .map_err(refused("ReportShardDone"))?;
        Ok(())
    }

    pub async fn metrics(&mut self, mut m: pb::TrainingMetrics) -> Result<(), Error> {
        m.process = Some(self.me.clone());
        self.client
            .report_metrics(m)
            .await
            .map_err(refused("ReportMetrics"))?;
        Ok(())
    }

    pub async fn commit(&mut self, step: u64, path: String, digest: String) -> Result<(), Error> {
        self.client
            .commit_checkpoint(pb::CheckpointCommit {
                process: Some(self.me.clone()),
                step,
                path,
                digest,
                in_memory: false,
            })
            .await
            .map_err(refused("CommitCheckpoint"))?;
        Ok(())
    }

    /// The consistent cut at `step` is held in the agents' memory (rank 0 says so): the master
    /// ends the cut, and commits the step once the agent has written the copy out. A refusal
    /// is the master's answer (the cut is then saved to disk); a master out of reach, an error.
    pub async fn cut_in_memory(&mut self, step: u64) -> Result<Result<(), tonic::Status>, Error> {
        let r = self
            .client
            .commit_checkpoint(pb::CheckpointCommit {
                process: Some(self.me.clone()),
                step,
                in_memory: true,
                ..Default::default()
            })
            .await;
        match r {
            Ok(_) => Ok(Ok(())),
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                ) =>
            {
                Err(refused("CommitCheckpoint")(s))
            }
            Err(s) => Ok(Err(s)),
        }
    }
}

/// Tracks throughput, loss and compute time, and says when a metrics report is due (the first
/// step, then once a second).
pub struct Progress {
    started: Instant,
    last_report: Option<Instant>,
    samples_at_last: u64,
    /// Steps timed (full batches) and the seconds of this process's own work in them (outside
    /// collectives and waits), and both at the last report.
    timed_steps: u64,
    timed_at_last: u64,
    compute_s: f64,
    compute_at_last: f64,
    pub step: u64,
    pub samples: u64,
    pub loss_ema: Option<f64>,
}

impl Progress {
    pub fn new(step: u64) -> Self {
        Self {
            started: Instant::now(),
            last_report: None,
            samples_at_last: 0,
            timed_steps: 0,
            timed_at_last: 0,
            compute_s: 0.0,
            compute_at_last: 0.0,
            step,
            samples: 0,
            loss_ema: None,
        }
    }

    pub fn record(&mut self, samples: u64, loss_sum: f64) {
        self.step += 1;
        self.samples += samples;
        if samples > 0 {
            let l = loss_sum / samples as f64;
            self.loss_ema = Some(self.loss_ema.map_or(l, |e| 0.95 * e + 0.05 * l));
        }
    }

    /// Time this process spent on its own work in a step of a full batch (a shard's short
    /// last batch is not timed: its fixed costs would weigh more than a full one's).
    pub fn computed(&mut self, took: Duration) {
        self.timed_steps += 1;
        self.compute_s += took.as_secs_f64();
    }

    /// Makes the next recorded step report at once (after the group changed).
    pub fn report_next(&mut self) {
        self.last_report = None;
        self.samples_at_last = self.samples;
        self.timed_at_last = self.timed_steps;
        self.compute_at_last = self.compute_s;
        self.started = Instant::now();
    }

    /// A metrics message if one is due now.
    pub fn due(&mut self) -> Option<pb::TrainingMetrics> {
        let now = Instant::now();
        let since = self.last_report.unwrap_or(self.started);
        if self.last_report.is_some() && now.duration_since(since) < Duration::from_secs(1) {
            return None;
        }
        if self.samples == 0 {
            return None;
        }
        let secs = now.duration_since(since).as_secs_f64().max(1e-3);
        let sps = (self.samples - self.samples_at_last) as f64 / secs;
        let steps = self.timed_steps - self.timed_at_last;
        let compute_seconds = self.compute_s - self.compute_at_last;
        self.last_report = Some(now);
        self.samples_at_last = self.samples;
        self.timed_at_last = self.timed_steps;
        self.compute_at_last = self.compute_s;
        Some(pb::TrainingMetrics {
            global_step: self.step,
            samples_per_second: sps,
            loss: self.loss_ema.unwrap_or(0.0),
            samples_total: self.samples,
            steps: steps.min(u32::MAX as u64) as u32,
            compute_seconds,
            ..Default::default()
        })
    }
}

/// Sleeps the artificial per-sample compute time of the workload config.
pub async fn simulated_compute(cfg: &pb::WorkloadConfig, samples: u64) {
    if cfg.step_delay_us > 0 && samples > 0 {
        tokio::time::sleep(Duration::from_micros(cfg.step_delay_us as u64 * samples)).await;
    }
}

/// The data generator a workload config describes.
pub fn generator(cfg: &pb::WorkloadConfig) -> Result<ctr::CtrGenerator, Error> {
    ctr::CtrGenerator::new(ctr::CtrSpec {
        seed: cfg.seed,
        num_fields: cfg.num_fields,
        vocab_per_field: cfg.vocab_per_field,
        hash_buckets: cfg.hash_buckets,
    })
    .map_err(|e| Error::InvalidRequest(e.to_string()))
}
