//! Ours: per resource, a ridge regression (linfa's elastic net with no L1 part) of the log of
//! what a job needs on log-scale features of what came before it:
//!
//! * the median, the maximum and the newest of same-scenario jobs of the window (default 7
//!   days), falling back to the median of recent jobs of the same family (a role, a job
//!   kind), else of all recent jobs;
//! * the median of all recent jobs, and that of the family's;
//! * whether the scenario is new;
//! * the user's request, when every training job has one.
//!
//! Then a margin: the fit is made on the first 80 % of the training jobs and the `quantile`
//! (default 95 %) of its residuals on the last 20 % becomes the margin added in log space, so
//! about `1 − quantile` of later jobs get less than they need; the model is then refitted on
//! all training jobs. Margins are kept apart for jobs of a new scenario, of a scenario whose
//! recent jobs (or, for a new one, whose family's recent jobs) all needed the same, and of one
//! whose jobs differ: the first and the last need room, the second almost none. A fixed +50 % (DLRover) is too much where jobs of a scenario are alike
//! and too little where they are not; a calibrated margin is as much as the data says.

use linfa::prelude::*;
use linfa_elasticnet::ElasticNet;
use ndarray::{Array1, Array2};
use serde::{Deserialize, Serialize};

use super::{Demand, History, Predictor, ProfileSample, TARGETS, WEEK_S, median};
use crate::throughput::FitError;

const FEATURES: usize = 7;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetModel {
    pub intercept: f64,
    pub weights: Vec<f64>,
    /// Added to the prediction in log space, per `group`: a new scenario, a job whose
    /// recent like (same scenario, or same family for a new one) all needed the same, a
    /// scenario whose jobs differ.
    pub margins: [f64; 3],
}

