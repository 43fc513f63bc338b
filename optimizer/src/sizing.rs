//! Initial sizing of a submitted job that names no replicas or resources (pure): what the spec
//! leaves out is filled from finished jobs like it, and every choice says why.
//!
//! The caller (the live brain) picks the history: [`PastJob`]s are finished, successful jobs
//! with the counts they ended at. "Like it" means the same kind and the same workload (built-in
//! settings or command). From those the job takes:
//! * worker and PS counts: their medians; once they reported speeds at two PS counts or more,
//!   the PS count from their pooled speed model ([`PsSpeedModel`], Optimus') at the job's
//!   worker count instead;
//! * memory: their peak per process + 25 %;
//! * a PS's CPU: the median peak of their parameter servers + 25 %, in whole scheduling slots.
//!
//! A stored job-profile model, when the caller passes its answer ([`LearnedDemand`]), sizes the
//! workers' CPU (in whole slots) and memory instead. Without history a job starts at its
//! minimum (at least 2 workers where its bounds allow), with one slot of CPU per process and
//! 512 MiB. A bound the user left out becomes what the cluster can hold. What the user gave is
//! kept as given.

use vocab::spec::RoleSpec;
use vocab::{Bytes, JobSpec, Millicores, Resources, Role};

use crate::error::PolicyError;
use crate::live::LiveCluster;
use crate::throughput::ps_speed::{PsSpeedModel, PsSpeedPoint};

const DEFAULT_MEMORY: u64 = 512 << 20;
const MEMORY_MARGIN: f64 = 1.25;
const CPU_MARGIN: f64 = 1.25;

/// A finished, successful job the brain knows, with the counts it ended at.
#[derive(Clone, Debug)]
pub struct PastJob {
    pub name: String,
    pub spec: JobSpec,
    pub workers: u32,
    pub ps: u32,
    /// The job's peak memory over all its processes.
    pub peak_memory_bytes: u64,
    /// Speeds it reported per (workers, PS) pair (a PS job's; empty otherwise).
    pub ps_speed: Vec<PsSpeedPoint>,
    /// The most CPU one of its parameter servers used (0: not reported).
    pub peak_ps_millicores: u64,
}

/// What a trained job-profile model says a worker of this job needs (its margin included).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LearnedDemand {
    pub worker_millicores: f64,
    pub worker_mib: f64,
    /// Jobs the model was fitted on, and the share of jobs its margin covers (for the reason).
    pub trained_on: usize,
    pub quantile: f64,
}

/// The spec with every count and resource filled in, and why.
#[derive(Clone, Debug)]
pub struct Sized {
    pub spec: JobSpec,
    pub reasons: Vec<String>,
}

