//! What a replay sets up before its first round ([`Setup`]: the simulated world, each
//! application's profile, the scheduler's sizing) and how the jobs of a trace come in: each one
//! checked and its state made as it arrives ([`Arrivals`]), in order of submission.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use super::account::{EpochRates, JctAccount};
use super::app::{App, AppProfile, BatchConfig};
use super::bound::{EpochBest, epoch_best};
use super::checkpoints::Saved;
use super::world::{JobState, World};
use super::{ClusterSpec, SimConfig, TraceJob, Work};
use crate::error::PolicyError;
use crate::schedule::{BatchSizing, Scheduler};

/// What a replay derives from its inputs before the first round.
pub(super) struct Setup<'c> {
    pub(super) world: World,
    pub(super) types: Vec<String>,
    pub(super) elastic: bool,
    sizing: BatchSizing,
    /// GPUs of the largest type.
    most_gpus: u32,
    app_index: HashMap<String, usize>,
    config: &'c SimConfig,
    /// Nodes of each GPU type.
    pub(super) nodes_of: Vec<u32>,
    /// Per (application, batch choice), each epoch's best goodput and fewest GPU-seconds per
    /// unit of progress on the cluster ([`epoch_best`]), made once.
    epoch_bests: RefCell<HashMap<AppBatch, Arc<EpochBest>>>,
    /// Per (application, clamped batch asked for, own batch choice), the rates a training
    /// job's account compares its progress with, made once for all such jobs.
    epoch_rates: RefCell<HashMap<RatesKey, Arc<EpochRates>>>,
}

/// An application and a batch choice (`None`: the best configuration of each placement).
type AppBatch = (usize, Option<u32>);

/// An application with the first batch choice a job of it may get, and the job's own choice.
type RatesKey = (AppBatch, Option<u32>);

impl<'c> Setup<'c> {
    pub(super) fn new(
        profiles: &[AppProfile],
        cluster: &ClusterSpec,
        scheduler: &dyn Scheduler,
        config: &'c SimConfig,
    ) -> Result<Self, PolicyError> {
        config.validate()?;
        if cluster.nodes.is_empty() || cluster.nodes.iter().any(|n| n.gpus == 0) {
            return Err(PolicyError::InvalidConfig(
                "the cluster needs nodes with GPUs".into(),
            ));
        }
        let types = cluster.worker_types();
        let node_type: Vec<usize> = cluster
            .nodes
            .iter()
            .map(|n| {
                types
                    .iter()
                    .position(|t| *t == n.worker_type)
                    .expect("listed")
            })
            .collect();
        let mut per_node = vec![0u32; types.len()];
        let mut type_gpus = vec![0u32; types.len()];
        for (n, &t) in cluster.nodes.iter().zip(&node_type) {
            per_node[t] = per_node[t].max(n.gpus);
            type_gpus[t] += n.gpus;
        }
        let mut apps = Vec::new();
        let mut app_index = HashMap::new();
        for p in profiles {
            app_index.insert(p.name.clone(), apps.len());
            apps.push(App::new(p)?);
        }
        let gpu: Vec<Vec<Option<usize>>> = apps
            .iter()
            .map(|a| {
                let names: Vec<&str> = a.gpu_types().collect();
                types
                    .iter()
                    .map(|t| names.iter().position(|n| n == t))
                    .collect()
            })
            .collect();
        let most_gpus = *type_gpus.iter().max().expect("a type");
        let nodes_of: Vec<u32> = (0..types.len())
            .map(|t| node_type.iter().filter(|&&x| x == t).count() as u32)
            .collect();
        Ok(Setup {
            world: World {
                apps,
                gpu,
                per_node,
                type_gpus,
                node_type,
            },
            types,
            elastic: scheduler.elastic(),
            sizing: scheduler.batch_sizing(),
            most_gpus,
            app_index,
            config,
            nodes_of,
            epoch_bests: RefCell::new(HashMap::new()),
            epoch_rates: RefCell::new(HashMap::new()),
        })
    }

