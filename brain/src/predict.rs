//! Sizing a submitted job that names no replicas or resources: the decision is the
//! optimizer's ([`optimizer::sizing`]); this module hands it the brain's history (finished,
//! successful jobs with the shape they ended at) and the stored job-profile model's answer,
//! and records the sized job's [`Shape`].

use optimizer::live::LiveCluster;
use optimizer::profile::{History, LearnedModel, Predictor, ProfileSample};
use optimizer::sizing::{LearnedDemand, PastJob};
use optimizer::throughput::ps_speed::PsSpeedPoint;
use vocab::JobSpec;

use crate::BrainError;
use crate::store::{JobRow, JobState, PsSpeedsByJob, RoleShape, Shape};

/// The spec with every count and resource filled in, its shape, and why.
#[derive(Clone, Debug)]
pub struct Prediction {
    pub spec: JobSpec,
    pub shape: Shape,
    pub reasons: Vec<String>,
}

/// The workers a finished job ended at: what its last report said ran, else the count its last
/// plan set (the stored shape keeps the submitted count: sizing from it would only echo the
/// brain's earlier predictions).
fn ended_workers(row: &JobRow, shape: &Shape) -> u32 {
    [
        row.reported_workers,
        row.workers,
        shape.training_group().count,
    ]
    .into_iter()
    .find(|&n| n > 0)
    .unwrap_or(0)
}

/// The CPU of the nodes a submission is checked against: each node's with CPU to hand out,
/// and whether they are where the processes run (a Ray cluster's nodes; without Ray the pool
/// is one and the GPU nodes have none of their own: a strict spread is not checked).
#[derive(Clone, Debug, Default)]
pub struct NodeCpus {
    pub cpus: Vec<u64>,
    /// The nodes' memory, where known (a Ray cluster's nodes', or the pool's without Ray).
    pub memory: Vec<u64>,
    pub spread: bool,
    /// Each node's CPU, memory and GPUs where they are where the processes run (`spread`):
    /// a process with GPUs needs its CPU and memory on a node with its GPUs.
    pub sizes: Vec<optimizer::live::NodeSize>,
}

