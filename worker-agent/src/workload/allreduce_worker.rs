//! A worker of an allreduce job: synchronous data-parallel SGD on a full model replica.
//!
//! Every step each rank computes the summed gradient of its local batch (the global batch split
//! over the world; a rank with no shard contributes nothing), all-reduces a small header
//! (samples, ended, waiting-for-checkpoint, loss, index sum) and then the gradient, and applies
//! the mean. All ranks therefore hold the same model after every step. A shard is reported done
//! only after the step that applied its last samples. When the master drains for a checkpoint
//! and every rank is idle, rank 0 saves the model and commits it; when every rank has reached
//! the end of the data, the loop ends and the designated rank evaluates the final model.
//!
//! With flash checkpoints (`checkpoint.flash`), the cut is a copy into the agents' shared memory
//! instead (`flash_copy.rs`): every rank keeps its copy (a restart on its node restores from
//! it), rank 0's is written out by its agent behind the training, and the group goes on as
//! soon as rank 0 has told the master. A copy that cannot be taken (over the budget, no slot
//! free, the master refusing it) is saved to disk as before. When a plan adds or moves ranks
//! at such a cut (or the group re-forms for workers that joined late), the round after does
//! not wait for the write-out: its rank 0, a process of the cut, sends the model over the
//! ring as it forms (`state_from_rank0`), and the new processes keep a copy as every rank
//! does.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use proto::jobmaster::v1 as pb;

use super::model::{DenseModel, index_sum};
use super::ring::Ring;
use super::{MasterLink, ProcessEnv, Progress, damaged, generator, simulated_compute};
use crate::error::Error;
use crate::flash_copy::{Copy, Slots};

/// This rank's share of the global batch: split evenly, the remainder to the lowest ranks.
pub fn local_batch(global: u64, world: u32, rank: u32) -> u64 {
    let w = world.max(1) as u64;
    global / w + u64::from((rank as u64) < global % w)
}

/// Loads the model a manifest names, or a fresh one; where from (`memory` or `disk`; none: a
/// fresh one). A flash checkpoint's comes from this node's memory (`flash`) when a slot holds
/// it whole, else from disk.
pub fn initial_model(
    env: &ProcessEnv,
    buckets: u64,
    flash: Option<&Slots>,
) -> Result<(DenseModel, Option<&'static str>), Error> {
    let Some(m) = env.manifest()? else {
        return Ok((DenseModel::new(buckets), None));
    };
    let part = m.model.ok_or_else(|| Error::Checkpoint {
        path: env.resume_from.clone().unwrap_or_default(),
        problem: "has no model".into(),
    })?;
    let path = PathBuf::from(&part.path);
    let (model, from) = match m.kind.as_str() {
        "flash" => match flash.and_then(|f| f.holding(m.step, &part.digest)) {
            Some(bytes) => (DenseModel::from_bytes(&bytes, &path)?, "memory"),
            None => (DenseModel::load_part(&path, &part.digest)?, "disk"),
        },
        _ => (DenseModel::load(&path, Some(&part.digest))?, "disk"),
    };
    tracing::info!(checkpoint = m.id, step = model.step, from, "model restored");
    Ok((model, Some(from)))
}

/// Where this process restored from, in the first report that goes out (then never again).
fn say_restored(m: &mut pb::TrainingMetrics, restored: &mut Option<(&'static str, u64)>) {
    if let Some((from, step)) = restored.take() {
        (m.restored_from, m.restored_step) = (from.into(), step);
    }
}

/// The cut at this drained step boundary, copied into the agent's memory (every rank; rank 0's
/// copy is written out once the master knows of the cut). Whether the cut is held there:
/// false where rank 0 saves it to disk instead.
async fn cut_in_memory(
    flash: &mut Slots,
    model: &DenseModel,
    rank0: bool,
    incarnation: u64,
    master: &mut MasterLink,
) -> Result<bool, Error> {
    let copy = Copy {
        step: model.step,
        rank: 0,
        world: 1,
        persist: rank0,
        incarnation,
        hold: rank0,
        // A replicated copy: its agent hears the answer for its own part.
        committed: None,
    };
    let slot = match flash.copy_in(&model.to_bytes(), copy)? {
        Ok(slot) => slot,
        Err(why) => {
            if rank0 {
                tracing::warn!(step = model.step, "cut saved to disk: {why}");
            }
            return Ok(false);
        }
    };
    if !rank0 {
        return Ok(true);
    }
    if let Err(s) = master.cut_in_memory(model.step).await? {
        tracing::warn!(
            step = model.step,
            "cut saved to disk: the job master refused it in memory: {}",
            s.message()
        );
        return Ok(false);
    }
    flash.release(slot)?;
    tracing::debug!(step = model.step, "cut held in memory");
    Ok(true)
}

/// The state of the cut at `step` sent by rank 0 over the ring as it forms (every rank takes
/// part): on rank 0 the model it holds (a survivor of the cut: nothing was trained since),
/// elsewhere the model it sent where this process `keep`s it (a process the plan added or
/// moved), else the model it holds (a survivor, which holds the same).
async fn state_from_rank0(
    ring: &mut Ring,
    model: DenseModel,
    step: u64,
    keep: bool,
) -> Result<DenseModel, Error> {
    let from = PathBuf::from(format!("rank 0's state at step {step}"));
    let rank0 = ring.rank() == 0;
    if rank0 && (keep || model.step != step) {
        return Err(Error::Checkpoint {
            path: from,
            problem: format!(
                "rank 0 of the round formed after the cut holds step {} (a {} process)",
                model.step,
                if keep { "new" } else { "surviving" },
            ),
        });
    }
    let began = Instant::now();
    // The checkpoint's format, at the size of this job's model (a placeholder's too).
    let max_len = DenseModel::bytes_len(model.buckets);
    let bytes = ring
        .broadcast_from_rank0(if rank0 { model.to_bytes() } else { Vec::new() }, max_len)
        .await?;
    tracing::info!(
        step,
        bytes = bytes.len(),
        took_s = began.elapsed().as_secs_f64(),
        "cut's state {} rank 0 over the ring",
        if rank0 { "sent by" } else { "received from" },
    );
    if !keep {
        return Ok(model);
    }
    let got = DenseModel::from_bytes(&bytes, &from)?;
    if got.step != step {
        return Err(Error::Checkpoint {
            path: from,
            problem: format!("holds step {}, not the cut's", got.step),
        });
    }
    Ok(got)
}

/// How the batch and the learning rate follow the world size (the job spec's `batch_scaling`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BatchScaling {
    FixedGlobal,
    Linear,
    Sqrt,
}