    /// Each epoch's best goodput and fewest GPU-seconds per unit of progress of application
    /// `app` on the cluster under batch `choice` (`None`: the best configuration of each
    /// placement), made once per replay.
    pub(super) fn epoch_best(&self, app: usize, choice: Option<u32>) -> Arc<EpochBest> {
        if let Some(b) = self.epoch_bests.borrow().get(&(app, choice)) {
            return b.clone();
        }
        let w = &self.world;
        let b = Arc::new(epoch_best(
            &w.apps[app],
            &w.gpu[app],
            w,
            &self.nodes_of,
            choice,
        ));
        self.epoch_bests
            .borrow_mut()
            .insert((app, choice), b.clone());
        b
    }

    /// The batch choices a job of application `app` asking for `batch_size` may get under
    /// some scheduler: what the alone bound takes the best of.
    pub(super) fn batch_choices(&self, app: usize, batch_size: u32) -> Vec<Option<u32>> {
        let app = &self.world.apps[app];
        match app.fixed_batch_size {
            Some(b) => vec![Some(b)],
            None => vec![
                Some(batch_size.clamp(app.init_batch_size, app.max_batch_size)),
                None,
            ],
        }
    }

    /// The rates a training job's account compares its progress with, shared by the jobs
    /// of one application with the same batch choices.
    fn epoch_rates(&self, app: usize, batch_size: u32, own: Option<u32>) -> Arc<EpochRates> {
        let choices = self.batch_choices(app, batch_size);
        let key = ((app, choices[0]), own);
        if let Some(r) = self.epoch_rates.borrow().get(&key) {
            return r.clone();
        }
        let firsts: Vec<Vec<f64>> = choices
            .into_iter()
            .map(|c| self.epoch_best(app, c).iter().map(|e| e.0).collect())
            .collect();
        let views: Vec<&[f64]> = firsts.iter().map(Vec::as_slice).collect();
        let own: Vec<f64> = self.epoch_best(app, own).iter().map(|e| e.0).collect();
        let rates = Arc::new(EpochRates::new(&self.world.apps[app], &views, &own));
        self.epoch_rates.borrow_mut().insert(key, rates.clone());
        rates
    }

