//! The simulated world: each job's state, the cluster's GPUs per node and type, and how a job
//! progresses on a placement.

use super::account::{self, EpochRates, HeldRates, JctAccount, PackedRates};
use super::app::{App, BatchConfig};
use super::checkpoints::{CheckpointModel, Saved};
use super::{SimConfig, TraceJob};
use std::sync::Arc;

use crate::error::PolicyError;
use crate::schedule::{JobView, Slots};
use crate::units::JobId;

#[derive(Clone)]
pub(super) struct JobState {
    /// Its position in the trace: its id for the scheduler.
    pub(super) id: usize,
    pub(super) trace: TraceJob,
    /// The application a training job trains; `None` for a rigid job.
    pub(super) app: Option<usize>,
    /// Progress at which the job is done: the application's total, or a rigid job's seconds.
    pub(super) total: f64,
    /// Fixed total batch size, or `None` to adapt it to the allocation.
    pub(super) batch: Option<u32>,
    pub(super) requested: u32,
    pub(super) max_replicas: u32,
    pub(super) progress: f64,
    pub(super) epoch: u32,
    pub(super) slots: Slots,
    pub(super) worker_type: Option<usize>,
    pub(super) config: BatchConfig,
    pub(super) rescale_left: f64,
    pub(super) attained: f64,
    /// GPU-seconds of `attained` held while starting or restarting (no progress).
    pub(super) restarting: f64,
    pub(super) running_s: f64,
    /// Seconds of training at full speed that its progress equals: time making progress
    /// times its slowest node's speed (restarts, stalls and waits excluded).
    pub(super) training_s: f64,
    /// Seconds left until the fault that stopped it is noticed (it holds its GPUs and makes
    /// no progress meanwhile), and the GPU-seconds it held so.
    pub(super) stall_left: f64,
    pub(super) stalled: f64,
    /// With a checkpoint model: its last save, the seconds of training since, the seconds
    /// left of the save under way, the seconds of training lost to failures, and the
    /// GPU-seconds it held while saving.
    pub(super) saved: Saved,
    pub(super) since_save_s: f64,
    pub(super) save_left: f64,
    pub(super) lost_training_s: f64,
    pub(super) saving: f64,
    /// Faults that struck it: failures of its nodes, and moves off a node found slow.
    pub(super) faults: u32,
    pub(super) restarts: u32,
    pub(super) started: Option<f64>,
    pub(super) finished: Option<f64>,
    pub(super) peak: u32,
    pub(super) last_change: Option<f64>,
    /// Goodput per worker type and size, for the epoch it was computed in.
    pub(super) goodput: Option<(u32, Arc<[Vec<f64>]>)>,
    /// For the invariants: the least seconds of running (restart penalties aside) its
    /// finished epochs could have taken, each at the best goodput it ever ran that epoch at
    /// (a rigid job: its duration)...
    pub(super) least_work_s: f64,
    /// ...and that best goodput in the current epoch.
    pub(super) epoch_best: f64,
    /// Seconds it would take alone at its request, from its submission (its finish-time
    /// fairness' yardstick); `None` if no type can run it.
    pub(super) alone_s: Option<f64>,
    /// Rounds recorded before it arrived, and the jobs in the system summed over them: with
    /// the same at its finish, its mean contention.
    pub(super) arrived_round: usize,
    pub(super) arrived_contention: f64,
    /// Where its time went so far ([`account`]): the parts a replay measures as it runs.
    pub(super) account: JctAccount,
    /// A training job's best rates per epoch, and those of its GPU count.
    pub(super) rates: Option<Arc<EpochRates>>,
    pub(super) held_rates: Option<HeldRates>,
    pub(super) packed_rates: PackedRates,
}

impl JobState {
    /// A failure took it back to its last save: the training since is lost.
    pub(super) fn roll_back(&mut self) {
        let s = self.saved;
        self.lost_training_s += self.training_s - s.training_s;
        self.progress = s.progress;
        self.epoch = s.epoch;
        self.training_s = s.training_s;
        self.least_work_s = s.least_work_s;
        self.epoch_best = s.epoch_best;
        self.since_save_s = 0.0;
        self.save_left = 0.0;
    }

