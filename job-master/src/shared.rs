//! The state the job master's tasks share (the job context, its persister, the effect queue
//! (`EffectQueue`, bounded by admission), the phase) and the one way to change it: `Shared::apply` runs a pure decision of
//! [`crate::job`], queues its effects and waits until the change is durable. The gRPC service,
//! the brain link and the master's own tasks all go through it; it imports none of them.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use proto::checkpoint::{MANIFEST_FILE, Manifest, Part};
use proto::jobmaster::v1 as pb;
use tokio::sync::{Mutex, mpsc, watch};
use vocab::report::PsStats;

use crate::error::Error;
use crate::job::{Effect, JobContext};
use crate::persist::{Persister, write_in_checkpoints};
use crate::scale::Capacity;

/// Effects waiting for the executor beyond which the job master refuses calls.
pub const MAX_PENDING_EFFECTS: usize = 4096;

/// The queue from decisions to the effect executor. A channel without a bound, since
/// decisions queue their effects under the job's lock and the executor takes that lock to
/// record what came of them (a full bounded channel would deadlock the two), but bounded by
/// admission: while more than [`MAX_PENDING_EFFECTS`] wait, [`EffectQueue::admit`] refuses the
/// master's gRPC calls (RESOURCE_EXHAUSTED, the caller tries again) until the executor catches
/// up. The master's own decisions (timers, exits, effects' results) are not refused: their
/// effects are bounded by the job's processes.
#[derive(Clone)]
pub(crate) struct EffectQueue {
    tx: mpsc::UnboundedSender<Effect>,
    pending: Arc<AtomicUsize>,
}

/// The executor's end of an [`EffectQueue`].
pub(crate) struct EffectReceiver {
    rx: mpsc::UnboundedReceiver<Effect>,
    pending: Arc<AtomicUsize>,
}

impl EffectQueue {
    pub fn new() -> (EffectQueue, EffectReceiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        (
            EffectQueue {
                tx,
                pending: pending.clone(),
            },
            EffectReceiver { rx, pending },
        )
    }

    /// Queues `effect` (dropped when the executor has ended: the master is stopping).
    pub fn send(&self, effect: Effect) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(effect).is_err() {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Effects queued and not yet taken by the executor.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Refuses a call while the executor is more than [`MAX_PENDING_EFFECTS`] behind.
    pub fn admit(&self) -> Result<(), tonic::Status> {
        let pending = self.pending();
        if pending > MAX_PENDING_EFFECTS {
            return Err(tonic::Status::resource_exhausted(format!(
                "the job master has {pending} effects waiting to run (at most \
                 {MAX_PENDING_EFFECTS}): try again shortly"
            )));
        }
        Ok(())
    }
}

impl EffectReceiver {
    pub async fn recv(&mut self) -> Option<Effect> {
        let effect = self.rx.recv().await?;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        Some(effect)
    }
}

/// State shared by the gRPC handlers and the background tasks.
pub(crate) struct Shared {
    pub job: Arc<Mutex<JobContext>>,
    pub persister: Arc<Persister>,
    pub effects: EffectQueue,
    /// When this master's clock started: as the job's first processes launch, after the
    /// pre-run check (see [`Self::precheck_over`]).
    pub started: std::sync::Mutex<Instant>,
    /// Since when the pre-run check runs, while it does: nothing is launched yet, a plan is
    /// refused and the status says so.
    pub prechecking: std::sync::Mutex<Option<Instant>>,
    /// Where this master's clock starts: 0 for a new job, where the last master's clock
    /// stopped for a resumed one.
    pub clock_offset_ms: u64,
    pub phase: watch::Sender<vocab::Phase>,
    pub ps_stats: Mutex<Vec<PsStats>>,
    /// What the platform can place, for checking scale plans.
    pub capacity: Capacity,
    /// The brain this master takes its plans from, if any: plans from anywhere else are
    /// refused, so that two planners never race over one job's plan versions.
    pub managed_by: Option<String>,
    /// What this master wrote to the checkpoint directory's shared marker.
    pub checkpoint_token: String,
    /// The job's secret, which its processes and parameter servers present and expect, and
    /// the job's TLS when it runs with it.
    pub creds: auth::JobCreds,
    /// Where it is (absolute), for the agents the platform starts.
    pub token_file: PathBuf,
    /// The run directory, when the platform writes the processes' output files in it (local
    /// processes): a failed process's last lines are read from there.
    pub output_dir: Option<PathBuf>,
}

impl Shared {
    pub fn now_ms(&self) -> u64 {
        let started = *self.started.lock().unwrap_or_else(|e| e.into_inner());
        self.clock_offset_ms + started.elapsed().as_millis() as u64
    }

    /// How long the pre-run check has run, while it runs.
    pub fn prechecking(&self) -> Option<std::time::Duration> {
        let since = *self.prechecking.lock().unwrap_or_else(|e| e.into_inner());
        since.map(|t| t.elapsed())
    }