    /// Checks a job of the trace and makes its state, nothing done yet (its time alone to be
    /// filled in).
    pub(super) fn admit(&self, id: usize, j: TraceJob) -> Result<JobState, PolicyError> {
        let bad = |m: String| PolicyError::InvalidConfig(format!("job {}: {m}", j.name));
        if !(j.submit_s.is_finite() && j.submit_s >= 0.0) {
            return Err(bad(format!("submit time {}", j.submit_s)));
        }
        if j.requested_replicas == 0 {
            return Err(bad("asks for 0 GPUs".into()));
        }
        let world = &self.world;
        let most_gpus = self.most_gpus;
        let (app_i, total, batch, requested, max_replicas) = match &j.work {
            Work::Rigid { duration_s, .. } => {
                if !(duration_s.is_finite() && *duration_s > 0.0) {
                    return Err(bad(format!("duration {duration_s} s, expected > 0")));
                }
                // Shrinking a rigid job would change what it is: it does not fit at all.
                if j.requested_replicas > most_gpus {
                    return Err(bad(format!(
                        "a rigid job on {} GPUs does not fit: the cluster has at most {most_gpus} \
                         GPUs of one type",
                        j.requested_replicas
                    )));
                }
                let r = j.requested_replicas;
                (None, *duration_s, None, r, r)
            }
            Work::Train {
                application,
                batch_size,
            } => {
                let &app_i = self
                    .app_index
                    .get(application.as_str())
                    .ok_or_else(|| bad(format!("no profile for application {application:?}")))?;
                if *batch_size == 0 {
                    return Err(bad("asks for a batch of 0".into()));
                }
                if world.gpu[app_i].iter().all(Option::is_none) {
                    return Err(bad(format!(
                        "application {application} has no measurements on any GPU type of the \
                         cluster ({})",
                        self.types.join(", ")
                    )));
                }
                let app = &world.apps[app_i];
                let batch = match (app.fixed_batch_size, self.sizing) {
                    (Some(b), _) => Some(b),
                    (None, BatchSizing::Fixed) => {
                        Some((*batch_size).clamp(app.init_batch_size, app.max_batch_size))
                    }
                    (None, BatchSizing::Adaptive) => None,
                };
                let by_batch = batch.unwrap_or(app.max_batch_size) / app.min_local_bsz;
                // Trainers adapt to the GPUs they get, so a job bigger than the cluster shrinks.
                let requested = j.requested_replicas.min(most_gpus);
                let max_replicas = if self.elastic {
                    by_batch
                        .min(app.max_replicas.unwrap_or(u32::MAX))
                        .min(most_gpus)
                        .max(1)
                } else {
                    requested
                };
                (
                    Some(app_i),
                    app.total_progress(),
                    batch,
                    requested,
                    max_replicas,
                )
            }
        };
        let rates = match (&j.work, app_i) {
            (Work::Train { batch_size, .. }, Some(a)) => {
                Some(self.epoch_rates(a, *batch_size, batch))
            }
            _ => None,
        };
        Ok(JobState {
            id,
            trace: j,
            app: app_i,
            total,
            batch,
            requested,
            max_replicas,
            progress: 0.0,
            epoch: 0,
            slots: Vec::new(),
            worker_type: None,
            config: BatchConfig {
                atomic_bsz: 0,
                accum_steps: 0,
            },
            rescale_left: 0.0,
            attained: 0.0,
            restarting: 0.0,
            running_s: 0.0,
            training_s: 0.0,
            stall_left: 0.0,
            stalled: 0.0,
            saved: Saved::default(),
            since_save_s: 0.0,
            save_left: 0.0,
            lost_training_s: 0.0,
            saving: 0.0,
            faults: 0,
            restarts: 0,
            started: None,
            finished: None,
            peak: 0,
            last_change: None,
            goodput: None,
            least_work_s: 0.0,
            epoch_best: 0.0,
            alone_s: None,
            arrived_round: 0,
            arrived_contention: 0.0,
            account: JctAccount::default(),
            rates,
            held_rates: None,
            packed_rates: Default::default(),
        })
    }

    /// Seconds `job` would take alone on the cluster at its request, for its finish-time
    /// fairness: from its submission to the next round, one restart penalty, then its work.
    fn alone_s(&self, job: &JobState) -> Option<f64> {
        let submit = job.trace.submit_s;
        let round = self.config.round_s;
        let first_round = (submit / round).ceil() * round;
        self.world
            .alone_s(job)
            .map(|work| first_round - submit + self.config.restart_penalty_s + work)
    }
}

/// The jobs of a trace, checked, as they come.
pub(super) struct Arrivals<I> {
    pub(super) source: I,
    pub(super) last_submit_s: f64,
}

impl<I, E> Arrivals<I>
where
    I: Iterator<Item = Result<(usize, TraceJob), E>>,
    E: From<PolicyError>,
{
    pub(super) fn next(&mut self, setup: &Setup) -> Result<Option<JobState>, E> {
        let Some(item) = self.source.next() else {
            return Ok(None);
        };
        let (id, job) = item?;
        let mut job = setup.admit(id, job)?;
        job.alone_s = setup.alone_s(&job);
        let submit = job.trace.submit_s;
        if submit < self.last_submit_s {
            return Err(PolicyError::InvalidConfig(format!(
                "job {}: submitted at {submit} s, before the job ahead of it in the trace ({} \
                 s): a streamed trace must be in order of submission",
                job.trace.name, self.last_submit_s
            ))
            .into());
        }
        self.last_submit_s = submit;
        Ok(Some(job))
    }
}