fn median(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// Fills `spec` in from `history` (finished, successful jobs) on `cluster`.
pub fn size(
    spec: &JobSpec,
    history: &[PastJob],
    cluster: &LiveCluster,
    learned: Option<LearnedDemand>,
) -> Result<Sized, PolicyError> {
    let mut spec = spec.clone();
    let mut reasons = Vec::new();
    let workload = serde_json::to_string(&spec.workload).expect("plain struct");
    let similar: Vec<&PastJob> = history
        .iter()
        .filter(|p| {
            p.spec.kind == spec.kind
                && serde_json::to_string(&p.spec.workload).is_ok_and(|w| w == workload)
        })
        .collect();
    if similar.is_empty() {
        reasons.push(format!(
            "no finished {} job with this workload in the history: defaults",
            spec.kind
        ));
    } else {
        let names: Vec<&str> = similar.iter().map(|p| p.name.as_str()).collect();
        reasons.push(format!(
            "{} similar finished job(s): {}",
            similar.len(),
            names.join(", ")
        ));
    }
    let slot = cluster.slot_millicores;
    if slot == 0 {
        return Err(PolicyError::InvalidProblem(
            "the cluster's scheduling slot is 0 millicores".into(),
        ));
    }

    // Workers (the training group, whatever its name) first: a PS count from similar jobs'
    // speed model is chosen for them.
    let trainer = spec.training_role();
    for role in [trainer, Role::PS] {
        let Some(r) = spec.roles.get(&role).cloned() else {
            continue;
        };
        let mut r: RoleSpec = r;
        let resources = r.resources.clone().unwrap_or_default();
        let cpu = match (resources.cpu, learned) {
            (Some(c), _) => c,
            (None, Some(l))
                if role == trainer
                    && l.worker_millicores.is_finite()
                    && l.worker_millicores > 0.0 =>
            {
                // Whole slots, as the scheduler hands them out; never more than the cluster.
                let most = (cluster.cpu_millicores / slot).max(1);
                let slots = ((l.worker_millicores / slot as f64).ceil() as u64).clamp(1, most);
                let capped = if l.worker_millicores > (most * slot) as f64 {
                    ", capped at the cluster's CPU"
                } else {
                    ""
                };
                reasons.push(format!(
                    "worker cpu: {}m ({slots} slot(s) of {slot}m) from the job-profile model \
                     ({:.0}m predicted; {} jobs, margin for {:.0} % of jobs){capped}",
                    slots * slot,
                    l.worker_millicores,
                    l.trained_on,
                    l.quantile * 100.0
                ));
                Millicores(slots * slot)
            }
            (None, _) => {
                let peaks: Vec<u64> = similar
                    .iter()
                    .map(|p| p.peak_ps_millicores)
                    .filter(|&m| m > 0)
                    .collect();
                match median(peaks).filter(|_| role == Role::PS) {
                    Some(peak) => {
                        // Whole slots, as the scheduler hands them out; never more than the
                        // cluster.
                        let want = peak as f64 * CPU_MARGIN;
                        let most = (cluster.cpu_millicores / slot).max(1);
                        let slots = ((want / slot as f64).ceil() as u64).clamp(1, most);
                        reasons.push(format!(
                            "ps cpu: {}m ({slots} slot(s) of {slot}m), the median peak of similar \
                             jobs' parameter servers ({peak}m) + 25 %{}",
                            slots * slot,
                            if want > (most * slot) as f64 {
                                ", capped at the cluster's CPU"
                            } else {
                                ""
                            }
                        ));
                        Millicores(slots * slot)
                    }
                    None => {
                        reasons.push(format!("{role} cpu: {slot}m, one scheduling slot"));
                        Millicores(slot)
                    }
                }
            }
        };
        let memory = match (resources.memory, learned) {
            (Some(m), _) => m,
            (None, Some(l)) if role == trainer => {
                let mib = l.worker_mib.max(64.0) as u64;
                reasons.push(format!(
                    "worker memory: {mib} MiB from the job-profile model ({} jobs, margin for \
                     {:.0} % of jobs)",
                    l.trained_on,
                    l.quantile * 100.0
                ));
                Bytes(mib << 20)
            }
            (None, _) => {
                let peaks: Vec<u64> = similar
                    .iter()
                    .filter(|p| p.peak_memory_bytes > 0 && p.workers + p.ps > 0)
                    .map(|p| p.peak_memory_bytes / (p.workers + p.ps) as u64)
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
            gpu_type: resources.gpu_type.clone(),
            custom: resources.custom.clone(),
        });
        let unit = r.node_unit.unwrap_or(1).max(1);
        let per = cpu.0.div_ceil(slot).max(1);
        let fits = (cluster.cpu_millicores / slot / per) as i64;
        let fits = fits.min(cluster.max_processes as i64) / unit * unit;
        if r.max.is_none() && r.replicas.is_none() {
            let max = fits.max(unit);
            r.max = Some(max);
            reasons.push(format!("{role} max: {max}, what the cluster holds"));
        }
        if r.replicas.is_none() {
            let min = r.min.unwrap_or(unit);
            let max = r.max.unwrap_or(min);
            let past: Vec<u64> = similar
                .iter()
                .filter_map(|p| {
                    // Past jobs record their ps and workers only.
                    if role == Role::PS {
                        Some(p.ps as u64)
                    } else {
                        (role == trainer).then_some(p.workers as u64)
                    }
                })
                .collect();
            let modelled = (role == Role::PS)
                .then(|| ps_from_model(&spec, &similar, min, max))
                .flatten();
            let (n, why) = match (modelled, median(past)) {
                (Some((n, why)), _) => (n, why),
                (None, Some(n)) => (n as i64, "the median of similar jobs".to_string()),
                (None, None) if role == trainer => (2, "default".to_string()),
                (None, None) => (1, "default".to_string()),
            };
            let n = (n / unit * unit).clamp(min, max);
            reasons.push(format!(
                "{role} replicas: {n} ({why}, within [{min}, {max}])"
            ));
            r.replicas = Some(n);
        }
        spec.roles.insert(role, r);
    }
    spec.validate()
        .map_err(|e| PolicyError::InvalidProblem(e.to_string()))?;
    Ok(Sized { spec, reasons })
}

/// The PS count Optimus' PS model of the similar jobs' speeds ([`PsSpeedModel`], their
/// (workers, PS) pairs pooled: the same workload) gives the job at its worker count: the
/// fewest PS within 5 % of the best predicted speed in `[min, max]`, as the live round
/// chooses. `None` while those jobs span fewer than two PS counts (three pairs).
fn ps_from_model(
    spec: &JobSpec,
    similar: &[&PastJob],
    min: i64,
    max: i64,
) -> Option<(i64, String)> {
    let workers = spec.roles.get(&spec.training_role())?.replicas? as u32;
    let points: Vec<PsSpeedPoint> = similar.iter().flat_map(|p| p.ps_speed.clone()).collect();
    let model = PsSpeedModel::fit(&points).ok()?;
    let (lo, hi) = (min.max(1) as u32, max.max(1) as u32);
    let best = model.best_ps(workers, lo, hi, 0.05);
    let from: Vec<&str> = similar
        .iter()
        .filter(|p| !p.ps_speed.is_empty())
        .map(|p| p.name.as_str())
        .collect();
    let predicted: Vec<String> = (lo..=hi.min(lo + 7))
        .map(|p| format!("{p} ps {:.0}", model.samples_per_s(workers, p)))
        .collect();
    Some((
        best as i64,
        format!(
            "Optimus' PS model from {} (workers, ps) pairs of {} predicts samples/s at {workers} \
             workers: {}; the fewest within 5 % of the best",
            model.pairs,
            from.join(", "),
            predicted.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(roles: &str) -> JobSpec {
        JobSpec::from_yaml(&format!(
            "name: t\nkind: ps\nroles:\n{roles}workload:\n  builtin: {{ batch_size: 64 }}\n\
             data: {{ num_samples: 1000, shard_size: 100 }}\nepochs: 2\n\
             checkpoint: {{ dir: /tmp/brain-sizing-test }}\n"
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

    fn past(name: &str, workers: u32, ps: u32, peak_mib: u64) -> PastJob {
        PastJob {
            name: name.into(),
            spec: spec("  ps: {}\n  worker: { min: 1, max: 8 }\n"),
            workers,
            ps,
            peak_memory_bytes: peak_mib << 20,
            ps_speed: Vec::new(),
            peak_ps_millicores: 0,
        }
    }

    fn count(s: &Sized, role: Role) -> i64 {
        s.spec.roles[&role].replicas.unwrap()
    }

    #[test]
    fn a_learned_memory_sizes_workers_and_other_workloads_are_not_similar() {
        let mut other = past("other", 7, 3, 7000);
        other.spec.workload.builtin.as_mut().unwrap().batch_size = 128;
        let learned = LearnedDemand {
            worker_millicores: 1_700.0,
            worker_mib: 300.4,
            trained_on: 40,
            quantile: 0.95,
        };
        let s = size(
            &spec("  ps: {}\n  worker: {}\n"),
            &[other, past("a", 3, 2, 500)],
            &cluster(),
            Some(learned),
        )
        .unwrap();
        assert_eq!((count(&s, Role::PS), count(&s, Role::WORKER)), (2, 3));
        let memory = |role| s.spec.roles[&role].resources.as_ref().unwrap().memory;
        assert_eq!(memory(Role::WORKER), Some(Bytes(300 << 20)));
        // CPU in whole slots: 1,700m predicted is two slots of 1,000m; the PS keeps one.
        let cpu = |role| s.spec.roles[&role].resources.as_ref().unwrap().cpu;
        assert_eq!(cpu(Role::WORKER), Some(Millicores(2_000)));
        assert_eq!(cpu(Role::PS), Some(Millicores(1_000)));
        let why = "worker cpu: 2000m (2 slot(s) of 1000m) from the job-profile model (1700m \
                   predicted; 40 jobs, margin for 95 % of jobs)";
        assert!(s.reasons.iter().any(|r| r == why), "{:?}", s.reasons);
        // More than the cluster has is capped at it, and said so.
        let huge = LearnedDemand {
            worker_millicores: 50_000.0,
            ..learned
        };
        let capped = size(
            &spec("  ps: {}\n  worker: {}\n"),
            &[],
            &cluster(),
            Some(huge),
        )
        .unwrap();
        let res = capped.spec.roles[&Role::WORKER].resources.as_ref().unwrap();
        assert_eq!(res.cpu, Some(Millicores(8_000)));
        assert!(
            capped
                .reasons
                .iter()
                .any(|r| r.ends_with("capped at the cluster's CPU")),
            "{:?}",
            capped.reasons
        );
        // The PS is sized from history: 500 MiB over 5 processes, + 25 %.
        assert_eq!(memory(Role::PS), Some(Bytes(125 << 20)));
        assert!(
            s.reasons
                .iter()
                .any(|r| r.contains("1 similar finished job(s): a"))
        );
        assert!(
            s.reasons
                .iter()
                .any(|r| r.contains("job-profile model (40 jobs"))
        );
    }

    #[test]
    fn counts_respect_the_bounds_and_the_node_unit() {
        let s = size(
            &spec("  ps: {}\n  worker: { min: 2, max: 6, node_unit: 2 }\n"),
            &[past("a", 7, 1, 0), past("b", 7, 1, 0), past("c", 3, 1, 0)],
            &cluster(),
            None,
        )
        .unwrap();
        // The median 7 rounded down to the node unit.
        assert_eq!(count(&s, Role::WORKER), 6, "{:?}", s.reasons);
        let e = size(
            &spec("  ps: {}\n  worker: {}\n"),
            &[],
            &LiveCluster {
                slot_millicores: 0,
                ..cluster()
            },
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("slot is 0"), "{e}");
    }

    #[test]
    fn a_ps_gets_the_median_peak_cpu_of_similar_jobs_ps_in_whole_slots() {
        let with = |name, peak| PastJob {
            peak_ps_millicores: peak,
            ..past(name, 2, 1, 0)
        };
        let cpu = |s: &Sized, role| s.spec.roles[&role].resources.as_ref().unwrap().cpu;
        // Peaks 900, 1,300 and 2,500m (and one job that never reported its PS): median 1,300m
        // + 25 % = 1,625m, two slots of 1,000m.
        let history = [
            with("a", 900),
            with("b", 1300),
            with("c", 2500),
            with("d", 0),
        ];
        let s = size(
            &spec("  ps: {}\n  worker: {}\n"),
            &history,
            &cluster(),
            None,
        )
        .unwrap();
        assert_eq!(cpu(&s, Role::PS), Some(Millicores(2000)), "{:?}", s.reasons);
        assert_eq!(cpu(&s, Role::WORKER), Some(Millicores(1000)));
        assert!(
            s.reasons.iter().any(|r| r.contains(
                "ps cpu: 2000m (2 slot(s) of 1000m), the median peak of similar jobs' parameter \
                 servers (1300m) + 25 %"
            )),
            "{:?}",
            s.reasons
        );
        // Never more than the cluster holds, and said so.
        let s = size(
            &spec("  ps: {}\n  worker: {}\n"),
            &[with("a", 50_000)],
            &cluster(),
            None,
        )
        .unwrap();
        assert_eq!(cpu(&s, Role::PS), Some(Millicores(8000)));
        assert!(
            s.reasons
                .iter()
                .any(|r| r.contains("capped at the cluster's CPU"))
        );
        // What the user gave is kept.
        let given = spec("  ps: { resources: { cpu: 500m } }\n  worker: {}\n");
        let s = size(&given, &history, &cluster(), None).unwrap();
        assert_eq!(cpu(&s, Role::PS), Some(Millicores(500)));
    }

    #[test]
    fn similar_jobs_speeds_at_two_ps_counts_choose_the_ps_count() {
        // Seconds per sample per worker: 1 ms of compute, 1 ms of traffic per worker per PS
        // (PS-bound as workers grow).
        let truth = |w: u32, p: u32| w as f64 / (1e-3 + 1e-3 * w as f64 / p as f64);
        let with = |name, pairs: &[(u32, u32)]| {
            let mut j = past(name, 4, 1, 0);
            j.ps_speed = pairs
                .iter()
                .map(|&(workers, ps)| PsSpeedPoint {
                    workers,
                    ps,
                    samples_per_s: truth(workers, ps),
                })
                .collect();
            j
        };
        // Every past job ended at 1 PS (the median says 1), but two of them ran at 2 PS too.
        let history = [
            with("a", &[(2, 1), (4, 1), (4, 2)]),
            with("b", &[(4, 1), (4, 2)]),
            past("c", 4, 1, 0),
        ];
        let spec4 = spec(
            "  ps: { max: 8 }
  worker: { replicas: 8 }
",
        );
        let s = size(&spec4, &history, &cluster(), None).unwrap();
        let ps = count(&s, Role::PS);
        // At 8 workers: more PS keep paying until the 5 % tolerance.
        let best = (1..=8).map(|p| truth(8, p)).fold(0.0, f64::max);
        let want = (1..=8).find(|&p| truth(8, p) >= 0.95 * best).unwrap();
        assert_eq!(ps, want as i64, "{:?}", s.reasons);
        assert!(ps > 1);
        assert!(
            s.reasons
                .iter()
                .any(|r| r.contains("Optimus' PS model from 3 (workers, ps) pairs of a, b")),
            "{:?}",
            s.reasons
        );
        // One PS count only: no model, the median.
        let s = size(&spec4, &[with("a", &[(2, 1), (4, 1)])], &cluster(), None).unwrap();
        assert_eq!(count(&s, Role::PS), 1);
        assert!(
            s.reasons
                .iter()
                .any(|r| r.contains("the median of similar jobs"))
        );
        // The user's count is kept.
        let given = spec(
            "  ps: { replicas: 1 }
  worker: { replicas: 8 }
",
        );
        let s = size(&given, &history, &cluster(), None).unwrap();
        assert_eq!(count(&s, Role::PS), 1);
    }
}