impl BatchScaling {
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "" | "fixed_global" => Ok(Self::FixedGlobal),
            "linear" => Ok(Self::Linear),
            "sqrt" => Ok(Self::Sqrt),
            other => Err(Error::InvalidRequest(format!(
                "batch_scaling {other:?} is not fixed_global, linear or sqrt"
            ))),
        }
    }

    /// Global batch and learning rate at `world` workers, from the configured ones.
    pub fn at(self, batch: u64, lr: f32, world: u32) -> (u64, f32) {
        let n = world.max(1);
        match self {
            Self::FixedGlobal => (batch, lr),
            Self::Linear => (batch * n as u64, lr * n as f32),
            Self::Sqrt => (batch * n as u64, lr * (n as f32).sqrt()),
        }
    }
}

pub async fn run(env: ProcessEnv) -> Result<(), Error> {
    let mut master = MasterLink::connect(&env).await?;
    let cfg = master.workload().await?;
    let scaling = BatchScaling::parse(&cfg.batch_scaling)?;
    let data = generator(&cfg)?;
    let listener = super::ps_server::bind_retry(&env.service_addr).await?;
    let mut flash = Slots::from_env();
    // A process the plan added or moved at a cut held in memory gets the cut's state from
    // rank 0 as the ring forms, not from disk; until then it holds a fresh model.
    let (mut model, mut restored) = match env.state_from_rank0 {
        Some(_) => (DenseModel::new(cfg.hash_buckets), None),
        None => {
            let (model, from) = match initial_model(&env, cfg.hash_buckets, flash.as_ref()) {
                Ok(m) => m,
                Err(e) => return Err(damaged(&mut master, &env, e).await),
            };
            // Said in the first report: the job's events show where each process restored
            // from.
            let from = from.map(|from| (from, model.step));
            (model, from)
        }
    };
    let mut from_rank0 = env.state_from_rank0.map(|step| (step, true));
    let mut progress = Progress::new(model.step);
    let mut grad = vec![0.0f32; model.weights.len()];
    let (mut rank, mut peers, mut round) = (env.rank, env.ring_peers.clone(), env.round);
    let mut ended = false;
    let mut evaluate = false;
    'group: loop {
        let mut ring = Ring::connect(
            rank,
            &peers,
            round,
            &listener,
            Duration::from_secs(60),
            &env.creds,
        )
        .await?;
        if let Some((step, keep)) = from_rank0.take() {
            model = state_from_rank0(&mut ring, model, step, keep).await?;
            if keep {
                restored = Some(("peer", step));
                // Kept like every rank's copy of a cut: a restart here restores from it.
                if let Some(f) = flash.as_mut() {
                    cut_in_memory(f, &model, false, env.incarnation, &mut master).await?;
                }
            }
        }
        let (global, lr) = scaling.at(cfg.batch_size as u64, cfg.learning_rate, ring.world());
        let my_batch = local_batch(global, ring.world(), ring.rank());
        let mut shard: Option<(pb::Shard, u64)> = None;
        tracing::info!(
            rank = ring.rank(),
            world = ring.world(),
            round,
            batch = my_batch,
            lr,
            "ring formed"
        );
        loop {
            let mut waiting_for_checkpoint = false;
            let mut reform = false;
            if shard.is_none() {
                // Ranks at the end of the data keep asking too: they must take part in a
                // checkpoint or a re-formation the others vote for.
                let lease = master.lease(0, round).await?;
                match pb::LeaseStatus::try_from(lease.status).unwrap_or(pb::LeaseStatus::Wait) {
                    pb::LeaseStatus::Granted => {
                        let s = lease.shard.ok_or_else(|| {
                            Error::InvalidRequest("a granted lease without a shard".into())
                        })?;
                        let start = s.start;
                        shard = Some((s, start));
                    }
                    pb::LeaseStatus::Wait | pb::LeaseStatus::Removed => {
                        waiting_for_checkpoint = lease.checkpoint_due;
                        reform = lease.reform;
                    }
                    _ => {
                        ended = true;
                        evaluate = lease.evaluate;
                    }
                }
            }
            // Local batch: this rank's own work, timed for straggler detection.
            let computing = Instant::now();
            let (n, loss, isum) = match &shard {
                Some((s, pos)) => {
                    let n = my_batch.min(s.end - pos);
                    let samples: Vec<_> = (*pos..pos + n).map(|i| data.sample(i)).collect();
                    let loss = model.accumulate(&samples, &mut grad);
                    (n, loss, index_sum(*pos, n))
                }
                None => (0, 0.0, 0),
            };
            simulated_compute(&cfg, n).await;
            let took = computing.elapsed();
            let mut header = [
                n as f64,
                (ended && shard.is_none()) as u8 as f64,
                waiting_for_checkpoint as u8 as f64,
                loss,
                isum as f64,
                reform as u8 as f64,
            ];
            ring.allreduce_sum(&mut header).await?;
            let total = header[0] as u64;
            let world = ring.world() as f64;
            if total > 0 {
                ring.allreduce_sum(&mut grad).await?;
                model.apply(&grad, total, lr);
                model.applied_samples += total;
                model.applied_index_sum = model.applied_index_sum.wrapping_add(header[4] as u64);
                grad.iter_mut().for_each(|g| *g = 0.0);
                // Throughput counts this rank's samples; the loss is the global batch's mean.
                progress.record(n, header[3] * n as f64 / total as f64);
                if n == my_batch {
                    progress.computed(took);
                }
            }
            if let Some((s, pos)) = shard.as_mut() {
                *pos += n;
                if *pos >= s.end {
                    master.done(s).await?;
                    shard = None;
                }
            }
            if let Some(mut m) = progress.due() {
                m.applied_samples = model.applied_samples;
                m.applied_index_sum = model.applied_index_sum;
                say_restored(&mut m, &mut restored);
                master.metrics(m).await?;
            }
            if total > 0 {
                continue;
            }
            if header[1] == world {
                break 'group;
            }
            if header[5] == world {
                // Every rank is at the same step boundary with the same model: leave the ring
                // and join the new group; this process keeps its model in memory.
                drop(ring);
                let Some(r) = master.rejoin().await? else {
                    tracing::info!(step = model.step, "removed by a scale plan");
                    return Ok(());
                };
                (rank, peers, round) = (r.rank, r.peers, r.round);
                // A survivor: rank 0 sends what every survivor holds; the others pass it on.
                from_rank0 = (r.state_from_rank0 != 0).then_some((r.state_from_rank0, false));
                progress.report_next();
                continue 'group;
            }
            if header[2] == world {
                let rank0 = ring.rank() == 0;
                let held = match flash.as_mut() {
                    Some(f) => {
                        cut_in_memory(f, &model, rank0, env.incarnation, &mut master).await?
                    }
                    None => false,
                };
                if rank0 && !held {
                    let dir = PathBuf::from(&cfg.checkpoint_dir)
                        .join(format!("ar-r{round:04}-s{:08}", model.step));
                    let path = dir.join("model.bin");
                    let m = model.clone();
                    let p = path.clone();
                    let digest = tokio::task::spawn_blocking(move || m.save(&p))
                        .await
                        .map_err(|e| Error::InvalidRequest(e.to_string()))??;
                    master
                        .commit(model.step, path.display().to_string(), digest)
                        .await?;
                }
            } else {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    let mut m = progress.due().unwrap_or_default();
    say_restored(&mut m, &mut restored);
    m.global_step = model.step;
    m.samples_total = progress.samples;
    m.loss = progress.loss_ema.unwrap_or(0.0);
    m.applied_samples = model.applied_samples;
    m.applied_index_sum = model.applied_index_sum;
    if evaluate {
        let loss = super::model::eval_loss(
            &data,
            cfg.num_samples..cfg.num_samples + cfg.eval_samples,
            |k| model.weight(k),
        );
        tracing::info!(loss, "final held-out log-loss");
        m.final_eval_loss = Some(loss);
        m.final_model_digest = Some(model.digest());
    }
    master.metrics(m).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_batches_add_up_to_the_global_batch() {
        for world in 1..9 {
            let total: u64 = (0..world).map(|r| local_batch(256, world, r)).sum();
            assert_eq!(total, 256);
        }
        assert_eq!(local_batch(10, 4, 0), 3);
        assert_eq!(local_batch(10, 4, 3), 2);
    }
}
