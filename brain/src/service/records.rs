//! A job's record on the wire (`GetJob`, `ListJobs`): its stored row with what the brain keeps
//! beside it (GPU use, a recent snapshot, why it waits, its plans).

use proto::service::v1 as pb;

use super::shapes::shape_to;
use crate::store::JobRow;

/// What a job's record carries beside its row: kept in memory (its newest reports, the last
/// round) or read on demand (its plans, for GetJob only).
#[derive(Default)]
pub(super) struct Extras {
    pub gpu: crate::store::JobGpuUse,
    pub snapshot: crate::store::JobSnapshot,
    pub waiting: String,
    pub plans: Vec<crate::store::PlanEntry>,
}

/// The plans `GetJob` shows, newest first.
pub(super) const PLANS_SHOWN: usize = 10;

pub(super) fn record((row, extras): (JobRow, Extras)) -> pb::JobRecord {
    let Extras {
        gpu,
        snapshot,
        mut waiting,
        plans,
    } = extras;
    if waiting.is_empty() && row.state == crate::store::JobState::Running {
        waiting = pending_reason(&snapshot.pending);
    }
    pb::JobRecord {
        recent_samples_per_second: snapshot.samples_per_second,
        waiting_reason: waiting,
        plans: plans
            .into_iter()
            .map(|p| pb::PlanEntry {
                version: p.version,
                reason: p.reason,
                created_unix_ms: p.created_unix_ms,
                answer: match p.accepted {
                    Some(true) => "accepted".into(),
                    Some(false) => format!("refused: {}", p.answer),
                    None => String::new(),
                },
            })
            .collect(),
        gpu_utilisation_pct: gpu.utilisation_pct,
        gpu_memory_bytes: gpu.memory_bytes(),
        gpu_processes: gpu
            .processes
            .iter()
            .map(|p| pb::ProcessGpu {
                role: p.process.role.to_string(),
                index: p.process.index,
                utilisation_pct: p.utilisation_pct,
                memory_bytes: p.memory_bytes,
            })
            .collect(),
        job_id: row.id.0,
        job_name: row.name,
        master_address: row.master_address,
        registered_unix_ms: row.registered_unix_ms,
        reports: row.reports,
        last_global_step: row.last_global_step,
        mean_samples_per_second: row.mean_samples_per_second,
        peak_memory_bytes: row.peak_memory_bytes,
        plan_version: row.plan_version,
        acked_version: row.acked_version,
        reached_version: row.reached_version,
        state: row.state.as_str().to_string(),
        shape: row.shape.map(|mut s| {
            // The training group at its count in force.
            s.training_group_mut().count = row.workers;
            shape_to(s)
        }),
        reasons: row.reasons,
        samples_done: row.samples_done,
        outcome: row.outcome,
        run_dir: row.run_dir,
    }
}

/// A process pending at most this long is starting, not waiting: a running job says it waits
/// only for processes pending longer.
const PENDING_SHOWN_MS: u64 = 10_000;

/// Why a running job waits: its processes pending longer than [`PENDING_SHOWN_MS`], longest
/// first, with the platform's reason where it gave one (empty: none waits).
fn pending_reason(pending: &[crate::store::PendingProcess]) -> String {
    let long: Vec<String> = pending
        .iter()
        .filter(|p| p.pending_ms > PENDING_SHOWN_MS)
        .map(|p| {
            let mut s = format!("{} for {} s", p.process, p.pending_ms / 1000);
            if !p.reason.is_empty() {
                s += &format!(" ({})", p.reason);
            }
            s
        })
        .collect();
    match long.len() {
        0 => String::new(),
        1 => format!("1 process waits to run: {}", long[0]),
        n => format!("{n} processes wait to run: {}", long.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::PendingProcess;

    #[test]
    fn a_running_job_says_which_processes_wait_to_run_and_why() {
        let p = |role, index, pending_ms, reason: &str| PendingProcess {
            process: vocab::SlotKey { role, index },
            pending_ms,
            reason: reason.into(),
        };
        assert_eq!(pending_reason(&[]), "");
        // Starting for a few seconds is not waiting.
        assert_eq!(pending_reason(&[p(vocab::Role::WORKER, 0, 3_000, "")]), "");
        assert_eq!(
            pending_reason(&[
                p(
                    vocab::Role::WORKER,
                    2,
                    312_400,
                    "no node has room for 1 CPU"
                ),
                p(vocab::Role::PS, 0, 40_000, ""),
                p(vocab::Role::WORKER, 1, 2_000, ""),
            ]),
            "2 processes wait to run: worker-2 for 312 s (no node has room for 1 CPU); \
             ps-0 for 40 s"
        );
    }
}