/// Fills `spec` in. `history` is every job the brain knows (finished ones are used), with
/// the speeds its PS jobs reported per (workers, PS) pair in `ps_speeds`.
/// `model`, when `brainctl train` stored one, sizes the workers' CPU and memory (at `now_s`).
pub fn predict(
    spec: &JobSpec,
    history: &[JobRow],
    ps_speeds: &PsSpeedsByJob,
    cluster: &LiveCluster,
    node_cpus: &NodeCpus,
    model: Option<&LearnedModel>,
    now_s: f64,
) -> Result<Prediction, BrainError> {
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
        m.predict(&h, &job).map(|d| LearnedDemand {
            worker_millicores: d.0[0],
            worker_mib: d.0[1],
            trained_on: m.trained_on,
            quantile: m.quantile,
        })
    });
    let mut past = Vec::new();
    for row in history.iter().filter(|r| r.state == JobState::Succeeded) {
        let (Some(shape), Some(text)) = (&row.shape, &row.spec) else {
            continue;
        };
        let spec: JobSpec = serde_norway::from_str(text).map_err(|e| BrainError::Stored {
            what: format!("spec of {}", row.id),
            problem: e.to_string(),
        })?;
        past.push(PastJob {
            name: row.name.clone(),
            spec,
            workers: ended_workers(row, shape),
            ps: shape.ps(),
            peak_memory_bytes: row.peak_memory_bytes,
            peak_ps_millicores: row.peak_ps_millicores,
            ps_speed: ps_speeds
                .get(&row.id)
                .into_iter()
                .flatten()
                .map(|&(workers, ps, samples_per_s)| PsSpeedPoint {
                    workers,
                    ps,
                    samples_per_s,
                })
                .collect(),
        });
    }
    let sized = optimizer::sizing::size(spec, &past, cluster, learned)
        .map_err(|e| BrainError::InvalidArgument(e.to_string()))?;
    let spec = sized.spec;
    let plan = |role| {
        spec.role_plan(role)
            .map_err(|e| BrainError::InvalidArgument(e.to_string()))
    };
    let trainer = spec.training_role();
    plan(trainer)?;
    let roles = spec
        .roles
        .keys()
        .map(|&role| {
            let p = plan(role)?;
            let r = spec
                .roles
                .get(&role)
                .and_then(|r| r.resources.clone())
                .unwrap_or_default();
            let training = role == trainer;
            // A PS that names no CPU asks for none of its own here (the sizing gave it one).
            let fallback = match spec.is_training(role) && !training {
                true => 0,
                false => cluster.slot_millicores,
            };
            Ok((
                role,
                RoleShape {
                    topology: spec.topology(role),
                    count: p.replicas,
                    min: p.min,
                    max: p.max,
                    node_unit: if training { p.node_unit } else { 1 },
                    millicores: r.cpu.map_or(fallback, |c| c.0),
                    memory_bytes: r.memory.map_or(0, |m| m.0),
                    gpus: r.gpu.unwrap_or_default(),
                    gpu_type: r.gpu_type.clone(),
                    bundle_gpus: if training { spec.worker_bundle() } else { None },
                    shares_worker_devices: spec.shares_worker_devices(role),
                },
            ))
        })
        .collect::<Result<_, BrainError>>()?;
    let shape = Shape {
        kind: spec.kind,
        total_samples: spec.data.num_samples as u64 * spec.epochs as u64,
        training: trainer,
        roles,
        placement: spec.placement.clone(),
    };
    shape.validate().map_err(BrainError::InvalidArgument)?;
    // Every role's GPUs, and each placement group whole, on the cluster's GPU nodes.
    if let Some(why) = optimizer::live::never_holds(&spec, &cluster.nodes) {
        return Err(BrainError::InvalidArgument(why));
    }
    // Every process's CPU, and each placement group's, on the nodes' CPUs.
    if let Some(why) = optimizer::live::never_holds_cpu(
        &spec,
        &node_cpus.cpus,
        cluster.slot_millicores,
        node_cpus.spread,
    ) {
        return Err(BrainError::InvalidArgument(why));
    }
    if let Some(why) =
        optimizer::live::never_holds_memory(&spec, &node_cpus.memory, node_cpus.spread)
    {
        return Err(BrainError::InvalidArgument(why));
    }
    // A process with GPUs: its CPU and memory beside them, its training group's minimum on
    // the nodes of one model.
    if let Some(why) =
        optimizer::live::never_holds_beside_gpus(&spec, &node_cpus.sizes, cluster.slot_millicores)
    {
        return Err(BrainError::InvalidArgument(why));
    }
    Ok(Prediction {
        spec,
        shape,
        reasons: sized.reasons,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::JobId;
    use std::collections::BTreeMap;
    use vocab::Role;
    use vocab::spec::Topology;

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
            free: Vec::new(),
            cpu_millicores: 8000,
            slot_millicores: 1000,
            max_processes: 64,
            memory_bytes: 0,
            nodes: Vec::new(),
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
            shape: Some(
                Shape::new(
                    vocab::JobKind::Ps,
                    Role::WORKER,
                    RoleShape::sized(Topology::Ps, workers, (1, 8), 1000),
                    2000,
                )
                .with(Role::PS, RoleShape::sized(Topology::Ps, ps, (0, 0), 1000)),
            ),
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
            peak_ps_millicores: 0,
            cancel_requested: None,
        }
    }

    #[test]
    fn without_history_a_job_gets_the_defaults_and_what_the_cluster_holds() {
        let p = predict(
            &spec("  ps: {}\n  worker: {}\n"),
            &[],
            &BTreeMap::new(),
            &cluster(),
            &NodeCpus::default(),
            None,
            0.0,
        )
        .unwrap();
        assert_eq!((p.shape.ps(), p.shape.training_group().count), (1, 2));
        assert_eq!(p.shape.training_group().max, 8, "{:?}", p.reasons);
        assert_eq!(p.shape.training_group().millicores, 1000);
        assert_eq!(p.shape.training_group().memory_bytes, 512 << 20);
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
            &BTreeMap::new(),
            &cluster(),
            &NodeCpus::default(),
            None,
            0.0,
        )
        .unwrap();
        assert_eq!(
            (p.shape.ps(), p.shape.training_group().count),
            (2, 4),
            "{:?}",
            p.reasons
        );
        // Per process: 600/6 = 100, 800/8 = 100, 1200/5 = 240 MiB; median 100 MiB + 25 %.
        assert_eq!(
            p.shape.training_group().memory_bytes >> 20,
            125,
            "{:?}",
            p.reasons
        );
        assert!(
            p.reasons
                .iter()
                .any(|r| r.contains("3 similar finished job(s): a, b, c"))
        );
    }

    /// Jobs submitted at 2 workers that the brain grew to 6 teach the next one 6, not the 2
    /// they were first given (issue 44: sizing echoed its own earlier predictions).
    #[test]
    fn history_gives_the_counts_jobs_ended_at_not_those_they_were_submitted_with() {
        let grown = |name: &str, reported: u32| {
            let mut row = past(name, 2, 1, 600, JobState::Succeeded);
            row.workers = 6;
            row.peak_workers = 6;
            row.reported_workers = reported;
            row
        };
        // One ended its last report at 6; one whose last report said nothing uses its plan's.
        let history = [grown("a", 6), grown("b", 0), grown("c", 6)];
        let p = predict(
            &spec("  ps: {}\n  worker: { min: 1, max: 8 }\n"),
            &history,
            &BTreeMap::new(),
            &cluster(),
            &NodeCpus::default(),
            None,
            0.0,
        )
        .unwrap();
        assert_eq!(p.shape.training_group().count, 6, "{:?}", p.reasons);
    }

    #[test]
    fn the_ps_speeds_of_similar_finished_jobs_choose_the_ps_count() {
        // 1 ms of compute and 2 ms of PS traffic per worker per PS, per sample: PS-bound.
        let speed = |w: u32, p: u32| w as f64 / (1e-3 + 2e-3 * w as f64 / p as f64);
        let mut history = [
            past("a", 4, 1, 100, JobState::Succeeded),
            past("b", 4, 1, 100, JobState::Succeeded),
            past("failed", 4, 1, 100, JobState::Failed),
        ];
        for (i, row) in history.iter_mut().enumerate() {
            row.id = JobId(i as u64 + 1);
        }
        let speeds = |pairs: &[(u32, u32)]| {
            pairs
                .iter()
                .map(|&(w, p)| (w, p, speed(w, p)))
                .collect::<Vec<_>>()
        };
        let mut ps_speeds = BTreeMap::new();
        ps_speeds.insert(JobId(1), speeds(&[(2, 1), (4, 1)]));
        ps_speeds.insert(JobId(2), speeds(&[(4, 2)]));
        // A failed job's speeds are not used: they would say more PS never pay.
        ps_speeds.insert(JobId(3), vec![(4, 3, 1.0), (4, 4, 1.0)]);
        let s = spec("  ps: { max: 4 }\n  worker: { replicas: 4 }\n");
        let p = predict(
            &s,
            &history,
            &ps_speeds,
            &cluster(),
            &NodeCpus::default(),
            None,
            0.0,
        )
        .unwrap();
        // At 4 workers: 444 samples/s with 1 PS, 800 with 2, 1,091 with 3, 1,333 with 4.
        assert_eq!(p.shape.ps(), 4, "{:?}", p.reasons);
        assert!(
            p.reasons.iter().any(|r| r
                .contains("ps replicas: 4 (Optimus' PS model from 3 (workers, ps) pairs of a, b")),
            "{:?}",
            p.reasons
        );
        // Without the speeds, the median of the counts the jobs ended at.
        let p = predict(
            &s,
            &history,
            &BTreeMap::new(),
            &cluster(),
            &NodeCpus::default(),
            None,
            0.0,
        )
        .unwrap();
        assert_eq!(p.shape.ps(), 1, "{:?}", p.reasons);
    }

    #[test]
    fn what_the_user_gave_is_kept() {
        let p = predict(
            &spec("  ps: { replicas: 3 }\n  worker: { replicas: 5, max: 8, resources: { cpu: 2, memory: 1Gi } }\n"),
            &[past("a", 2, 1, 100, JobState::Succeeded)],
            &BTreeMap::new(), &cluster(), &NodeCpus::default(), None, 0.0)
        .unwrap();
        assert_eq!((p.shape.ps(), p.shape.training_group().count), (3, 5));
        assert_eq!(p.shape.training_group().millicores, 2000);
        assert_eq!(p.shape.training_group().memory_bytes, 1 << 30);
    }
}
