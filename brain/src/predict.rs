//! Sizing a submitted job that names no replicas or resources: what the spec leaves out is
//! filled from the brain's own history of finished jobs like it, and every choice says why.
//!
//! "Like it" means the same kind and the same workload (built-in settings or command). From
//! the successful ones the brain takes the median worker and PS counts they ended at (the
//! counts the live rounds found worth holding) and their peak memory per process with a
//! 25 % margin. Without history a job starts at its minimum (at least 2 workers where its
//! bounds allow), with one slot of CPU per process and 512 MiB. A bound the user left out
//! becomes what the cluster can hold. Counts the user gave are kept as given.

use job_master::spec::{Bytes, JobSpec, Millicores, Resources, RoleName, RoleSpec};
use optimizer::live::LiveCluster;
use optimizer::profile::{History, LearnedModel, Predictor, ProfileSample};

use crate::store::{JobRow, JobState, Shape};

const DEFAULT_MEMORY: u64 = 512 << 20;
const MEMORY_MARGIN: f64 = 1.25;

/// The spec with every count and resource filled in, its shape, and why.
#[derive(Clone, Debug)]
pub struct Prediction {
    pub spec: JobSpec,
    pub shape: Shape,
    pub reasons: Vec<String>,
}

fn median(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// Fills `spec` in. `history` is every job the brain knows (finished ones are used).
/// `model`, when `brainctl train` stored one, sizes the workers' memory (at `now_s`).
pub fn predict(
    spec: &JobSpec,
    history: &[JobRow],
    cluster: &LiveCluster,
    model: Option<&LearnedModel>,
    now_s: f64,
) -> Result<Prediction, String> {
    let learned = model.and_then(|m| {
        let mut past = crate::train::from_store(history);
        past.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        let mut h = History::default();
        for s in &past {
            h.push(s);
        }
        let job = ProfileSample {
            at_s: now_s,
            scenario: crate::train::scenario(spec),
            family: spec.kind.to_string(),
            requested: None,
            used: Default::default(),
        };
        m.predict(&h, &job).map(|d| (d, m))
    });
    let mut spec = spec.clone();
    let mut reasons = Vec::new();
    let workload = serde_json::to_string(&spec.workload).expect("plain struct");
    let similar: Vec<(&JobRow, &Shape)> = history
        .iter()
        .filter(|r| r.state == JobState::Succeeded)
        .filter_map(|r| {
            let shape = r.shape.as_ref()?;
            let past: JobSpec = serde_norway::from_str(r.spec.as_deref()?).ok()?;
            (past.kind == spec.kind && serde_json::to_string(&past.workload).ok()? == workload)
                .then_some((r, shape))
        })
        .collect();
    let names: Vec<&str> = similar.iter().map(|(r, _)| r.name.as_str()).collect();
    if similar.is_empty() {
        reasons.push(format!(
            "no finished {} job with this workload in the history: defaults",
            spec.kind
        ));
    } else {
        reasons.push(format!(
            "{} similar finished job(s): {}",
            similar.len(),
            names.join(", ")
        ));
    }
    let slot = cluster.slot_millicores;

    for role in [RoleName::Ps, RoleName::Worker] {
        let Some(r) = spec.roles.get(&role).cloned() else {
            continue;
        };
        let mut r: RoleSpec = r;
        let resources = r.resources.clone().unwrap_or_default();
        let cpu = match resources.cpu {
            Some(c) => c,
            None => {
                reasons.push(format!("{role} cpu: {slot}m, one scheduling slot"));
                Millicores(slot)
            }
        };
        let memory = match resources.memory {
            Some(m) => m,
            None if role == RoleName::Worker && learned.is_some() => {
                let (d, m) = learned.expect("checked");
                let mib = (d.0[1].max(64.0)) as u64;
                reasons.push(format!(
                    "worker memory: {mib} MiB from the job-profile model ({} jobs, margin for \
                     {:.0} % of jobs)",
                    m.trained_on,
                    m.quantile * 100.0
                ));
                Bytes(mib << 20)
            }
            None => {
                let peaks: Vec<u64> = similar
                    .iter()
                    .filter(|(row, s)| row.peak_memory_bytes > 0 && s.workers + s.ps > 0)
                    .map(|(row, s)| row.peak_memory_bytes / (s.workers + s.ps) as u64)
                    .collect();
                match median(peaks) {
                    Some(peak) => {
                        let m = ((peak as f64 * MEMORY_MARGIN) as u64).max(64 << 20);
                        reasons.push(format!(
                            "{role} memory: {} MiB, the median peak per process of similar jobs \
                             ({} MiB) + 25 %",
                            m >> 20,
                            peak >> 20
                        ));
                        Bytes(m)
                    }
                    None => {
                        reasons.push(format!(
                            "{role} memory: {} MiB (default)",
                            DEFAULT_MEMORY >> 20
                        ));
                        Bytes(DEFAULT_MEMORY)
                    }
                }
            }
        };
        r.resources = Some(Resources {
            cpu: Some(cpu),
            memory: Some(memory),
            gpu: resources.gpu,
            custom: resources.custom.clone(),
        });
        let unit = r.node_unit.unwrap_or(1).max(1);
        let per = cpu.0.div_ceil(slot).max(1);
        let fits = (cluster.cpu_millicores / slot / per) as i64;
        let fits = fits.min(cluster.max_processes as i64) / unit * unit;
        if r.max.is_none() && r.replicas.is_none() {
            r.max = Some(fits.max(unit));
            reasons.push(format!(
                "{role} max: {}, what the cluster holds",
                r.max.unwrap()
            ));
        }
        if r.replicas.is_none() {
            let min = r.min.unwrap_or(unit);
            let max = r.max.unwrap_or(min);
            let past: Vec<u64> = similar
                .iter()
                .map(|(_, s)| match role {
                    RoleName::Ps => s.ps as u64,
                    RoleName::Worker => s.workers as u64,
                })
                .collect();
            let (n, why) = match median(past) {
                Some(n) => (n as i64, "the median of similar jobs".to_string()),
                None if role == RoleName::Worker => (2, "default".to_string()),
                None => (1, "default".to_string()),
            };
            let n = (n / unit * unit).clamp(min, max);
            reasons.push(format!(
                "{role} replicas: {n} ({why}, within [{min}, {max}])"
            ));
            r.replicas = Some(n);
        }
        spec.roles.insert(role, r);
    }
    let plan = |role| spec.role_plan(role).map_err(|e| e.to_string());
    let w = plan(RoleName::Worker)?;
    let ps = spec
        .roles
        .contains_key(&RoleName::Ps)
        .then(|| plan(RoleName::Ps))
        .transpose()?;
    let res = |role| {
        spec.roles
            .get(&role)
            .and_then(|r| r.resources.clone())
            .unwrap_or_default()
    };
    let (wr, pr) = (res(RoleName::Worker), res(RoleName::Ps));
    let shape = Shape {
        kind: spec.kind.to_string(),
        workers: w.replicas,
        min_workers: w.min,
        max_workers: w.max,
        node_unit: w.node_unit,
        ps: ps.as_ref().map_or(0, |p| p.replicas),
        worker_millicores: wr.cpu.map_or(slot, |c| c.0),
        worker_memory_bytes: wr.memory.map_or(0, |m| m.0),
        worker_gpus: wr.gpu.unwrap_or(0),
        ps_millicores: pr.cpu.map_or(0, |c| c.0),
        ps_memory_bytes: pr.memory.map_or(0, |m| m.0),
        total_samples: spec.data.num_samples as u64 * spec.epochs as u64,
    };
    shape.validate()?;
    Ok(Prediction {
        spec,
        shape,
        reasons,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::JobId;

    fn spec(roles: &str) -> JobSpec {
        JobSpec::from_yaml(&format!(
            "name: t\nkind: ps\nroles:\n{roles}workload:\n  builtin: {{ batch_size: 64 }}\n\
             data: {{ num_samples: 1000, shard_size: 100 }}\nepochs: 2\n\
             checkpoint: {{ dir: /tmp/brain-predict-test }}\n"
        ))
        .unwrap()
    }

    fn cluster() -> LiveCluster {
        LiveCluster {
            cpu_millicores: 8000,
            slot_millicores: 1000,
            max_processes: 64,
        }
    }

    fn past(name: &str, workers: u32, ps: u32, peak_mib: u64, state: JobState) -> JobRow {
        let s = spec("  ps: {}\n  worker: { min: 1, max: 8 }\n");
        JobRow {
            id: JobId(1),
            name: name.into(),
            master_address: String::new(),
            registered_unix_ms: 0,
            reports: 10,
            last_global_step: 0,
            mean_samples_per_second: 0.0,
            peak_memory_bytes: peak_mib << 20,
            plan_version: 0,
            acked_version: 0,
            reached_version: 0,
            state,
            shape: Some(Shape {
                kind: "ps".into(),
                workers,
                min_workers: 1,
                max_workers: 8,
                node_unit: 1,
                ps,
                worker_millicores: 1000,
                ps_millicores: 1000,
                total_samples: 2000,
                ..Default::default()
            }),
            spec: Some(serde_norway::to_string(&s).unwrap()),
            reasons: vec![],
            run_dir: String::new(),
            workers,
            peak_workers: workers,
            last_change_unix_ms: None,
            started_unix_ms: None,
            finished_unix_ms: None,
            samples_done: 2000,
            outcome: String::new(),
            rejected_version: 0,
            reported_workers: workers,
            peak_process_millicores: 0,
            peak_process_memory_bytes: 0,
        }
    }

    #[test]
    fn without_history_a_job_gets_the_defaults_and_what_the_cluster_holds() {
        let p = predict(
            &spec("  ps: {}\n  worker: {}\n"),
            &[],
            &cluster(),
            None,
            0.0,
        )
        .unwrap();
        assert_eq!((p.shape.ps, p.shape.workers), (1, 2));
        assert_eq!(p.shape.max_workers, 8, "{:?}", p.reasons);
        assert_eq!(p.shape.worker_millicores, 1000);
        assert_eq!(p.shape.worker_memory_bytes, 512 << 20);
        assert_eq!(p.shape.total_samples, 2000);
        assert!(p.reasons.iter().any(|r| r.contains("no finished ps job")));
        p.spec.validate().unwrap();
    }

    #[test]
    fn similar_finished_jobs_give_the_counts_and_memory_with_a_margin() {
        let history = [
            past("a", 4, 2, 600, JobState::Succeeded),
            past("b", 6, 2, 800, JobState::Succeeded),
            past("c", 4, 1, 1200, JobState::Succeeded),
            past("failed", 8, 4, 9000, JobState::Failed),
        ];
        let p = predict(
            &spec("  ps: {}\n  worker: { min: 1, max: 8 }\n"),
            &history,
            &cluster(),
            None,
            0.0,
        )
        .unwrap();
        assert_eq!((p.shape.ps, p.shape.workers), (2, 4), "{:?}", p.reasons);
        // Per process: 600/6 = 100, 800/8 = 100, 1200/5 = 240 MiB; median 100 MiB + 25 %.
        assert_eq!(p.shape.worker_memory_bytes >> 20, 125, "{:?}", p.reasons);
        assert!(
            p.reasons
                .iter()
                .any(|r| r.contains("3 similar finished job(s): a, b, c"))
        );
    }

    #[test]
    fn what_the_user_gave_is_kept() {
        let p = predict(
            &spec("  ps: { replicas: 3 }\n  worker: { replicas: 5, max: 8, resources: { cpu: 2, memory: 1Gi } }\n"),
            &[past("a", 2, 1, 100, JobState::Succeeded)],
            &cluster(), None, 0.0)
        .unwrap();
        assert_eq!((p.shape.ps, p.shape.workers), (3, 5));
        assert_eq!(p.shape.worker_millicores, 2000);
        assert_eq!(p.shape.worker_memory_bytes, 1 << 30);
    }
}
