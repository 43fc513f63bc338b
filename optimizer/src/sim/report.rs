//! What a simulation run produces: per-job and per-round records and their summary.

use serde::{Deserialize, Serialize};

use super::account::JctAccount;

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
    /// Seconds of training at full speed that its progress equals: the time it made progress,
    /// each second weighed by its slowest node's speed (restarts, stalls and waits excluded).
    #[serde(default)]
    pub training_s: f64,
    /// Of `gpu_seconds`, those held while a fault that stopped it went unnoticed.
    #[serde(default)]
    pub stalled_gpu_seconds: f64,
    /// Faults that struck it: failures of its nodes, and moves off a node found slow.
    #[serde(default)]
    pub faults: u32,
    /// Seconds of training that failures threw away (the training since its last save; with
    /// a checkpoint model only).
    #[serde(default)]
    pub lost_training_s: f64,
    /// Of `gpu_seconds`, those held while it saved checkpoints.
    #[serde(default)]
    pub saving_gpu_seconds: f64,
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
    /// Its JCT in parts that add up to it (a finished job's; partial otherwise).
    #[serde(default)]
    pub account: JctAccount,
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

    /// Its effective training time: the share of its time from its first start to its finish
    /// spent training at full speed (`training_s`); `None` for a job that did not finish.
    pub fn effective_training(&self) -> Option<f64> {
        let span = self.finish_s? - self.start_s?;
        (span > 0.0).then(|| self.training_s / span)
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
    /// Effective training time of the finished jobs: their training seconds over their time
    /// from first start to finish, summed.
    #[serde(default)]
    pub effective_training: f64,
    /// Share of the GPU-seconds held that jobs spent stalled by a fault not yet noticed.
    #[serde(default)]
    pub stalled_gpu_share: f64,
    /// Faults that struck jobs.
    #[serde(default)]
    pub faults: u32,
    /// Seconds of training that failures threw away, over every job, and per fault.
    #[serde(default)]
    pub lost_training_s: f64,
    #[serde(default)]
    pub lost_per_fault_s: f64,
    /// Share of the GPU-seconds held that jobs spent saving checkpoints.
    #[serde(default)]
    pub saving_gpu_share: f64,
    /// Share of the finished jobs with finish-time fairness ρ > 1 (Themis).
    #[serde(default)]
    pub unfair_share: f64,
    /// The largest ρ of a finished job.
    #[serde(default)]
    pub max_rho: f64,
    /// Jobs without a finish time, by why.
    #[serde(default)]
    pub unfinished: std::collections::BTreeMap<Unfinished, u32>,
    /// The finished jobs' JCT in parts, the mean of each ([`JctAccount`]): their parts add up
    /// to the mean JCT.
    #[serde(default)]
    pub mean_account: JctAccount,
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
    /// The summary of `jobs`, exact: JCT quantiles from the sorted JCTs.
    pub fn of(jobs: &[JobRecord], gpu_seconds_up: f64) -> Summary {
        let mut builder = SummaryBuilder::default();
        for j in jobs {
            builder.add(j);
        }
        let mut summary = builder.summary(gpu_seconds_up);
        let mut jcts: Vec<f64> = jobs.iter().filter_map(JobRecord::jct_s).collect();
        jcts.sort_by(f64::total_cmp);
        summary.mean_jct_s = if jcts.is_empty() {
            f64::NAN
        } else {
            jcts.iter().sum::<f64>() / jcts.len() as f64
        };
        summary.median_jct_s = quantile(&jcts, 0.5);
        summary.p99_jct_s = quantile(&jcts, 0.99);
        summary
    }
}

/// Relative accuracy of the JCT quantiles of a [`SummaryBuilder`].
pub const SKETCH_ACCURACY: f64 = 0.001;

/// A summary built one job at a time in memory that does not grow with the jobs: sums, counts
/// and extremes, and the JCTs in a DDSketch (Masson et al., VLDB 2019), from which the median
/// and p99 come within [`SKETCH_ACCURACY`] of the exact ones (relative), interpolated between
/// ranks as [`quantile`] does. Builders of separate replays merge.
#[derive(Clone)]
pub struct SummaryBuilder {
    jobs: u32,
    finished: u32,
    jct_sum: f64,
    jcts: sketches_ddsketch::DDSketch,
    queueing_sum: f64,
    queued: u32,
    first_submit_s: f64,
    last_finish_s: f64,
    held: f64,
    restart_held: f64,
    stalled_held: f64,
    saving_held: f64,
    restarts: u32,
    faults: u32,
    lost_training_s: f64,
    /// Of the finished jobs: training seconds, and seconds from first start to finish.
    training_s: f64,
    span_s: f64,
    rhos: u32,
    unfair: u32,
    max_rho: f64,
    unfinished: std::collections::BTreeMap<Unfinished, u32>,
    /// The finished jobs' accounts, summed.
    account: JctAccount,
}