    /// Its JCT in parts ([`JctAccount`]), once it has finished: the parts measured as it ran,
    /// with its floor, its wait for a first start and its alone bound's work put in.
    pub(super) fn jct_account(&self, config: &SimConfig) -> JctAccount {
        let mut a = self.account;
        let Some(start) = self.started else {
            return a;
        };
        let submit = self.trace.submit_s;
        let first_round = (submit / config.round_s).ceil() * config.round_s;
        a.floor_s = first_round - submit + config.restart_penalty_s;
        a.queue_s = start - first_round;
        a.restarts_s -= config.restart_penalty_s;
        // Work at the best rate beyond the job's (once) was done again after a failure.
        let least = self.rates.as_ref().map_or(self.total, |r| r.least_s);
        a.faults_s += a.least_s - least;
        a.least_s = least;
        a
    }

    /// It saves now: what a failure takes it back to.
    fn save(&mut self, model: &CheckpointModel) {
        self.saved = Saved {
            progress: self.progress,
            epoch: self.epoch,
            training_s: self.training_s,
            least_work_s: self.least_work_s,
            epoch_best: self.epoch_best,
        };
        self.since_save_s = 0.0;
        self.save_left = model.save_s;
    }
}

/// GPUs per node when `r` are packed on nodes of `per_node`.
pub(super) fn packed(r: u32, per_node: u32) -> Vec<u32> {
    let per_node = per_node.max(1);
    let mut v = vec![per_node; (r / per_node) as usize];
    if !r.is_multiple_of(per_node) {
        v.push(r % per_node);
    }
    v
}

pub(super) struct World {
    pub(super) apps: Vec<App>,
    /// gpu[app][worker type] = the app's GPU index for that type.
    pub(super) gpu: Vec<Vec<Option<usize>>>,
    pub(super) per_node: Vec<u32>,
    pub(super) type_gpus: Vec<u32>,
    pub(super) node_type: Vec<usize>,
}

impl World {
    pub(super) fn config_for(
        &self,
        job: &JobState,
        app: usize,
        t: usize,
        r: u32,
    ) -> (BatchConfig, f64) {
        let Some(gpu) = self.gpu[app][t] else {
            return (
                BatchConfig {
                    atomic_bsz: 0,
                    accum_steps: 0,
                },
                0.0,
            );
        };
        let digits = packed(r, self.per_node[t]);
        self.config_on(job, gpu, &digits, &self.apps[app])
    }

    pub(super) fn config_on(
        &self,
        job: &JobState,
        gpu: usize,
        digits: &[u32],
        app: &App,
    ) -> (BatchConfig, f64) {
        let r: u32 = digits.iter().sum();
        match job.batch {
            Some(b) => {
                let c = app.fixed_config(r, b);
                (c, app.goodput(gpu, digits, c, job.epoch))
            }
            None => app.best_config(gpu, digits, job.epoch),
        }
    }

    pub(super) fn view(&self, job: &mut JobState, id: JobId, elastic: bool) -> JobView {
        let stale = job.goodput.as_ref().is_none_or(|(e, _)| *e != job.epoch);
        if stale {
            // A rigid job progresses one second per second on exactly its GPUs.
            let table: Vec<Vec<f64>> = (0..self.per_node.len())
                .map(|t| {
                    (0..=job.max_replicas)
                        .map(|r| match job.app {
                            _ if r == 0 => 0.0,
                            None => f64::from(u8::from(r == job.requested)),
                            Some(_) if !elastic && r != job.requested => 0.0,
                            Some(app) => self.config_for(job, app, t, r).1,
                        })
                        .collect()
                })
                .collect();
            job.goodput = Some((job.epoch, Arc::from(table)));
        }
        JobView {
            id,
            submitted_s: job.trace.submit_s,
            requested_replicas: job.requested,
            max_replicas: job.max_replicas,
            attained_gpu_s: job.attained,
            running_s: job.running_s,
            restarts: job.restarts,
            peak_replicas: job.peak,
            last_change_s: job.last_change,
            current: job.slots.clone(),
            goodput: job.goodput.as_ref().expect("computed above").1.clone(),
            remaining: (job.total - job.progress).max(0.0),
        }
    }

