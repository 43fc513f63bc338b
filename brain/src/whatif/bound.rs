//! The lower bound row of the what-if ([`optimizer::sim::lower_bound`], per trace, pooled as
//! the table pools the policies' results) and each policy's distance to it.

use std::path::{Path, PathBuf};

use datasets::export::{Values, write_table};
use optimizer::sim::AppProfile;

use super::{NamedTrace, Options, PolicyResult};
use crate::BrainError;

/// The bound of the traces replayed, as the table's row: mean and p99 JCT over the jobs of
/// every trace pooled, the longest trace's makespan; which bound gave each figure.
#[derive(Clone, Debug, PartialEq)]
pub struct BoundRow {
    pub jobs: usize,
    pub mean_jct_s: f64,
    /// The mean of the jobs' alone bounds (at most `mean_jct_s`).
    pub mean_alone_s: f64,
    pub p99_jct_s: f64,
    pub makespan_s: f64,
    pub mean_from: String,
    pub makespan_from: String,
}

/// The bound over `traces` on the options' cluster; a trace it cannot be computed for (a job
/// without a profile, say) is named with the job and why.
pub fn bound(
    traces: &[NamedTrace],
    profiles: &[AppProfile],
    options: &Options,
) -> Result<BoundRow, BrainError> {
    let mut alone = Vec::new();
    let (mut sum, mut makespan) = (0.0, 0.0f64);
    let (mut mean_from, mut makespan_from) = (Vec::new(), Vec::new());
    for (t, b) in traces.iter().zip(per_trace(traces, profiles, options)) {
        let b = b.map_err(|error| BrainError::Simulation {
            trace: t.name.clone(),
            policy: "the lower bound".into(),
            error,
        })?;
        sum += b.mean_jct_s * t.jobs.len() as f64;
        alone.extend(b.alone_s.iter().copied());
        if b.makespan_s > makespan {
            makespan = b.makespan_s;
            makespan_from = vec![b.makespan_from];
        }
        mean_from.push(b.mean_from);
    }
    let mean_alone_s = alone.iter().sum::<f64>() / alone.len().max(1) as f64;
    alone.sort_by(f64::total_cmp);
    let mean_from = {
        // Which bound gave each trace's mean: one name when it was the same for all.
        let kinds = ["alone", "capacity", "rate-capped"];
        let counts: Vec<(&str, usize)> = kinds
            .iter()
            .map(|k| (*k, mean_from.iter().filter(|f| *f == k).count()))
            .filter(|(_, n)| *n > 0)
            .collect();
        match counts.as_slice() {
            [(k, _)] => k.to_string(),
            many => many
                .iter()
                .map(|(k, n)| format!("{k} on {n} traces"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    };
    Ok(BoundRow {
        jobs: alone.len(),
        mean_jct_s: sum / alone.len().max(1) as f64,
        mean_alone_s,
        p99_jct_s: optimizer::sim::report::quantile(&alone, 0.99),
        makespan_s: makespan,
        mean_from,
        makespan_from: makespan_from.join("+"),
    })
}

/// Each trace's bound, `options.parallel` at a time (the rate-capped LP takes seconds on a
/// trace of a few hundred jobs).
fn per_trace(
    traces: &[NamedTrace],
    profiles: &[AppProfile],
    options: &Options,
) -> Vec<Result<optimizer::sim::LowerBound, optimizer::PolicyError>> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<_>>> = Mutex::new((0..traces.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..options.parallel.clamp(1, traces.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(t) = traces.get(i) else { break };
                    let b = optimizer::sim::lower_bound(
                        &t.jobs,
                        profiles,
                        &options.cluster,
                        &options.sim,
                    );
                    out.lock().expect("no bound panicked")[i] = Some(b);
                }
            });
        }
    });
    out.into_inner()
        .expect("no bound panicked")
        .into_iter()
        .map(|b| b.expect("every trace bounded"))
        .collect()
}

/// A policy's figure over the bound's; none when the policy left jobs unfinished (its JCTs are
/// over fewer jobs than the bound's).
fn ratio(
    r: &PolicyResult,
    b: &BoundRow,
    figure: impl Fn(&optimizer::sim::Summary) -> f64,
    bound: f64,
) -> Option<f64> {
    (r.summary.finished as usize == b.jobs && bound > 0.0).then(|| figure(&r.summary) / bound)
}

/// The bound's line and each policy's distance to it (× the bound), for the terminal.
pub fn render_bound(results: &[PolicyResult], b: &BoundRow) -> String {
    let mut out = format!(
        "lower bound (no scheduler does better on these traces and cluster): mean JCT {:.0} s \
         ({}), p99 JCT {:.0} s (alone), makespan {:.0} s ({})\n",
        b.mean_jct_s, b.mean_from, b.p99_jct_s, b.makespan_s, b.makespan_from
    );
    let width = label_width(results, 6);
    out.push_str(&format!(
        "{:<width$}  {:>10}  {:>9}  {:>10}\n",
        "over the bound", "mean JCT", "p99 JCT", "makespan"
    ));
    let cell = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}x"));
    for r in results {
        out.push_str(&format!(
            "{:<width$}  {:>10}  {:>9}  {:>10}\n",
            r.label,
            cell(ratio(r, b, |s| s.mean_jct_s, b.mean_jct_s)),
            cell(ratio(r, b, |s| s.p99_jct_s, b.p99_jct_s)),
            cell(ratio(r, b, |s| s.makespan_s, b.makespan_s)),
        ));
    }
    out
}

/// The width of the policies' column: their longest label, at least `least`.
pub(super) fn label_width(results: &[PolicyResult], least: usize) -> usize {
    results
        .iter()
        .map(|r| r.label.len())
        .max()
        .unwrap_or(least)
        .max(least)
}

/// Writes `bound.{parquet,csv}` into `dir`: the bound's row, then each policy's figures and
/// its ratios to the bound (empty where it left jobs unfinished).
pub fn write_bound(
    dir: &Path,
    results: &[PolicyResult],
    b: &BoundRow,
) -> Result<Vec<PathBuf>, BrainError> {
    let mut labels = vec!["lower bound".to_string()];
    labels.extend(results.iter().map(|r| r.label.clone()));
    let figure = |f: &dyn Fn(&optimizer::sim::Summary) -> f64, bound: f64| {
        let mut v = vec![Some(bound)];
        v.extend(results.iter().map(|r| Some(f(&r.summary))));
        Values::F64(v)
    };
    let over = |f: &dyn Fn(&optimizer::sim::Summary) -> f64, bound: f64| {
        let mut v = vec![Some(1.0)];
        v.extend(results.iter().map(|r| ratio(r, b, f, bound)));
        Values::F64(v)
    };
    Ok(write_table(
        &dir.join("bound"),
        vec![
            ("policy", Values::Text(labels)),
            ("mean_jct_s", figure(&|s| s.mean_jct_s, b.mean_jct_s)),
            ("p99_jct_s", figure(&|s| s.p99_jct_s, b.p99_jct_s)),
            ("makespan_s", figure(&|s| s.makespan_s, b.makespan_s)),
            ("mean_jct_over_bound", over(&|s| s.mean_jct_s, b.mean_jct_s)),
            ("p99_jct_over_bound", over(&|s| s.p99_jct_s, b.p99_jct_s)),
            ("makespan_over_bound", over(&|s| s.makespan_s, b.makespan_s)),
        ],
    )?
    .into_iter()
    .collect())
}