    /// The pre-run check is over: the job's clock starts now (the check is not the job's
    /// time: its launches are timed from here).
    pub fn precheck_over(&self) {
        *self.prechecking.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.started.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Runs a decision, hands its effects to the executor and waits until the change is durable.
    pub async fn apply<T>(
        &self,
        f: impl FnOnce(&mut JobContext, u64) -> Result<(T, Vec<Effect>), Error>,
    ) -> Result<T, Error> {
        self.apply_if(|ctx, now| f(ctx, now).map(|(v, e)| (v, e, true)))
            .await
    }

    /// [`Self::apply`] for decisions that say whether they changed anything worth a durable
    /// write (heartbeats and most timer ticks do not); unchanged state is not written.
    pub async fn apply_if<T>(
        &self,
        f: impl FnOnce(&mut JobContext, u64) -> Result<(T, Vec<Effect>, bool), Error>,
    ) -> Result<T, Error> {
        let (value, generation) = {
            let mut ctx = self.job.lock().await;
            let now = self.now_ms();
            let (value, effects, durable) = f(&mut ctx, now)?;
            let durable = durable || !effects.is_empty();
            for e in effects {
                // The executor ends only with the master; effects after that have no one to run.
                self.effects.send(e);
            }
            let new = ctx.phase.phase();
            self.phase
                .send_if_modified(|p| std::mem::replace(p, new) != new);
            (value, durable.then(|| self.persister.changed()))
        };
        if let Some(g) = generation {
            self.persister.durable(g).await?;
        }
        Ok(value)
    }
}

impl Shared {
    /// [`Self::apply_if`] where no caller waits for the answer (timers, platform events,
    /// effects that came back). A failure is logged; a context that cannot be persisted fails
    /// the job, since going on without its durable record could lose or repeat work.
    pub async fn apply_logged(
        &self,
        what: &str,
        f: impl FnOnce(&mut JobContext, u64) -> Result<((), Vec<Effect>, bool), Error>,
    ) {
        let Err(e) = self.apply_if(f).await else {
            return;
        };
        tracing::error!("{what}: {e}");
        if matches!(e, Error::Persist { .. }) {
            let mut ctx = self.job.lock().await;
            let now = self.now_ms();
            ctx.fail(format!("{what}: {e}"), now);
            self.phase.send_replace(ctx.phase.phase());
        }
    }