    /// Seconds `job` (as submitted, nothing done yet) takes alone on the cluster at its
    /// request, packed on the worker type that finishes it soonest; `None` if no type can.
    pub(super) fn alone_s(&self, job: &JobState) -> Option<f64> {
        (0..self.per_node.len())
            .filter(|&t| self.type_gpus[t] >= job.requested)
            .filter_map(|t| {
                let mut j = job.clone();
                if let Some(app) = j.app {
                    self.gpu[app][t]?;
                    j.config = self.config_for(&j, app, t, j.requested).0;
                }
                j.slots = packed(j.requested, self.per_node[t])
                    .into_iter()
                    .enumerate()
                    .collect();
                j.worker_type = Some(t);
                j.rescale_left = 0.0;
                let none_idle = vec![0; self.per_node.len()];
                self.advance(&mut j, 0.0, f64::MAX, 1.0, None, &none_idle);
                j.finished
            })
            .min_by(f64::total_cmp)
    }

    /// Runs `job` from `t0` for `dt` seconds at `speed` (its slowest node's, 1 when well): a
    /// stalled job only waits out its stall, then gives its GPUs back. `idle`: the GPUs of
    /// each type no job holds this round (for its account).
    pub(super) fn advance(
        &self,
        job: &mut JobState,
        t0: f64,
        dt: f64,
        speed: f64,
        saves: Option<&CheckpointModel>,
        idle: &[u32],
    ) {
        if job.stall_left > 0.0 {
            let held: u32 = job.slots.iter().map(|s| s.1).sum();
            let d = job.stall_left.min(dt);
            job.attained += d * held as f64;
            job.stalled += d * held as f64;
            job.running_s += d;
            job.account.faults_s += d;
            job.stall_left -= d;
            if job.stall_left <= 1e-9 {
                job.stall_left = 0.0;
                job.slots.clear();
                job.rescale_left = 0.0;
                // The rest of the stretch it waits without GPUs.
                job.account.waits_s += dt - d;
            }
            return;
        }
        if job.finished.is_some() {
            return;
        }
        if job.slots.is_empty() {
            if job.started.is_some() {
                job.account.waits_s += dt;
            }
            return;
        }
        let t = job.worker_type.expect("a job with GPUs has a type");
        let held: u32 = job.slots.iter().map(|s| s.1).sum();
        let digits: Vec<u32> = job.slots.iter().map(|s| s.1).collect();
        let mut now = t0;
        let mut left = dt;
        let hold = |job: &mut JobState, s: f64| {
            job.attained += s * held as f64;
            job.running_s += s;
        };
        let d = job.rescale_left.min(left);
        job.rescale_left -= d;
        hold(job, d);
        job.restarting += d * held as f64;
        job.account.restarts_s += d;
        now += d;
        left -= d;
        let Some(app_i) = job.app else {
            // One second of its duration per second, at full speed.
            let need = (job.total - job.progress) / speed;
            if left < need {
                job.progress += left * speed;
                job.training_s += left * speed;
                account::rigid(&mut job.account, left, speed);
                hold(job, left);
            } else {
                job.training_s += job.total - job.progress;
                job.progress = job.total;
                account::rigid(&mut job.account, need, speed);
                hold(job, need);
                job.finished = Some(now + need);
                job.least_work_s = job.total;
            }
            return;
        };
        let app = &self.apps[app_i];
        let Some(gpu) = self.gpu[app_i][t] else {
            hold(job, left);
            job.account.faults_s += left;
            return;
        };
        while left > 1e-9 && job.finished.is_none() {
            if job.save_left > 0.0 {
                // A save under way: GPUs held, no progress.
                let d = job.save_left.min(left);
                job.save_left = if job.save_left - d <= 1e-9 {
                    0.0
                } else {
                    job.save_left - d
                };
                hold(job, d);
                job.saving += d * held as f64;
                job.account.faults_s += d;
                now += d;
                left -= d;
                continue;
            }
            let raw = app.goodput(gpu, &digits, job.config, job.epoch);
            let g = raw * speed;
            if g <= 0.0 {
                hold(job, left);
                job.account.faults_s += left;
                return;
            }
            let cached = job.held_rates.take();
            let mut packed = std::mem::take(&mut job.packed_rates);
            let now_rates = HeldRates::of(cached, self, job, app_i, (t, held), idle, &mut packed);
            job.packed_rates = packed;
            let rates = now_rates.held();
            job.held_rates = Some(now_rates);
            let trained = |job: &mut JobState, d: f64| {
                if let Some(r) = job.rates.clone() {
                    account::train(&mut job.account, &r, &rates, job.epoch, d, raw, speed);
                }
            };
            job.epoch_best = job.epoch_best.max(g);
            let next = app.progress_at(job.epoch + 1);
            // Seconds until the next save is due (training seconds run at `speed`).
            let to_save = saves.map_or(f64::INFINITY, |c| {
                (c.every_s - job.since_save_s).max(0.0) / speed
            });
            let to_epoch = ((next - job.progress) / g).max(0.0);
            if to_save < to_epoch && to_save <= left {
                job.progress += g * to_save;
                job.training_s += to_save * speed;
                trained(job, to_save);
                hold(job, to_save);
                now += to_save;
                left -= to_save;
                job.save(saves.expect("a save is due only with a model"));
                continue;
            }
            if job.progress + g * left < next {
                job.progress += g * left;
                job.training_s += left * speed;
                job.since_save_s += left * speed;
                trained(job, left);
                hold(job, left);
                return;
            }
            let delta = to_epoch;
            job.training_s += delta * speed;
            job.since_save_s += delta * speed;
            trained(job, delta);
            job.progress = next;
            job.least_work_s += (next - app.progress_at(job.epoch)) / job.epoch_best;
            job.epoch_best = 0.0;
            job.epoch += 1;
            hold(job, delta);
            now += delta;
            left -= delta;
            if job.epoch >= app.max_epochs {
                job.finished = Some(now);
            } else if job.batch.is_none() {
                job.config = self.config_on(job, gpu, &digits, app).0;
            }
        }
    }
}

