//! What a simulation run produces: per-job and per-round records and their summary.

use serde::{Deserialize, Serialize};

/// One job's life in a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub name: String,
    pub application: String,
    pub submit_s: f64,
    /// When it first got GPUs.
    pub start_s: Option<f64>,
    pub finish_s: Option<f64>,
    /// Restarts on a new allocation after the first start (rescales, preemptions, failures).
    pub restarts: u32,
    pub gpu_seconds: f64,
    /// Of `gpu_seconds`, those held while it started or restarted and made no progress (the
    /// restart penalty after each start, rescale, move or preemption).
    #[serde(default)]
    pub restart_gpu_seconds: f64,
    pub requested_replicas: u32,
    /// The most GPUs it held at once.
    pub peak_replicas: u32,
    /// Finish-time fairness (Themis' ρ): its JCT over the time it would take on a fair share
    /// of the cluster, i.e. alone at its request on the type that suits it best, times the
    /// mean number of jobs in the system while it was (`ρ > 1`: worse off than its fair
    /// share). `None` for a job that did not finish.
    #[serde(default)]
    pub rho: Option<f64>,
    /// Why a job has no finish time; `None` for a finished job.
    #[serde(default)]
    pub unfinished: Option<Unfinished>,
}

/// Why a replay ended with a job unfinished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unfinished {
    /// The replay reached `max_time_s` (`--max-time-s`) first.
    Cut,
    /// The replay stopped with the job waiting on an idle cluster (nothing left to arrive, no
    /// node down, the scheduler running nothing) and it had never had GPUs.
    NeverPlaced,
    /// As [`Unfinished::NeverPlaced`], but the job had run before and was not placed again.
    Stranded,
}

impl Unfinished {
    /// How the table and the exported tables say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Unfinished::Cut => "cut by max time",
            Unfinished::NeverPlaced => "never placed",
            Unfinished::Stranded => "not placed again",
        }
    }
}

impl JobRecord {
    pub fn jct_s(&self) -> Option<f64> {
        self.finish_s.map(|f| f - self.submit_s)
    }

    pub fn queueing_s(&self) -> Option<f64> {
        self.start_s.map(|s| s - self.submit_s)
    }
}

/// The cluster at one scheduling round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    pub time_s: f64,
    /// Jobs submitted and not finished.
    pub active_jobs: u32,
    /// Active jobs without GPUs.
    pub queued_jobs: u32,
    pub gpus_used: u32,
    /// GPUs of nodes that are up.
    pub gpus_up: u32,
    /// Jobs whose allocation changed this round (started, resized, moved or preempted).
    pub changed_jobs: u32,
    /// Wall-clock microseconds the scheduler took (0 where the caller does not measure).
    pub decide_us: u64,
}

/// The numbers an operator compares policies by. JCT, queueing and ρ are over the finished
/// jobs only; the others are counted in `unfinished`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub jobs: u32,
    pub finished: u32,
    pub mean_jct_s: f64,
    pub median_jct_s: f64,
    pub p99_jct_s: f64,
    /// From the first submission to the last completion.
    pub makespan_s: f64,
    /// GPU-seconds held / GPU-seconds up, over the makespan.
    pub gpu_utilisation: f64,
    pub mean_queueing_s: f64,
    pub restarts: u32,
    /// Share of the GPU-seconds held that jobs spent starting or restarting.
    #[serde(default)]
    pub restart_gpu_share: f64,
    /// Share of the finished jobs with finish-time fairness ρ > 1 (Themis).
    #[serde(default)]
    pub unfair_share: f64,
    /// The largest ρ of a finished job.
    #[serde(default)]
    pub max_rho: f64,
    /// Jobs without a finish time, by why.
    #[serde(default)]
    pub unfinished: std::collections::BTreeMap<Unfinished, u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub policy: String,
    pub jobs: Vec<JobRecord>,
    pub rounds: Vec<RoundRecord>,
    pub summary: Summary,
    /// GPU-seconds the nodes were up over the makespan.
    pub gpu_seconds_up: f64,
}

/// The `q`-quantile of sorted values, linear between ranks (numpy's default).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

impl Summary {
    pub fn of(jobs: &[JobRecord], gpu_seconds_up: f64) -> Summary {
        let mut jcts: Vec<f64> = jobs.iter().filter_map(JobRecord::jct_s).collect();
        jcts.sort_by(f64::total_cmp);
        // Queueing, as JCT, of the finished jobs only: an unfinished job's wait is cut short.
        let queueing: Vec<f64> = jobs
            .iter()
            .filter(|j| j.finish_s.is_some())
            .filter_map(JobRecord::queueing_s)
            .collect();
        let mut unfinished = std::collections::BTreeMap::new();
        for j in jobs {
            if let Some(why) = j.unfinished {
                *unfinished.entry(why).or_insert(0) += 1;
            }
        }
        let mean = |v: &[f64]| {
            if v.is_empty() {
                f64::NAN
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        let first = jobs
            .iter()
            .map(|j| j.submit_s)
            .fold(f64::INFINITY, f64::min);
        let last = jobs
            .iter()
            .filter_map(|j| j.finish_s)
            .fold(f64::NEG_INFINITY, f64::max);
        let held: f64 = jobs.iter().map(|j| j.gpu_seconds).sum();
        let rhos: Vec<f64> = jobs.iter().filter_map(|j| j.rho).collect();
        Summary {
            jobs: jobs.len() as u32,
            finished: jcts.len() as u32,
            mean_jct_s: mean(&jcts),
            median_jct_s: quantile(&jcts, 0.5),
            p99_jct_s: quantile(&jcts, 0.99),
            makespan_s: if last > first { last - first } else { 0.0 },
            gpu_utilisation: if gpu_seconds_up > 0.0 {
                held / gpu_seconds_up
            } else {
                0.0
            },
            mean_queueing_s: mean(&queueing),
            restarts: jobs.iter().map(|j| j.restarts).sum(),
            restart_gpu_share: if held > 0.0 {
                jobs.iter().map(|j| j.restart_gpu_seconds).sum::<f64>() / held
            } else {
                0.0
            },
            unfair_share: if rhos.is_empty() {
                f64::NAN
            } else {
                // ρ of exactly 1 (a job alone) must not count for rounding.
                rhos.iter().filter(|&&r| r > 1.0 + 1e-9).count() as f64 / rhos.len() as f64
            },
            max_rho: rhos.iter().copied().fold(f64::NAN, f64::max),
            unfinished,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.5);
        assert_eq!(quantile(&v, 1.0), 4.0);
        assert!((quantile(&v, 0.99) - 3.97).abs() < 1e-12);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
