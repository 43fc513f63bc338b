//! The report a job master writes when its job has ended, and what its run left on this node.

use super::*;

pub(super) fn build_report(ctx: &JobContext, ps_stats: Vec<PsStats>, now_ms: u64) -> JobReport {
    let applied = ctx
        .metrics
        .get(&crate::job::SlotKey {
            role: ctx.trainer(),
            index: ctx.evaluator.map(|k| k.index).unwrap_or(0),
        })
        .cloned()
        .unwrap_or_default();
    JobReport {
        job: ctx.spec.name.clone(),
        kind: ctx.spec.kind,
        phase: ctx.phase.phase(),
        reason: ctx.phase.reason().map(str::to_string),
        elapsed_ms: now_ms,
        first_step_after_ms: ctx.first_step_at_ms.map(|t| t - ctx.started_at_ms),
        final_eval_loss: ctx.final_eval_loss,
        final_model_digest: ctx.final_model_digest.clone(),
        exactly_once: if !ctx.data_tracked() {
            "not tracked".into()
        } else {
            match ctx.ledger.verify_exactly_once(ctx.ledger.is_complete()) {
                Ok(()) => "ok".into(),
                Err(e) => e.to_string(),
            }
        },
        data_tracked: ctx.data_tracked(),
        samples_per_epoch: ctx.ledger.samples_per_epoch(),
        shards_done: ctx.ledger.done_shards(),
        shards_total: ctx.ledger.total_shards(),
        restarts: ctx.roles.restarts(),
        checkpoints: ctx.committed_checkpoints(),
        ps_stats,
        applied_samples: applied.applied_samples,
        applied_index_sum: applied.applied_index_sum,
        transitions: ctx.transitions.clone(),
        reshards: ctx.reshards.clone(),
        events: ctx
            .events
            .iter()
            .map(|e| format!("{:>8} ms  {}", e.at_ms, e.text))
            .collect(),
        hangs: ctx.stability.hangs.clone(),
        precheck: ctx.stability.precheck.clone(),
        effective_training: Some(ctx.effective_training(now_ms)),
    }
}

/// Removes run `run_id`'s flash copies on this node once every agent has stopped: the agents
/// told the job is over removed their own, so what is left was an agent's killed -9 and never
/// started again (or the run's empty directory).
pub(super) fn remove_flash_leftovers(run_id: &str) {
    let dir = vocab::flash::run_dir(&vocab::flash::root(), run_id);
    let left: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => return,
    };
    match std::fs::remove_dir_all(&dir) {
        Ok(()) if !left.is_empty() => tracing::info!(
            "removed the flash copies agents left in {}: {}",
            dir.display(),
            left.join(", ")
        ),
        Ok(()) => {}
        Err(e) => tracing::warn!("cannot remove {}: {e}", dir.display()),
    }
}
