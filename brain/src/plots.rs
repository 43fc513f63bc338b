//! The what-if comparison as SVG charts (plotters): the distribution of job completion times
//! and GPU utilisation over time, one line per policy.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::BrainError;
use crate::whatif::PolicyResult;

/// At most this many points per line: long replays are averaged into buckets.
const MAX_POINTS: usize = 1000;

fn failed(path: &Path, e: impl std::fmt::Display) -> BrainError {
    BrainError::Internal(format!("drawing {}: {e}", path.display()))
}

/// Writes `jct_cdf.svg` and the utilisation over time into `dir`: `utilisation.svg` for one
/// trace, `utilisation-TRACE.svg` for each of several; returns their paths.
pub fn draw(dir: &Path, results: &[PolicyResult]) -> Result<Vec<PathBuf>, BrainError> {
    std::fs::create_dir_all(dir).map_err(|source| datasets::DatasetError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let cdf = dir.join("jct_cdf.svg");
    jct_cdf(&cdf, results).map_err(|e| failed(&cdf, e))?;
    let mut written = vec![cdf];
    let traces: Vec<String> = results
        .first()
        .map(|r| r.runs.iter().map(|(t, _)| t.clone()).collect())
        .unwrap_or_default();
    for (i, trace) in traces.iter().enumerate() {
        let util = if traces.len() == 1 {
            dir.join("utilisation.svg")
        } else {
            dir.join(format!("utilisation-{}.svg", file_safe(trace)))
        };
        utilisation(&util, results, i, trace).map_err(|e| failed(&util, e))?;
        written.push(util);
    }
    Ok(written)
}

/// A trace's name as a file name: letters, digits, `-`, `_` and `.` kept, others `_`.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Share of finished jobs with a JCT at most x, x on a log scale in hours.
fn jct_cdf(path: &Path, results: &[PolicyResult]) -> DrawResult {
    let lines: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .map(|r| {
            let mut jct: Vec<f64> = r
                .runs
                .iter()
                .flat_map(|(_, rep)| rep.jobs.iter().filter_map(|j| j.jct_s()))
                .map(|s| (s / 3600.0).max(1e-3))
                .collect();
            jct.sort_by(f64::total_cmp);
            let n = jct.len().max(1) as f64;
            let step = jct.len().div_ceil(MAX_POINTS).max(1);
            let mut points: Vec<(f64, f64)> = jct
                .iter()
                .enumerate()
                .filter(|(i, _)| i % step == 0 || i + 1 == jct.len())
                .map(|(i, &x)| (x, (i + 1) as f64 / n))
                .collect();
            points.dedup_by(|a, b| a == b);
            (r.label.clone(), points)
        })
        .collect();
    let all = lines.iter().flat_map(|l| l.1.iter().map(|p| p.0));
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (1e-3, 1.0)
    };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Job completion time (CDF)", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("JCT (hours, log scale)")
        .y_desc("share of finished jobs")
        .draw()?;
    for (i, (label, points)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// GPUs in use / GPUs up per round, of each policy's replay of trace number `index` (named
/// `trace`), hours on x.
fn utilisation(path: &Path, results: &[PolicyResult], index: usize, trace: &str) -> DrawResult {
    let lines: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .map(|r| {
            let rounds = r
                .runs
                .get(index)
                .map_or(&[][..], |(_, rep)| &rep.rounds[..]);
            let step = rounds.len().div_ceil(MAX_POINTS).max(1);
            let points = rounds
                .chunks(step)
                .map(|c| {
                    let used: f64 = c.iter().map(|x| x.gpus_used as f64).sum();
                    let up: f64 = c.iter().map(|x| x.gpus_up as f64).sum();
                    let t = c[0].time_s / 3600.0;
                    (t, if up > 0.0 { 100.0 * used / up } else { 0.0 })
                })
                .collect();
            (r.label.clone(), points)
        })
        .collect();
    let end = lines
        .iter()
        .flat_map(|l| l.1.last().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("GPU utilisation over time ({trace})"),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..end, 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_desc("simulated time (hours)")
        .y_desc("GPUs in use (% of GPUs up)")
        .draw()?;
    for (i, (label, points)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(1)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
