//! Where each policy's distance to the lower bound goes (issue 45): its mean JCT over the
//! bound's, split into the parts the replay measured ([`optimizer::sim::JctAccount`]).
//!
//! Each job's JCT is its alone bound (the floor every scheduler pays and its work at the best
//! rate) plus what it spent beyond: queueing for a first start, waits without GPUs after it,
//! restarts, training slower than the best (batch size, GPU count while GPUs idled or while
//! the cluster was full, GPU type, spread over nodes, slow nodes) and faults. The bound on the
//! mean is at least the jobs' alone bounds'
//! mean; what it adds above them (the rate-capped or capacity bound: the jobs cannot all run
//! alone at once) is part of every scheduler's distance beyond alone, so it is taken off:
//!
//! `mean JCT − bound = queueing + waits + restarts + batch + sizing + sharing + type + spread +
//! slow + faults − (bound − mean alone)`, exactly, for a policy that finished every job.

use std::path::{Path, PathBuf};

use datasets::export::{Values, write_table};
use optimizer::sim::{JctAccount, Summary};

use super::bound::label_width;
use super::{BoundRow, PolicyResult};
use crate::BrainError;

/// The parts beyond the alone bound as the terminal's table heads them, in the order of
/// [`JctAccount::NAMES`] after its first two (`floor_s`, `least_s`), which the files use.
const LABELS: [&str; 10] = [
    "queueing",
    "waits",
    "restarts",
    "batch",
    "sizing",
    "sharing",
    "GPU type",
    "spread",
    "slow nodes",
    "faults",
];

/// The parts beyond the alone bound: (table head, column name, value).
fn parts(a: &JctAccount) -> impl Iterator<Item = (&'static str, &'static str, f64)> {
    let values = a.values();
    LABELS
        .into_iter()
        .zip(JctAccount::NAMES.into_iter().zip(values).skip(2))
        .map(|(label, (name, v))| (label, name, v))
}

/// A policy's account, where it finished every job the bound counts.
fn account_of<'a>(r: &'a PolicyResult, b: &BoundRow) -> Option<&'a JctAccount> {
    (r.summary.finished as usize == b.jobs).then_some(&r.summary.mean_account)
}

/// What the bound adds above the jobs' alone bounds (0 where the alone bound gave it).
fn above_alone(b: &BoundRow) -> f64 {
    b.mean_jct_s - b.mean_alone_s
}

/// The split for the terminal: one row per policy, seconds per job.
pub fn render_account(results: &[PolicyResult], b: &BoundRow) -> String {
    let mut out = format!(
        "where the distance to the bound goes (mean s per job; the parts beyond each job's \
         alone bound, less the {} s the bound adds above those for sharing the cluster):\n",
        secs(above_alone(b))
    );
    let width = label_width(results, 6);
    out.push_str(&format!("{:<width$}  {:>10}", "policy", "over bound"));
    for name in LABELS {
        out.push_str(&format!("  {name:>10}"));
    }
    out.push('\n');
    for r in results {
        out.push_str(&format!("{:<width$}", r.label));
        match account_of(r, b) {
            Some(a) => {
                out.push_str(&format!("  {:>10}", secs(over_bound(&r.summary, b))));
                for (_, _, v) in parts(a) {
                    out.push_str(&format!("  {:>10}", secs(v)));
                }
            }
            None => out.push_str("  - (not every job finished: no account against the bound)"),
        }
        out.push('\n');
    }
    out
}

/// Whole seconds, a part that rounds to none written `0` (not `-0`).
fn secs(v: f64) -> String {
    if v.abs() < 0.5 {
        "0".into()
    } else {
        format!("{v:.0}")
    }
}

fn over_bound(s: &Summary, b: &BoundRow) -> f64 {
    s.mean_jct_s - b.mean_jct_s
}

/// Writes `account.{parquet,csv}` into `dir`: per policy, its mean JCT over the bound's in
/// seconds, each part, and what the bound adds above the alone bounds (empty where the
/// policy left jobs unfinished).
pub fn write_account(
    dir: &Path,
    results: &[PolicyResult],
    b: &BoundRow,
) -> Result<Vec<PathBuf>, BrainError> {
    let column = |f: &dyn Fn(&PolicyResult, &JctAccount) -> f64| {
        Values::F64(
            results
                .iter()
                .map(|r| account_of(r, b).map(|a| f(r, a)))
                .collect(),
        )
    };
    let mut columns = vec![
        (
            "policy",
            Values::Text(results.iter().map(|r| r.label.clone()).collect()),
        ),
        ("over_bound_s", column(&|r, _| over_bound(&r.summary, b))),
    ];
    for (i, name) in JctAccount::NAMES.into_iter().enumerate().skip(2) {
        columns.push((name, column(&|_, a| a.values()[i])));
    }
    columns.push(("bound_above_alone_s", column(&|_, _| above_alone(b))));
    Ok(write_table(&dir.join("account"), columns)?
        .into_iter()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts, less what the bound adds above alone, are the distance to the bound.
    #[test]
    fn the_parts_less_the_bound_above_alone_are_the_distance() {
        // Every part set, so that a part the table left out would show.
        let a = JctAccount {
            floor_s: 30.0,
            least_s: 70.0,
            queue_s: 10.0,
            waits_s: 1.0,
            restarts_s: 15.0,
            batch_s: 2.0,
            sizing_s: 7.0,
            sharing_s: 25.0,
            type_s: 3.0,
            spread_s: 4.0,
            slow_s: 5.0,
            faults_s: 6.0,
        };
        let b = BoundRow {
            jobs: 1,
            mean_jct_s: 120.0,
            mean_alone_s: 100.0,
            p99_jct_s: 100.0,
            makespan_s: 100.0,
            mean_from: "rate-capped".into(),
            makespan_from: "alone".into(),
        };
        let beyond: f64 = parts(&a).map(|(_, _, v)| v).sum();
        assert_eq!(beyond - above_alone(&b), a.total() - b.mean_jct_s);
        assert_eq!(parts(&a).count(), LABELS.len());
    }
}