    /// Checks a scale plan and, if the job can carry it out, starts it; the answer says which.
    pub async fn apply_scale_plan(
        &self,
        plan: crate::scale::ScalePlan,
    ) -> Result<pb::ScalePlanAnswer, Error> {
        if let Some(took) = self.prechecking() {
            let ctx = self.job.lock().await;
            return Ok(pb::ScalePlanAnswer {
                accepted: false,
                reason: format!(
                    "the pre-run check is under way ({} s so far): nothing is launched until \
                     it ends, and a plan is taken after it",
                    took.as_secs()
                ),
                desired_version: ctx.plans.desired,
                reached_version: ctx.plans.reached,
            });
        }
        let capacity = self.capacity.clone();
        let answer = self
            .apply(|ctx, now| {
                let (accepted, reason, effects) = match ctx.apply_plan(plan, &capacity, now) {
                    Ok(e) => (true, String::new(), e),
                    Err(why) => (false, why.to_string(), Vec::new()),
                };
                Ok((
                    pb::ScalePlanAnswer {
                        accepted,
                        reason,
                        desired_version: ctx.plans.desired,
                        reached_version: ctx.plans.reached,
                    },
                    effects,
                ))
            })
            .await?;
        if !answer.accepted {
            tracing::warn!("scale plan rejected: {}", answer.reason);
        }
        Ok(answer)
    }
}

/// Writes the allreduce checkpoint manifest beside the model rank 0 saved, and commits it.
pub(crate) async fn commit_allreduce_checkpoint(
    shared: &Shared,
    key: crate::job::SlotKey,
    incarnation: u64,
    step: u64,
    model_path: String,
    digest: String,
) -> Result<(), Error> {
    let (id, dir, generation) = {
        let dir = PathBuf::from(&model_path)
            .parent()
            .map(|p| p.to_path_buf())
            .ok_or_else(|| {
                Error::InvalidRequest(format!("checkpoint path {model_path:?} has no directory"))
            })?;
        let mut ctx = shared.job.lock().await;
        ctx.begin_commit(key, incarnation, step)?;
        let (id, _) = ctx.next_checkpoint_dir();
        (id, dir, ctx.generation)
    };
    let manifest = Manifest {
        id,
        kind: "allreduce".into(),
        step,
        ps: Vec::new(),
        model: Some(Part {
            index: 0,
            path: model_path,
            digest,
            keys: 0,
        }),
        shards: Vec::new(),
    };
    commit_manifest(shared, &dir, &manifest, generation).await
}

/// A further all-reduce group's checkpoint (see [`crate::job::role_checkpoint`]): its file
/// must be there, written in full, before the step is the group's to restore from.
pub(crate) async fn commit_role_checkpoint(
    shared: &Shared,
    key: crate::job::SlotKey,
    incarnation: u64,
    r: &pb::CheckpointCommit,
) -> Result<(), Error> {
    if r.in_memory {
        return Err(Error::InvalidRequest(format!(
            "{key} commits a checkpoint held in memory, but flash checkpoints are the training \
             group's: a further all-reduce group commits the file its rank 0 wrote"
        )));
    }
    let path = PathBuf::from(&r.path);
    match tokio::fs::metadata(&path).await {
        Ok(m) if m.is_file() => {}
        _ => {
            return Err(Error::InvalidRequest(format!(
                "{key}'s checkpoint {} is not a file the job master can see (a checkpoint \
                 directory its nodes share)",
                path.display()
            )));
        }
    }
    shared
        .apply(|ctx, now| {
            ctx.commit_role_checkpoint(key, incarnation, r.step, path, r.digest.clone(), now)
                .map(|()| ((), Vec::new()))
        })
        .await
}

/// A flash checkpoint's part written out (see [`crate::job::flash`]): once every part of the
/// step is in, its manifest goes beside the parts (`flash/step-S/manifest.json`) and the step
/// is the checkpoint to restore from.
pub(crate) async fn flash_part_written(
    shared: &Shared,
    key: crate::job::SlotKey,
    incarnation: u64,
    written: crate::job::flash::PartWritten,
) -> Result<(), Error> {
    let (step, parts, id, generation, ps_job) = {
        let mut ctx = shared.job.lock().await;
        let now = shared.now_ms();
        let Some((step, done)) = ctx.flash_part_written(key, incarnation, written, now)? else {
            return Ok(());
        };
        let (id, _) = ctx.next_checkpoint_dir();
        let ps_job = ctx.spec.kind == vocab::JobKind::Ps;
        (step, done, id, ctx.generation, ps_job)
    };
    let part = |(rank, p): (&u32, &crate::job::flash::FlashPart)| Part {
        index: *rank,
        path: p.path.to_string_lossy().into_owned(),
        digest: p.digest.clone(),
        keys: p.bytes,
    };
    let mut all: Vec<Part> = parts.written.iter().map(part).collect();
    // A ps job's parts are its servers' partitions (by PS index); an allreduce job's, one
    // replicated model or each rank's shard.
    let (ps, model, shards) = match (ps_job, parts.parts) {
        (true, _) => (all, None, Vec::new()),
        (false, 1) => (Vec::new(), all.pop(), Vec::new()),
        (false, _) => (Vec::new(), None, all),
    };
    let dir = parts
        .written
        .values()
        .next()
        .and_then(|p| p.path.parent())
        .map(PathBuf::from)
        .ok_or_else(|| Error::InvalidRequest("a flash step with no part".into()))?;
    let manifest = Manifest {
        id,
        kind: "flash".into(),
        step,
        ps,
        model,
        shards,
    };
    commit_manifest(shared, &dir, &manifest, generation).await
}

/// Writes `manifest` into `dir` (atomically) and records it as the checkpoint to restore from;
/// `generation` is the one its save started in.
async fn commit_manifest(
    shared: &Shared,
    dir: &std::path::Path,
    manifest: &Manifest,
    generation: u64,
) -> Result<(), Error> {
    let path = dir.join(MANIFEST_FILE);
    // Below the checkpoint directory only, reached without following a link: the directory
    // is the one the process named, and the job's processes write there.
    let checkpoints = shared.job.lock().await.spec.checkpoint.dir.clone();
    let written = serde_json::to_vec_pretty(manifest)
        .map_err(|e| Error::InvalidRequest(e.to_string()))
        .and_then(|json| {
            write_in_checkpoints(&checkpoints, &path, &json).map_err(|e| Error::Io {
                path: path.clone(),
                source: e,
            })
        });
    let (id, step) = (manifest.id, manifest.step);
    if let Err(e) = written {
        // Not committed: a late save's mark goes with it (see `JobContext::begin_commit`).
        shared.job.lock().await.late_commits.remove(&step);
        return Err(e);
    }
    shared
        .apply(|ctx, now| {
            ctx.checkpoint_committed(id, path, step, generation, now)
                .map(|e| ((), e))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Role;
    use vocab::SlotKey;

    #[tokio::test]
    async fn calls_are_refused_while_the_executor_is_far_behind_and_admitted_once_it_catches_up() {
        let (queue, mut executor) = EffectQueue::new();
        let stop = || Effect::StopAgent {
            key: SlotKey {
                role: Role::WORKER,
                index: 0,
            },
            graceful: true,
        };
        for _ in 0..=MAX_PENDING_EFFECTS {
            queue.admit().unwrap();
            queue.send(stop());
        }
        assert_eq!(queue.pending(), MAX_PENDING_EFFECTS + 1);
        let e = queue.admit().unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("4097 effects waiting"), "{e:?}");
        executor.recv().await.unwrap();
        queue.admit().unwrap();
        // Nothing is counted for an executor that has ended.
        drop(executor);
        queue.send(stop());
        assert_eq!(queue.pending(), MAX_PENDING_EFFECTS);
    }
}
