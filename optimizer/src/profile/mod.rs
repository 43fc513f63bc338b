//! Job-profile models: what a new job will need (CPU, memory, GPU per process) predicted from
//! the jobs that came before it, and how to compare predictors honestly.
//!
//! A [`ProfileSample`] is one past job (or pod, or instance): when it arrived, its *scenario*
//! (what makes jobs alike: kind and workload, an app and its role, ...), what the user asked
//! for if known, and what it turned out to need. A [`Predictor`] sees only the jobs before the
//! one it sizes ([`History`]). One predictor per file, chosen with [`PredictorKind`]:
//!
//! * [`dlrover`]: DLRover's rule: the median of same-scenario jobs of the last 7 days, plus
//!   margins (+50 % CPU, +20 % memory), else the median of all recent jobs;
//! * [`user_request`]: what the user asked for;
//! * [`global_median`]: the median of every earlier job;
//! * [`learned`]: ours: a linear regression (linfa) on log-scale features of the same-scenario
//!   and recent history, with a margin calibrated on held-out residuals so that a chosen share
//!   of jobs (5 %) is under-provisioned.
//!
//! [`scenario_bound`] is no predictor: it peeks at the scored jobs to show the best that
//! telling jobs apart by scenario alone can reach.
//!
//! [`evaluate`] walks a time-ordered split: predictors that learn fit on the earlier part, then
//! every job of the later part is predicted from all jobs before it (as a live brain would),
//! and over- and under-provisioning are counted.

pub mod dlrover;
pub mod global_median;
pub mod learned;
pub mod scenario_bound;
pub mod user_request;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub use dlrover::DlRoverRule;
pub use global_median::GlobalMedian;
pub use learned::LearnedModel;
pub use scenario_bound::ScenarioBound;
pub use user_request::UserRequest;

/// The resources predicted, in this order.
pub const TARGETS: [&str; 3] = ["cpu", "memory", "gpu"];

/// CPU (millicores), memory (MiB), GPUs (fractions allowed), per process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Demand(pub [f64; 3]);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileSample {
    pub at_s: f64,
    pub scenario: String,
    /// A coarser kind the scenario belongs to (a role, a job kind): what a job of a scenario
    /// never seen before is judged by. Empty when the data has none.
    #[serde(default)]
    pub family: String,
    /// What the user asked for, when the data says.
    pub requested: Option<Demand>,
    /// What the job needed.
    pub used: Demand,
}

const WEEK_S: f64 = 7.0 * 86_400.0;

/// The jobs before the one being sized, by scenario and in arrival order.
#[derive(Clone, Debug, Default)]
pub struct History {
    all: Vec<(f64, Demand)>,
    by_scenario: HashMap<String, Vec<(f64, Demand)>>,
    by_family: HashMap<String, Vec<(f64, Demand)>>,
}

impl History {
    /// Adds a job; jobs must come in arrival order.
    pub fn push(&mut self, s: &ProfileSample) {
        self.all.push((s.at_s, s.used));
        self.by_scenario
            .entry(s.scenario.clone())
            .or_default()
            .push((s.at_s, s.used));
        self.by_family
            .entry(s.family.clone())
            .or_default()
            .push((s.at_s, s.used));
    }

    pub fn len(&self) -> usize {
        self.all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Values of target `t` of same-scenario jobs within `window_s` before `at_s`.
    pub fn same_recent(&self, scenario: &str, at_s: f64, window_s: f64, t: usize) -> Vec<f64> {
        self.by_scenario
            .get(scenario)
            .map(|v| recent(v, at_s, window_s, t))
            .unwrap_or_default()
    }

    /// The newest same-scenario value of target `t`.
    pub fn same_last(&self, scenario: &str, t: usize) -> Option<f64> {
        self.by_scenario
            .get(scenario)
            .and_then(|v| v.last())
            .map(|(_, d)| d.0[t])
    }

    /// Values of target `t` of same-family jobs within `window_s` before `at_s`.
    pub fn family_recent(&self, family: &str, at_s: f64, window_s: f64, t: usize) -> Vec<f64> {
        self.by_family
            .get(family)
            .map(|v| recent(v, at_s, window_s, t))
            .unwrap_or_default()
    }

    /// Values of target `t` of all jobs within `window_s` before `at_s`.
    pub fn all_recent(&self, at_s: f64, window_s: f64, t: usize) -> Vec<f64> {
        recent(&self.all, at_s, window_s, t)
    }

    /// Values of target `t` of every earlier job.
    pub fn all_values(&self, t: usize) -> Vec<f64> {
        self.all.iter().map(|(_, d)| d.0[t]).collect()
    }
}

fn recent(v: &[(f64, Demand)], at_s: f64, window_s: f64, t: usize) -> Vec<f64> {
    let from = v.partition_point(|(a, _)| *a < at_s - window_s);
    v[from..]
        .iter()
        .take_while(|(a, _)| *a <= at_s)
        .map(|(_, d)| d.0[t])
        .collect()
}

/// The median (upper middle) of `v`, `None` when empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mid = v.len() / 2;
    let (_, m, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    Some(*m)
}

pub trait Predictor {
    fn name(&self) -> String;
    /// What `job` will need, from the jobs before it; `None` when it cannot say.
    fn predict(&self, history: &History, job: &ProfileSample) -> Option<Demand>;
}

/// A predictor as an operator (or `brainctl train`) names it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PredictorKind {
    Dlrover(DlRoverRule),
    UserRequest(UserRequest),
    GlobalMedian(GlobalMedian),
    Learned(LearnedModel),
}

