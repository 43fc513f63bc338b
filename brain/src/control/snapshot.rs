//! What a live round plans on: the queued and running jobs from the store, with their reported
//! speeds (all of them in two queries), processes and corrections, read under the store's lock.

use optimizer::heuristics::SpeedPoint;
use optimizer::live::{LiveCluster, LiveJob, LiveSnapshot, LiveState};
use optimizer::throughput::ps_speed::PsSpeedPoint;

use crate::BrainError;
use crate::store::{JobState, Store};

/// The snapshot a round plans on.
pub(super) fn take(
    store: &Store,
    cluster: &LiveCluster,
    now_ms: i64,
) -> Result<LiveSnapshot, BrainError> {
    let now_s = now_ms as f64 / 1000.0;
    let mut jobs = Vec::new();
    let (mut speeds, mut ps_speeds) = store.active_speeds()?;
    for row in store.active()? {
        let Some(shape) = row.shape.clone() else {
            continue;
        };
        let speed = speeds
            .remove(&row.id)
            .unwrap_or_default()
            .into_iter()
            .map(|(workers, samples_per_s)| SpeedPoint {
                workers,
                samples_per_s,
            })
            .collect();
        // Whether it pins the job is the policy's (`[live] pin_while_plan_in_flight`). A job
        // being cancelled counts as one whose plan is on its way: it holds its CPU until
        // it has stopped, and nothing more is planned for it.
        let plan_in_flight = (row.plan_version > row.reached_version
            && row.plan_version != row.rejected_version)
            || row.cancel_requested.is_some();
        let (ps_processes, worker_processes) = store.processes(row.id);
        // The PS count the job master reports, unless a plan that changes it is on its way.
        let ps = if ps_processes.is_empty() {
            shape.ps
        } else if plan_in_flight {
            shape.ps.max(ps_processes.len() as u32)
        } else {
            ps_processes.len() as u32
        };
        jobs.push(LiveJob {
            id: row.id,
            name: row.name.clone(),
            state: if row.state == JobState::Queued {
                LiveState::Queued
            } else {
                LiveState::Running
            },
            submitted_s: row.registered_unix_ms as f64 / 1000.0,
            ps,
            min_ps: shape.ps_bounds().0,
            max_ps: shape.ps_bounds().1,
            // Only PS jobs have a PS speed model.
            ps_speed: if shape.ps == 0 {
                Vec::new()
            } else {
                ps_speeds.remove(&row.id).unwrap_or_default()
            }
            .into_iter()
            .map(|(workers, ps, samples_per_s)| PsSpeedPoint {
                workers,
                ps,
                samples_per_s,
            })
            .collect(),
            ps_millicores: shape.ps_millicores,
            worker_millicores: shape.worker_millicores,
            workers: row.workers.max(shape.min_workers),
            // Launched, not yet reported, or shrinking: count the larger.
            held_workers: row.workers.max(row.reported_workers),
            min_workers: shape.min_workers,
            max_workers: shape.max_workers,
            node_unit: shape.node_unit,
            speed,
            samples_left: shape.total_samples.saturating_sub(row.samples_done) as f64,
            last_change_s: row.last_change_unix_ms.map(|t| t as f64 / 1000.0),
            running_s: row
                .started_unix_ms
                .map_or(0.0, |t| (now_ms - t).max(0) as f64 / 1000.0),
            restarts: 0,
            peak_workers: row.peak_workers,
            plan_in_flight,
            ps_memory_bytes: shape.ps_memory_bytes,
            worker_memory_bytes: shape.worker_memory_bytes,
            ps_processes,
            worker_processes,
            history: store.corrections(row.id),
            worker_gpus: shape.worker_gpus,
            gpu_type: shape.gpu_type.clone(),
        });
    }
    Ok(LiveSnapshot {
        now_s,
        cluster: cluster.clone(),
        jobs,
    })
}
