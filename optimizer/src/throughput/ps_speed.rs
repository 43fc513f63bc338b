//! The speed of a PS job over (workers, parameter servers), fitted online from its reports.
//! Optimus' model of a PS job's step ([`super::optimus`]) with the local batch fixed (a job's
//! batch per worker does not change when it is rescaled) gives, per worker, the time of one
//! sample
//!
//! t(w, p) = θ₁ + θ₂·w/p + θ₃·w + θ₄·p    and so    samples/s = w / t(w, p)
//!
//! (compute and fixed overhead, parameter traffic per PS, per-worker overhead, per-PS
//! overhead), every θ ≥ 0, fitted by non-negative least squares on the relative error. Reports
//! at one PS count cannot tell the traffic per PS from the rest, so the model needs reports at
//! two PS counts or more, and at three (workers, PS) pairs or more.

use serde::{Deserialize, Serialize};

use super::{FitError, nnls};

/// Samples per second a PS job reached with `workers` workers and `ps` parameter servers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PsSpeedPoint {
    pub workers: u32,
    pub ps: u32,
    pub samples_per_s: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PsSpeedModel {
    /// θ₁..θ₄ of the module's formula, each ≥ 0.
    pub theta: [f64; 4],
    /// Distinct (workers, PS) pairs it was fitted on.
    pub pairs: usize,
}

fn features(w: f64, p: f64) -> [f64; 4] {
    [1.0, w / p, w, p]
}

impl PsSpeedModel {
    pub fn fit(points: &[PsSpeedPoint]) -> Result<PsSpeedModel, FitError> {
        let mut mean: std::collections::BTreeMap<(u32, u32), (f64, u32)> = Default::default();
        for (index, p) in points.iter().enumerate() {
            if !(p.samples_per_s.is_finite() && p.samples_per_s >= 0.0) {
                return Err(FitError::BadSample {
                    index,
                    problem: format!("samples_per_s is {}", p.samples_per_s),
                });
            }
            if p.workers > 0 && p.ps > 0 && p.samples_per_s > 0.0 {
                let e = mean.entry((p.workers, p.ps)).or_default();
                e.0 += p.samples_per_s;
                e.1 += 1;
            }
        }
        let ps_counts: std::collections::BTreeSet<u32> = mean.keys().map(|k| k.1).collect();
        if mean.len() < 3 || ps_counts.len() < 2 {
            return Err(FitError::NotEnoughData(format!(
                "{} (workers, ps) pairs at {} ps count(s); the model needs 3 pairs at 2 ps \
                 counts or more",
                mean.len(),
                ps_counts.len()
            )));
        }
        // Relative error: (f·θ − t) / t for t = w / samples_per_s.
        let (a, b): (Vec<Vec<f64>>, Vec<f64>) = mean
            .iter()
            .map(|(&(w, p), &(sum, n))| {
                let t = w as f64 / (sum / n as f64);
                let row = features(w as f64, p as f64).map(|x| x / t).to_vec();
                (row, 1.0)
            })
            .unzip();
        let x = nnls(&a, &b)?;
        let theta = [x[0], x[1], x[2], x[3]];
        if theta.iter().sum::<f64>() <= 0.0 {
            return Err(FitError::Solver("the fit gives no time per sample".into()));
        }
        Ok(PsSpeedModel {
            theta,
            pairs: mean.len(),
        })
    }

    pub fn samples_per_s(&self, workers: u32, ps: u32) -> f64 {
        if workers == 0 || ps == 0 {
            return 0.0;
        }
        let f = features(workers as f64, ps as f64);
        let t: f64 = f.iter().zip(&self.theta).map(|(f, th)| f * th).sum();
        if t > 0.0 { workers as f64 / t } else { 0.0 }
    }

    /// The PS count in `lo..=hi` for `workers` workers: the fewest whose predicted speed is
    /// within `tolerance` (a fraction) of the best in the range, since each PS holds CPU.
    pub fn best_ps(&self, workers: u32, lo: u32, hi: u32, tolerance: f64) -> u32 {
        let lo = lo.max(1);
        let best = (lo..=hi.max(lo))
            .map(|p| self.samples_per_s(workers, p))
            .fold(0.0, f64::max);
        (lo..=hi.max(lo))
            .find(|&p| self.samples_per_s(workers, p) >= best * (1.0 - tolerance))
            .unwrap_or(lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truth(w: u32, p: u32) -> f64 {
        // 1 ms per sample, 0.8 ms of traffic per worker per PS: PS-bound beyond a few workers.
        w as f64 / (1e-3 + 0.8e-3 * w as f64 / p as f64)
    }

    fn points(pairs: &[(u32, u32)]) -> Vec<PsSpeedPoint> {
        pairs
            .iter()
            .map(|&(workers, ps)| PsSpeedPoint {
                workers,
                ps,
                samples_per_s: truth(workers, ps),
            })
            .collect()
    }

    #[test]
    fn the_model_recovers_a_ps_bound_job_and_picks_its_ps_count() {
        let m = PsSpeedModel::fit(&points(&[(2, 1), (4, 1), (4, 2), (2, 2)])).unwrap();
        for (w, p) in [(8, 1), (8, 4), (3, 3)] {
            let (got, want) = (m.samples_per_s(w, p), truth(w, p));
            assert!((got - want).abs() / want < 0.02, "{w}x{p}: {got} vs {want}");
        }
        // At 8 workers more PS keep paying: 4 of 1..=4 (within 5 % of the best).
        assert_eq!(m.best_ps(8, 1, 4, 0.05), 4);
        // At 1 worker 4 PS give 833 samples/s and 1 gives 556: within 35 % the fewest is 1,
        // within 25 % it is 2 (714).
        assert_eq!(m.best_ps(1, 1, 4, 0.35), 1);
        assert_eq!(m.best_ps(1, 1, 4, 0.25), 2);
    }

    #[test]
    fn one_ps_count_is_not_enough_and_bad_speeds_are_refused() {
        let e = PsSpeedModel::fit(&points(&[(1, 1), (2, 1), (4, 1)])).unwrap_err();
        assert!(e.to_string().contains("at 1 ps count"), "{e}");
        let mut bad = points(&[(1, 1), (2, 2), (4, 1)]);
        bad[1].samples_per_s = f64::NAN;
        assert!(PsSpeedModel::fit(&bad).is_err());
    }
}
