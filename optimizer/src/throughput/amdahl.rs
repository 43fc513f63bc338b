//! A live job's speed against its worker count, fitted from the samples/s its job master
//! reports: Amdahl's law with non-negative parts,
//!
//! ```text
//! 1 / samples_per_s(n) = serial + parallel / n
//! ```
//!
//! (`parallel / n`: the per-sample work the workers share; `serial`: what every sample costs
//! whatever the worker count, e.g. the parameter servers or the ring). It is what the brain
//! knows of a running CPU job: only its speed at the worker counts it has run at, not step
//! times per placement. The fit minimises the relative error (each row is weighed by the speed
//! measured). With one worker count seen the job is assumed to scale linearly from it
//! (`serial = 0`), the optimistic guess a growth limit then keeps in check.

use serde::{Deserialize, Serialize};

use super::{FitError, nnls};
use crate::heuristics::SpeedPoint;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AmdahlModel {
    /// Seconds per sample that do not shrink with more workers.
    pub serial: f64,
    /// Seconds per sample one worker spends that `n` workers share.
    pub parallel: f64,
    /// Distinct worker counts the fit saw.
    pub counts_seen: usize,
}

impl AmdahlModel {
    /// Fits the model to `points` (averaged per worker count first); points with no workers or
    /// no speed are skipped, a NaN or negative speed is an error.
    pub fn fit(points: &[SpeedPoint]) -> Result<AmdahlModel, FitError> {
        let mut per_count: std::collections::BTreeMap<u32, (f64, u32)> = Default::default();
        for (index, p) in points.iter().enumerate() {
            if !p.samples_per_s.is_finite() || p.samples_per_s < 0.0 {
                return Err(FitError::BadSample {
                    index,
                    problem: format!("samples_per_s is {}", p.samples_per_s),
                });
            }
            if p.workers == 0 || p.samples_per_s == 0.0 {
                continue;
            }
            let e = per_count.entry(p.workers).or_default();
            e.0 += p.samples_per_s;
            e.1 += 1;
        }
        let means: Vec<(f64, f64)> = per_count
            .iter()
            .map(|(&n, &(sum, k))| (n as f64, sum / k as f64))
            .collect();
        match means.as_slice() {
            [] => Err(FitError::NotEnoughData(
                "no report with workers and a speed above zero".into(),
            )),
            [(n, sps)] => Ok(AmdahlModel {
                serial: 0.0,
                parallel: n / sps,
                counts_seen: 1,
            }),
            many => {
                // Weighted by the speed: (serial + parallel/n)·sps ≈ 1.
                let a: Vec<Vec<f64>> = many.iter().map(|&(n, s)| vec![s, s / n]).collect();
                let b = vec![1.0; many.len()];
                let x = nnls(&a, &b)?;
                if x[0] + x[1] <= 0.0 {
                    return Err(FitError::Solver("the fit gives no time per sample".into()));
                }
                Ok(AmdahlModel {
                    serial: x[0],
                    parallel: x[1],
                    counts_seen: many.len(),
                })
            }
        }
    }

    /// A model of a job that runs at `per_worker` samples/s per worker and scales linearly.
    pub fn linear(per_worker: f64) -> AmdahlModel {
        AmdahlModel {
            serial: 0.0,
            parallel: 1.0 / per_worker,
            counts_seen: 0,
        }
    }

    /// Predicted samples/s with `workers` workers (0 with none).
    pub fn samples_per_s(&self, workers: u32) -> f64 {
        if workers == 0 {
            return 0.0;
        }
        1.0 / (self.serial + self.parallel / workers as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(workers: u32, samples_per_s: f64) -> SpeedPoint {
        SpeedPoint {
            workers,
            samples_per_s,
        }
    }

    #[test]
    fn recovers_an_amdahl_curve_from_three_counts() {
        let truth = AmdahlModel {
            serial: 0.0005,
            parallel: 0.004,
            counts_seen: 0,
        };
        let pts: Vec<_> = [1, 2, 4]
            .iter()
            .map(|&n| pt(n, truth.samples_per_s(n)))
            .collect();
        let m = AmdahlModel::fit(&pts).unwrap();
        for n in [1, 3, 8, 16] {
            let rel = (m.samples_per_s(n) / truth.samples_per_s(n) - 1.0).abs();
            assert!(rel < 1e-4, "{n} workers: {rel}");
        }
        assert_eq!(m.counts_seen, 3);
    }

    #[test]
    fn one_count_seen_means_linear_scaling_from_it() {
        let m = AmdahlModel::fit(&[pt(2, 100.0), pt(2, 120.0), pt(0, 0.0)]).unwrap();
        assert_eq!(m.serial, 0.0);
        assert!((m.samples_per_s(2) - 110.0).abs() < 1e-9);
        assert!((m.samples_per_s(4) - 220.0).abs() < 1e-9);
    }

    #[test]
    fn a_job_that_does_not_scale_is_seen_not_to() {
        let m = AmdahlModel::fit(&[pt(1, 100.0), pt(2, 101.0), pt(4, 100.5)]).unwrap();
        assert!(m.samples_per_s(8) < 110.0, "{m:?}");
    }

    #[test]
    fn bad_speeds_and_empty_reports_are_errors() {
        assert!(matches!(
            AmdahlModel::fit(&[pt(1, f64::NAN)]),
            Err(FitError::BadSample { index: 0, .. })
        ));
        assert!(matches!(
            AmdahlModel::fit(&[pt(0, 5.0), pt(3, 0.0)]),
            Err(FitError::NotEnoughData(_))
        ));
    }
}