/// What every finished job must satisfy: it did all its work and took no less than the least
/// time that work allows (capacity is checked each round).
pub(super) fn check_job(j: &JobState, config: &SimConfig) -> Result<(), PolicyError> {
    let broken = |m: String| Err(PolicyError::Invariant(m));
    let Some(finish) = j.finished else {
        return Ok(());
    };
    let name = &j.trace.name;
    if j.progress < j.total * (1.0 - 1e-9) {
        return broken(format!(
            "job {name} finished with {} of its {} done",
            j.progress, j.total
        ));
    }
    // It starts at a round no earlier than its submission, pays a restart penalty, then runs
    // its work no faster than the best goodput it had in each epoch.
    let submit = j.trace.submit_s;
    let first_round = (submit / config.round_s).ceil() * config.round_s;
    let least = first_round - submit + config.restart_penalty_s + j.least_work_s;
    let jct = finish - submit;
    if jct < least - 1e-6 * least.max(1.0) {
        return broken(format!(
            "job {name} finished in {jct} s, but its work takes at least {least} s"
        ));
    }
    // Its time, part by part, adds up to its JCT.
    let account = j.jct_account(config);
    if (account.total() - jct).abs() > 1e-6 * jct.max(1.0) {
        return broken(format!(
            "job {name} finished in {jct} s, but its account adds up to {} s: {account:?}",
            account.total()
        ));
    }
    Ok(())
}