impl PredictorKind {
    pub fn predictor(&self) -> &dyn Predictor {
        match self {
            PredictorKind::Dlrover(p) => p,
            PredictorKind::UserRequest(p) => p,
            PredictorKind::GlobalMedian(p) => p,
            PredictorKind::Learned(p) => p,
        }
    }
}

/// How one predictor did on the later part of a split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub predictor: String,
    /// Jobs it gave a prediction for, of those evaluated.
    pub predicted: usize,
    pub evaluated: usize,
    /// Per target: Σ max(predicted − needed, 0) / Σ needed.
    pub over: [f64; 3],
    /// Per target: share of predicted jobs given less than they needed.
    pub under: [f64; 3],
    /// Share of predicted jobs short of any target.
    pub under_any: f64,
    /// Per target: mean |predicted − needed| / needed over jobs that needed some.
    pub relative_error: [f64; 3],
}

/// Sorts `samples` by arrival, keeps the first `train_share` for fitting, and scores every
/// predictor on the rest (each job predicted from all jobs before it).
pub fn split(
    mut samples: Vec<ProfileSample>,
    train_share: f64,
) -> (Vec<ProfileSample>, Vec<ProfileSample>) {
    samples.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let cut = ((samples.len() as f64) * train_share.clamp(0.0, 1.0)).round() as usize;
    let test = samples.split_off(cut);
    (samples, test)
}

/// Scores `predictors` on `test`, each job predicted from `train` and the test jobs before it.
pub fn evaluate(
    train: &[ProfileSample],
    test: &[ProfileSample],
    predictors: &[&dyn Predictor],
) -> Vec<Evaluation> {
    let mut history = History::default();
    for s in train {
        history.push(s);
    }
    let mut acc: Vec<Acc> = predictors.iter().map(|_| Acc::default()).collect();
    for job in test {
        for (p, a) in predictors.iter().zip(acc.iter_mut()) {
            a.add(p.predict(&history, job), &job.used);
        }
        history.push(job);
    }
    predictors
        .iter()
        .zip(acc)
        .map(|(p, a)| a.finish(p.name(), test.len()))
        .collect()
}

#[derive(Default)]
struct Acc {
    predicted: usize,
    excess: [f64; 3],
    need: [f64; 3],
    short: [usize; 3],
    short_any: usize,
    rel: [f64; 3],
    rel_n: [usize; 3],
}

impl Acc {
    fn add(&mut self, p: Option<Demand>, used: &Demand) {
        let Some(p) = p else { return };
        self.predicted += 1;
        let mut any = false;
        for t in 0..3 {
            let (x, y) = (p.0[t], used.0[t]);
            self.excess[t] += (x - y).max(0.0);
            self.need[t] += y;
            if x < y * (1.0 - 1e-9) {
                self.short[t] += 1;
                any = true;
            }
            if y > 0.0 {
                self.rel[t] += (x - y).abs() / y;
                self.rel_n[t] += 1;
            }
        }
        if any {
            self.short_any += 1;
        }
    }

    fn finish(self, predictor: String, evaluated: usize) -> Evaluation {
        let n = self.predicted.max(1) as f64;
        let per = |f: &dyn Fn(usize) -> f64| [f(0), f(1), f(2)];
        Evaluation {
            predictor,
            predicted: self.predicted,
            evaluated,
            over: per(&|t| {
                if self.need[t] > 0.0 {
                    self.excess[t] / self.need[t]
                } else {
                    0.0
                }
            }),
            under: per(&|t| self.short[t] as f64 / n),
            under_any: self.short_any as f64 / n,
            relative_error: per(&|t| {
                if self.rel_n[t] > 0 {
                    self.rel[t] / self.rel_n[t] as f64
                } else {
                    0.0
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(at_s: f64, scenario: &str, used: [f64; 3]) -> ProfileSample {
        ProfileSample {
            at_s,
            scenario: scenario.into(),
            family: String::new(),
            requested: Some(Demand([used[0] * 2.0, used[1] * 2.0, used[2]])),
            used: Demand(used),
        }
    }

    #[test]
    fn the_history_sees_only_the_window_before_a_job() {
        let mut h = History::default();
        for (i, s) in ["a", "b", "a", "a"].iter().enumerate() {
            h.push(&sample(i as f64 * 86_400.0, s, [i as f64, 0.0, 0.0]));
        }
        assert_eq!(
            h.same_recent("a", 3.0 * 86_400.0, 1.5 * 86_400.0, 0),
            vec![2.0, 3.0]
        );
        assert_eq!(h.same_last("b", 0), Some(1.0));
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn evaluation_counts_excess_and_shortfall() {
        let train = vec![sample(0.0, "a", [1000.0, 100.0, 1.0])];
        let test = vec![
            sample(1.0, "a", [1000.0, 100.0, 1.0]),
            sample(2.0, "a", [2000.0, 100.0, 1.0]),
        ];
        let e = evaluate(&train, &test, &[&UserRequest::default()]);
        // Requests are twice the need: 100 % excess on CPU and memory, exactly right on GPU.
        assert_eq!(e[0].over, [1.0, 1.0, 0.0]);
        assert_eq!(e[0].under_any, 0.0);
        let e = evaluate(&train, &test, &[&GlobalMedian::default()]);
        // The median of earlier jobs: right for the first, short of CPU for the second.
        assert_eq!(e[0].under, [0.5, 0.0, 0.0]);
        assert_eq!(e[0].predicted, 2);
    }
}