impl Default for SummaryBuilder {
    fn default() -> Self {
        // Bins of 0.2 % from 1 ms; 2^15 of them reach far past any JCT (e^65 × 1 ms).
        let config = sketches_ddsketch::Config::new(SKETCH_ACCURACY, 1 << 15, 1e-3);
        SummaryBuilder {
            jobs: 0,
            finished: 0,
            jct_sum: 0.0,
            jcts: sketches_ddsketch::DDSketch::new(config),
            queueing_sum: 0.0,
            queued: 0,
            first_submit_s: f64::INFINITY,
            last_finish_s: f64::NEG_INFINITY,
            held: 0.0,
            restart_held: 0.0,
            stalled_held: 0.0,
            saving_held: 0.0,
            restarts: 0,
            faults: 0,
            lost_training_s: 0.0,
            training_s: 0.0,
            span_s: 0.0,
            rhos: 0,
            unfair: 0,
            max_rho: f64::NAN,
            unfinished: Default::default(),
            account: JctAccount::default(),
        }
    }
}

impl std::fmt::Debug for SummaryBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SummaryBuilder")
            .field("jobs", &self.jobs)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl SummaryBuilder {
    pub fn add(&mut self, j: &JobRecord) {
        self.jobs += 1;
        self.first_submit_s = self.first_submit_s.min(j.submit_s);
        self.held += j.gpu_seconds;
        self.restart_held += j.restart_gpu_seconds;
        self.stalled_held += j.stalled_gpu_seconds;
        self.saving_held += j.saving_gpu_seconds;
        self.restarts += j.restarts;
        self.faults += j.faults;
        self.lost_training_s += j.lost_training_s;
        if let Some(why) = j.unfinished {
            *self.unfinished.entry(why).or_insert(0) += 1;
        }
        let Some(jct) = j.jct_s() else { return };
        // Queueing, as JCT, of the finished jobs only: an unfinished job's wait is cut short.
        self.finished += 1;
        self.jct_sum += jct;
        self.account.add(&j.account);
        self.jcts.add(jct);
        self.last_finish_s = self.last_finish_s.max(j.finish_s.expect("has a JCT"));
        if let Some(q) = j.queueing_s() {
            self.queueing_sum += q;
            self.queued += 1;
        }
        if let Some(start) = j.start_s {
            self.training_s += j.training_s;
            self.span_s += j.finish_s.expect("has a JCT") - start;
        }
        if let Some(r) = j.rho {
            self.rhos += 1;
            // ρ of exactly 1 (a job alone) must not count for rounding.
            if r > 1.0 + 1e-9 {
                self.unfair += 1;
            }
            self.max_rho = self.max_rho.max(r);
        }
    }

    /// Adds the jobs of another replay.
    pub fn merge(&mut self, o: &SummaryBuilder) {
        self.jobs += o.jobs;
        self.finished += o.finished;
        self.jct_sum += o.jct_sum;
        self.jcts
            .merge(&o.jcts)
            .expect("builders share one sketch configuration");
        self.queueing_sum += o.queueing_sum;
        self.queued += o.queued;
        self.first_submit_s = self.first_submit_s.min(o.first_submit_s);
        self.last_finish_s = self.last_finish_s.max(o.last_finish_s);
        self.held += o.held;
        self.restart_held += o.restart_held;
        self.stalled_held += o.stalled_held;
        self.saving_held += o.saving_held;
        self.restarts += o.restarts;
        self.faults += o.faults;
        self.lost_training_s += o.lost_training_s;
        self.training_s += o.training_s;
        self.span_s += o.span_s;
        self.rhos += o.rhos;
        self.unfair += o.unfair;
        self.max_rho = self.max_rho.max(o.max_rho);
        self.account.add(&o.account);
        for (why, n) in &o.unfinished {
            *self.unfinished.entry(*why).or_insert(0) += n;
        }
    }

    /// The `q`-quantile of the JCTs, within [`SKETCH_ACCURACY`]: between the two ranks around
    /// `q`, as [`quantile`].
    fn jct_quantile(&self, q: f64) -> f64 {
        let n = self.jcts.count();
        if n == 0 {
            return f64::NAN;
        }
        let at = |q: f64| {
            self.jcts
                .quantile(q.clamp(0.0, 1.0))
                .expect("a quantile in [0, 1]")
                .expect("not empty")
        };
        if n == 1 {
            return at(0.5);
        }
        let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
        let lo = pos.floor();
        let frac = pos - lo;
        // The sketch answers rank ⌊q (n - 1)⌋; ask between ranks, clear of rounding.
        let v_lo = at((lo + 0.5) / (n - 1) as f64);
        if frac == 0.0 {
            return v_lo;
        }
        let v_hi = at((lo + 1.5) / (n - 1) as f64);
        v_lo + (v_hi - v_lo) * frac
    }

    /// The summary, with `gpu_seconds_up` the GPU-seconds the nodes were up over the makespan.
    pub fn summary(&self, gpu_seconds_up: f64) -> Summary {
        let ratio = |a: f64, n: u32| if n == 0 { f64::NAN } else { a / n as f64 };
        let (first, last) = (self.first_submit_s, self.last_finish_s);
        Summary {
            jobs: self.jobs,
            finished: self.finished,
            mean_jct_s: ratio(self.jct_sum, self.finished),
            median_jct_s: self.jct_quantile(0.5),
            p99_jct_s: self.jct_quantile(0.99),
            makespan_s: if last > first { last - first } else { 0.0 },
            gpu_utilisation: if gpu_seconds_up > 0.0 {
                self.held / gpu_seconds_up
            } else {
                0.0
            },
            mean_queueing_s: ratio(self.queueing_sum, self.queued),
            restarts: self.restarts,
            restart_gpu_share: if self.held > 0.0 {
                self.restart_held / self.held
            } else {
                0.0
            },
            effective_training: if self.span_s > 0.0 {
                self.training_s / self.span_s
            } else {
                f64::NAN
            },
            stalled_gpu_share: if self.held > 0.0 {
                self.stalled_held / self.held
            } else {
                0.0
            },
            faults: self.faults,
            lost_training_s: self.lost_training_s,
            lost_per_fault_s: if self.faults > 0 {
                self.lost_training_s / self.faults as f64
            } else {
                0.0
            },
            saving_gpu_share: if self.held > 0.0 {
                self.saving_held / self.held
            } else {
                0.0
            },
            unfair_share: ratio(self.unfair as f64, self.rhos),
            max_rho: self.max_rho,
            unfinished: self.unfinished.clone(),
            mean_account: self.account.scaled(if self.finished == 0 {
                0.0
            } else {
                1.0 / self.finished as f64
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn records() -> impl Strategy<Value = Vec<JobRecord>> {
        // JCTs from a second to a year, some jobs unfinished, some never started.
        let job = (
            0.0..1e6f64,
            0.0..1e4f64,
            -0.5..7.5f64,
            prop::option::of(0.1..5.0f64),
            0u32..5,
        );
        prop::collection::vec(job, 1..400).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (submit, wait, log_run, rho, restarts))| {
                    let start = (i % 7 != 0).then_some(submit + wait);
                    let finish = start
                        .filter(|_| i % 5 != 0)
                        .map(|s| s + 10f64.powf(log_run));
                    JobRecord {
                        name: format!("j{i}"),
                        application: "a".into(),
                        submit_s: submit,
                        start_s: start,
                        finish_s: finish,
                        restarts,
                        gpu_seconds: wait,
                        restart_gpu_seconds: wait / 3.0,
                        training_s: 10f64.powf(log_run) / 2.0,
                        stalled_gpu_seconds: wait / 5.0,
                        faults: restarts / 2,
                        lost_training_s: wait / 7.0,
                        saving_gpu_seconds: wait / 11.0,
                        requested_replicas: 1,
                        peak_replicas: 1,
                        account: JctAccount {
                            queue_s: wait,
                            ..Default::default()
                        },
                        rho: finish.and(rho),
                        unfinished: finish.is_none().then_some(Unfinished::Cut),
                    }
                })
                .collect()
        })
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a.is_nan() && b.is_nan()) || (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-300)
    }

    proptest! {
        /// Built job by job, in two parts merged, a summary is the exact one; its quantiles
        /// within the sketch's accuracy.
        #[test]
        fn a_summary_built_job_by_job_matches_the_exact_one(jobs in records(), cut in 0usize..400) {
            let exact = Summary::of(&jobs, 1e9);
            let cut = cut.min(jobs.len());
            let (mut a, mut b) = (SummaryBuilder::default(), SummaryBuilder::default());
            jobs[..cut].iter().for_each(|j| a.add(j));
            jobs[cut..].iter().for_each(|j| b.add(j));
            a.merge(&b);
            let built = a.summary(1e9);
            prop_assert_eq!(
                (built.jobs, built.finished, built.restarts, built.faults, &built.unfinished),
                (exact.jobs, exact.finished, exact.restarts, exact.faults, &exact.unfinished)
            );
            for (x, y) in [
                (built.mean_jct_s, exact.mean_jct_s),
                (built.makespan_s, exact.makespan_s),
                (built.gpu_utilisation, exact.gpu_utilisation),
                (built.mean_queueing_s, exact.mean_queueing_s),
                (built.restart_gpu_share, exact.restart_gpu_share),
                (built.effective_training, exact.effective_training),
                (built.stalled_gpu_share, exact.stalled_gpu_share),
                (built.lost_training_s, exact.lost_training_s),
                (built.lost_per_fault_s, exact.lost_per_fault_s),
                (built.saving_gpu_share, exact.saving_gpu_share),
                (built.unfair_share, exact.unfair_share),
                (built.max_rho, exact.max_rho),
            ] {
                prop_assert!(close(x, y, 1e-9), "{x} vs {y}: {built:?} vs {exact:?}");
            }
            for (x, y) in [
                (built.median_jct_s, exact.median_jct_s),
                (built.p99_jct_s, exact.p99_jct_s),
            ] {
                prop_assert!(close(x, y, SKETCH_ACCURACY), "{x} vs {y}");
            }
        }
    }

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.5);
        assert_eq!(quantile(&v, 1.0), 4.0);
        assert!((quantile(&v, 0.99) - 3.97).abs() < 1e-12);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