/// Which margin a job gets, from its features.
fn group(f: &[f64; FEATURES]) -> usize {
    if f[1] <= f[0] + 1e-12 {
        1
    } else if f[4] > 0.5 {
        0
    } else {
        2
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LearnedModel {
    /// One per entry of [`TARGETS`].
    pub targets: Vec<TargetModel>,
    pub quantile: f64,
    pub window_s: f64,
    /// Whether the user's request is a feature.
    pub uses_request: bool,
    pub trained_on: usize,
}

fn l(x: f64) -> f64 {
    x.max(0.0).ln_1p()
}

fn features(
    h: &History,
    job: &ProfileSample,
    t: usize,
    window_s: f64,
    request: bool,
) -> [f64; FEATURES] {
    let same = h.same_recent(&job.scenario, job.at_s, window_s, t);
    let global = median(h.all_recent(job.at_s, window_s, t))
        .or_else(|| median(h.all_values(t)))
        .unwrap_or(0.0);
    // What a new scenario is judged by: recent jobs of its family, else all recent jobs.
    let kin = h.family_recent(&job.family, job.at_s, window_s, t);
    let new = same.is_empty();
    let max = if new { &kin } else { &same }
        .iter()
        .copied()
        .reduce(f64::max)
        .unwrap_or(global);
    let family = median(kin).unwrap_or(global);
    let med = median(same).unwrap_or(family);
    let last = h.same_last(&job.scenario, t).unwrap_or(med);
    let req = if request {
        job.requested.map_or(l(med), |r| l(r.0[t]))
    } else {
        0.0
    };
    [
        l(med),
        l(max),
        l(last),
        l(global),
        if new { 1.0 } else { 0.0 },
        req,
        l(family),
    ]
}

/// Feature rows and log targets of `samples`, each from the samples before it.
fn table(
    before: &[ProfileSample],
    samples: &[ProfileSample],
    t: usize,
    window_s: f64,
    request: bool,
) -> (Array2<f64>, Array1<f64>) {
    let mut h = History::default();
    for s in before {
        h.push(s);
    }
    let mut x = Array2::zeros((samples.len(), FEATURES));
    let mut y = Array1::zeros(samples.len());
    for (i, s) in samples.iter().enumerate() {
        let f = features(&h, s, t, window_s, request);
        for (j, v) in f.iter().enumerate() {
            x[[i, j]] = *v;
        }
        y[i] = l(s.used.0[t]);
        h.push(s);
    }
    (x, y)
}

fn ridge(x: &Array2<f64>, y: &Array1<f64>) -> Result<(f64, Vec<f64>), FitError> {
    let data = Dataset::new(x.clone(), y.clone());
    let m = ElasticNet::ridge()
        .penalty(1e-3)
        .max_iterations(5000)
        .tolerance(1e-6)
        .fit(&data)
        .map_err(|e| FitError::Solver(format!("ridge regression: {e}")))?;
    let w: Vec<f64> = m.hyperplane().to_vec();
    if !m.intercept().is_finite() || w.iter().any(|v| !v.is_finite()) {
        return Err(FitError::Solver(
            "ridge regression gave non-finite weights".into(),
        ));
    }
    Ok((m.intercept(), w))
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * q).ceil() as usize;
    v[i.min(v.len() - 1)]
}

impl LearnedModel {
    /// Fits on `train` (in arrival order, at least 20 jobs).
    pub fn fit(train: &[ProfileSample], quantile_q: f64) -> Result<LearnedModel, FitError> {
        if train.len() < 20 {
            return Err(FitError::NotEnoughData(format!(
                "{} jobs; at least 20 are needed",
                train.len()
            )));
        }
        if !(0.5..1.0).contains(&quantile_q) {
            return Err(FitError::NotEnoughData(format!(
                "quantile {quantile_q}: expected 0.5 to less than 1"
            )));
        }
        let window_s = WEEK_S;
        let request = train.iter().all(|s| s.requested.is_some());
        let cut = train.len() * 4 / 5;
        let mut targets = Vec::new();
        for t in 0..TARGETS.len() {
            let (x, y) = table(&[], &train[..cut], t, window_s, request);
            let (b, w) = ridge(&x, &y)?;
            let (hx, hy) = table(&train[..cut], &train[cut..], t, window_s, request);
            let w = Array1::from(w);
            let mut residuals: [Vec<f64>; 3] = Default::default();
            for i in 0..hy.len() {
                let f: [f64; FEATURES] = std::array::from_fn(|j| hx[[i, j]]);
                let g = group(&f);
                // A scenario whose recent jobs all needed the same is predicted to need it
                // again (the regression would blur it toward other scenarios).
                let guess = if g == 1 { f[0] } else { b + hx.row(i).dot(&w) };
                residuals[g].push(hy[i] - guess);
            }
            // A group seen too little held out borrows the margin of all of them.
            let all: Vec<f64> = residuals.iter().flatten().copied().collect();
            let overall = quantile(all, quantile_q).max(0.0);
            let margins = residuals.map(|r| {
                if r.len() >= 20 {
                    quantile(r, quantile_q).max(0.0)
                } else {
                    overall
                }
            });
            let (x, y) = table(&[], train, t, window_s, request);
            let (intercept, weights) = ridge(&x, &y)?;
            targets.push(TargetModel {
                intercept,
                weights,
                margins,
            });
        }
        Ok(LearnedModel {
            targets,
            quantile: quantile_q,
            window_s,
            uses_request: request,
            trained_on: train.len(),
        })
    }
}

impl Predictor for LearnedModel {
    fn name(&self) -> String {
        format!("ours (ridge, q{:.0})", self.quantile * 100.0)
    }

    fn predict(&self, history: &History, job: &ProfileSample) -> Option<Demand> {
        // A model stored by a version with other features cannot be read as this one.
        if history.is_empty() || self.targets.iter().any(|m| m.weights.len() != FEATURES) {
            return None;
        }
        let mut d = Demand::default();
        for (t, m) in self.targets.iter().enumerate() {
            let f = features(history, job, t, self.window_s, self.uses_request);
            let g = group(&f);
            let base: f64 = if g == 1 {
                f[0]
            } else {
                m.intercept
                    + m.weights
                        .iter()
                        .zip(f.iter())
                        .map(|(w, x)| w * x)
                        .sum::<f64>()
            };
            let y = base + m.margins[g];
            // Resources come in units: a millicore, a MiB, a thousandth of a GPU.
            let unit = [1.0, 1.0, 0.001][t];
            d.0[t] = (y.exp_m1().max(0.0) / unit - 1e-6).ceil().max(0.0) * unit;
        }
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::sample;
    use super::super::{DlRoverRule, evaluate, split};
    use super::*;

    /// Scenarios whose jobs need about the same each time, with some noise.
    fn jobs() -> Vec<ProfileSample> {
        let mut out = Vec::new();
        let mut x: u64 = 7;
        for i in 0..600 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = 1.0 + ((x >> 33) % 100) as f64 / 1000.0; // up to +10 %
            let s = i % 5;
            out.push(sample(
                i as f64 * 600.0,
                &format!("s{s}"),
                [
                    1000.0 * (s + 1) as f64 * noise,
                    2048.0 * noise,
                    (s % 2) as f64,
                ],
            ));
        }
        out
    }

    #[test]
    fn calibrated_margins_provision_less_than_dlrover_and_rarely_too_little() {
        let (train, test) = split(jobs(), 0.5);
        let ours = LearnedModel::fit(&train, 0.95).unwrap();
        let e = evaluate(&train, &test, &[&ours, &DlRoverRule::default()]);
        let (o, d) = (&e[0], &e[1]);
        assert!(o.under_any <= 0.15, "{o:?}");
        assert!(
            o.over[0] < d.over[0] && o.over[1] < d.over[1],
            "{o:?}\n{d:?}"
        );
    }

    #[test]
    fn too_few_jobs_are_refused() {
        assert!(matches!(
            LearnedModel::fit(&jobs()[..5], 0.95),
            Err(FitError::NotEnoughData(_))
        ));
    }
}
