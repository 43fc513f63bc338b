//! A measured table: step times looked up where they were measured and interpolated elsewhere,
//! as Gavel's simulator uses `simulation_throughputs.json`.
//!
//! Points are grouped by node count (a query on an unmeasured node count uses the nearest
//! measured one on the same side of "one node"). Within it a query interpolates linearly in the
//! local batch size within a replica count, then linearly across replica counts. Beyond the
//! largest replica count measured, the step time of that count holds (a ring all-reduce moves
//! about the same bytes per replica whatever its size; on Pollux's and Sia's profiles this
//! extrapolates better than continuing the last slope: 15.6 % against 23.7 % mean error). Outside
//! the measured batch sizes the nearest two points' slope continues, never below zero; with a
//! single measured batch size, time is proportional to the batch.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{FitError, Placement, StepSample, ThroughputModel, validate_samples};
use crate::units::WorkerType;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TablePoint {
    pub replicas: u32,
    /// Nodes the replicas span.
    pub nodes: u32,
    pub local_bsz: f64,
    pub step_time: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MeasuredTable {
    /// Sorted by (nodes, replicas, local_bsz); one point per key.
    pub points: Vec<TablePoint>,
}

/// Linear through (x0, y0) and (x1, y1) at x, with the slope floored at `min_slope`.
fn line_at(x: f64, (x0, y0): (f64, f64), (x1, y1): (f64, f64), min_slope: f64) -> f64 {
    if x1 == x0 {
        return y0;
    }
    let slope = ((y1 - y0) / (x1 - x0)).max(min_slope);
    y0 + slope * (x - x0)
}

/// Piecewise-linear value at x of points sorted by x; outside, the end segment continues with a
/// slope of at least `min_slope` (a single point is `single(x, point)`).
pub(crate) fn piecewise(
    x: f64,
    pts: &[(f64, f64)],
    min_slope: f64,
    single: impl Fn(f64, (f64, f64)) -> f64,
) -> f64 {
    match pts {
        [] => f64::NAN,
        [p] => single(x, *p),
        _ => {
            let i = pts.partition_point(|p| p.0 < x);
            if i < pts.len() && pts[i].0 == x {
                return pts[i].1;
            }
            let (a, b) = if i == 0 {
                (pts[0], pts[1])
            } else if i >= pts.len() {
                (pts[pts.len() - 2], pts[pts.len() - 1])
            } else {
                (pts[i - 1], pts[i])
            };
            let inside = i > 0 && i < pts.len();
            line_at(x, a, b, if inside { f64::NEG_INFINITY } else { min_slope })
        }
    }
}

impl MeasuredTable {
    /// A table of `samples`, averaging repeated measurements of one placement.
    pub fn fit(samples: &[StepSample]) -> Result<Self, FitError> {
        validate_samples(samples, false)?;
        if samples.is_empty() {
            return Err(FitError::NotEnoughData("no samples".into()));
        }
        let mut sums: BTreeMap<(u32, u32, u64), (f64, f64, u32)> = BTreeMap::new();
        for s in samples {
            let p = &s.placement;
            let e = sums
                .entry((p.nodes, p.replicas, p.local_bsz.to_bits()))
                .or_insert((p.local_bsz, 0.0, 0));
            e.1 += s.step_time;
            e.2 += 1;
        }
        Ok(Self::from_points(
            sums.into_iter()
                .map(|((nodes, replicas, _), (bsz, sum, n))| TablePoint {
                    replicas,
                    nodes,
                    local_bsz: bsz,
                    step_time: sum / n as f64,
                })
                .collect(),
        ))
    }

    fn from_points(mut points: Vec<TablePoint>) -> Self {
        points.sort_by(|a, b| {
            (a.nodes, a.replicas)
                .cmp(&(b.nodes, b.replicas))
                .then(a.local_bsz.total_cmp(&b.local_bsz))
        });
        MeasuredTable { points }
    }

    /// Step time of `replicas` at `bsz` among the points measured on `nodes` nodes. The points
    /// are sorted, so a node count's are one run and each replica count's a run within it.
    fn lookup(&self, nodes: u32, replicas: u32, bsz: f64) -> Option<f64> {
        let from = self.points.partition_point(|p| p.nodes < nodes);
        let to = self.points.partition_point(|p| p.nodes <= nodes);
        let class = &self.points[from..to];
        if class.is_empty() {
            return None;
        }
        let mut pts: Vec<(f64, f64)> = Vec::new();
        let by_replicas: Vec<(f64, f64)> = class
            .chunk_by(|a, b| a.replicas == b.replicas)
            .map(|run| {
                pts.clear();
                pts.extend(run.iter().map(|p| (p.local_bsz, p.step_time)));
                let t = piecewise(bsz, &pts, 0.0, |x, (x0, y0)| y0 * x / x0);
                (run[0].replicas as f64, t)
            })
            .collect();
        // Beyond the largest measured count the step time holds: a ring all-reduce moves about
        // the same bytes per replica whatever the ring's size, so on as many nodes the step
        // costs what it cost at the largest size measured.
        let (x_last, y_last) = *by_replicas.last().expect("the class is not empty");
        let t = if replicas as f64 > x_last {
            y_last
        } else {
            piecewise(replicas as f64, &by_replicas, 0.0, |_, (_, y0)| y0)
        };
        Some(t.max(f64::MIN_POSITIVE))
    }

    /// Gavel's `simulation_throughputs.json` (steps/s per worker type, job type and scale
    /// factor; the co-location entries are ignored): one table per (worker type, job type).
    /// `<type>_unconsolidated` entries are the same type with its replicas spread over nodes.
    pub fn from_gavel_json(
        json: &str,
    ) -> Result<BTreeMap<(WorkerType, String), MeasuredTable>, FitError> {
        type Raw = BTreeMap<String, BTreeMap<String, BTreeMap<String, serde_json::Value>>>;
        let raw: Raw = serde_json::from_str(json).map_err(|e| FitError::BadFile(e.to_string()))?;
        let mut points: BTreeMap<(WorkerType, String), Vec<TablePoint>> = BTreeMap::new();
        for (worker, jobs) in raw {
            let (base, spread) = match worker.strip_suffix("_unconsolidated") {
                Some(b) => (b.to_string(), true),
                None => (worker.clone(), false),
            };
            for (key, entries) in jobs {
                let bad = |problem: &str| FitError::BadFile(format!("{worker} / {key}: {problem}"));
                // "('ResNet-18 (batch size 16)', 1)"
                let inner = key
                    .strip_prefix("('")
                    .and_then(|k| k.strip_suffix(')'))
                    .ok_or_else(|| bad("not ('<job type>', <scale factor>)"))?;
                let (job, sf) = inner
                    .rsplit_once("', ")
                    .ok_or_else(|| bad("not ('<job type>', <scale factor>)"))?;
                let replicas: u32 = sf.trim().parse().map_err(|_| bad("scale factor"))?;
                let steps_per_s = entries
                    .get("null")
                    .and_then(serde_json::Value::as_f64)
                    .ok_or_else(|| bad("no isolated (\"null\") throughput"))?;
                if !(steps_per_s.is_finite() && steps_per_s > 0.0) {
                    continue; // the job type does not run on this worker type
                }
                let bsz = job
                    .split_once("(batch size ")
                    .and_then(|(_, b)| b.trim_end_matches(')').parse::<f64>().ok())
                    .unwrap_or(1.0);
                points
                    .entry((WorkerType(base.clone()), job.to_string()))
                    .or_default()
                    .push(TablePoint {
                        replicas,
                        nodes: if spread { replicas } else { 1 },
                        local_bsz: bsz,
                        step_time: 1.0 / steps_per_s,
                    });
            }
        }
        Ok(points
            .into_iter()
            .map(|(k, p)| (k, MeasuredTable::from_points(p)))
            .collect())
    }
}

impl ThroughputModel for MeasuredTable {
    fn step_time(&self, p: &Placement) -> f64 {
        // The measured node count nearest to the query's, on its side of "one node" when the
        // table has one there; ties go to more nodes.
        let spread = p.nodes > 1;
        let nearest = |same_side: bool| {
            self.points
                .iter()
                .map(|q| q.nodes)
                .filter(|&n| !same_side || (n > 1) == spread)
                .min_by_key(|&n| (n.abs_diff(p.nodes), std::cmp::Reverse(n)))
        };
        nearest(true)
            .or_else(|| nearest(false))
            .and_then(|n| self.lookup(n, p.replicas, p.local_bsz))
            .unwrap_or(f64::NAN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(nodes: u32, replicas: u32, bsz: f64) -> Placement {
        Placement {
            ps: 0,
            nodes,
            replicas,
            local_bsz: bsz,
        }
    }

    fn sample(nodes: u32, replicas: u32, bsz: f64, t: f64) -> StepSample {
        StepSample {
            placement: at(nodes, replicas, bsz),
            step_time: t,
            sync_time: None,
        }
    }

    #[test]
    fn measured_points_come_back_and_others_are_interpolated() {
        let t = MeasuredTable::fit(&[
            sample(1, 1, 32.0, 0.10),
            sample(1, 1, 32.0, 0.12),
            sample(1, 1, 64.0, 0.20),
            sample(1, 4, 32.0, 0.15),
            sample(1, 4, 64.0, 0.25),
        ])
        .unwrap();
        assert!(
            (t.step_time(&at(1, 1, 32.0)) - 0.11).abs() < 1e-12,
            "mean of repeats"
        );
        assert!((t.step_time(&at(1, 1, 48.0)) - 0.155).abs() < 1e-12);
        assert!((t.step_time(&at(1, 2, 32.0)) - (0.11 + 0.04 / 3.0)).abs() < 1e-12);
        // Beyond the largest count measured, its step time holds.
        assert_eq!(t.step_time(&at(1, 8, 64.0)), 0.25);
        // No spread measurements: the one-node ones stand in.
        assert_eq!(t.step_time(&at(2, 4, 32.0)), t.step_time(&at(1, 4, 32.0)));
    }

    #[test]
    fn gavel_files_parse_into_one_table_per_type_and_job() {
        let json = r#"{
          "v100": {
            "('ResNet-18 (batch size 16)', 1)": {"null": 10.0, "('A3C', 1)": [5.0, 1.0]},
            "('ResNet-18 (batch size 16)', 2)": {"null": 8.0},
            "('A3C', 1)": {"null": 0.0}
          },
          "v100_unconsolidated": {
            "('ResNet-18 (batch size 16)', 2)": {"null": 5.0}
          }
        }"#;
        let tables = MeasuredTable::from_gavel_json(json).unwrap();
        let t = &tables[&(
            WorkerType("v100".into()),
            "ResNet-18 (batch size 16)".into(),
        )];
        assert_eq!(t.step_time(&at(1, 1, 16.0)), 0.1);
        assert_eq!(t.step_time(&at(1, 2, 16.0)), 0.125);
        assert_eq!(t.step_time(&at(2, 2, 16.0)), 0.2);
        assert!(!tables.contains_key(&(WorkerType("v100".into()), "A3C".into())));
        let e = MeasuredTable::from_gavel_json(r#"{"v100": {"ResNet": {"null": 1.0}}}"#);
        assert!(e.unwrap_err().to_string().contains("v100 / ResNet"));
    }
}
