//! The side-by-side table and the result tables (`--out`): one column definition for the jobs
//! and rounds tables, written whole or row by row.

use std::path::{Path, PathBuf};

use datasets::export::{Cell, Values, columns, write_table};
use optimizer::sim::{JctAccount, JobRecord, RoundRecord};

use super::PolicyResult;
use crate::BrainError;

/// The side-by-side table, one row per policy. Everything in it follows from the inputs and
/// the seed (decision times, which depend on the machine, are in [`render_timing`]).
pub fn render_table(results: &[PolicyResult]) -> String {
    let header = [
        "policy",
        "jobs",
        "finished",
        "mean JCT s",
        "median JCT s",
        "p99 JCT s",
        "makespan s",
        "GPU util %",
        "mean queue s",
        "restarts",
        "restart GPU %",
        "rho>1 %",
        "max rho",
        "faults",
        "stalled GPU %",
        "eff train %",
        "lost train s",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let s = &r.summary;
            vec![
                r.label.clone(),
                s.jobs.to_string(),
                s.finished.to_string(),
                format!("{:.0}", s.mean_jct_s),
                format!("{:.0}", s.median_jct_s),
                format!("{:.0}", s.p99_jct_s),
                format!("{:.0}", s.makespan_s),
                format!("{:.1}", 100.0 * s.gpu_utilisation),
                format!("{:.0}", s.mean_queueing_s),
                s.restarts.to_string(),
                format!("{:.1}", 100.0 * s.restart_gpu_share),
                format!("{:.1}", 100.0 * s.unfair_share),
                format!("{:.2}", s.max_rho),
                s.faults.to_string(),
                format!("{:.1}", 100.0 * s.stalled_gpu_share),
                format!("{:.1}", 100.0 * s.effective_training),
                format!("{:.0}", s.lost_training_s),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(c, v)| {
                if c == 0 {
                    format!("{v:<w$}", w = widths[c])
                } else {
                    format!("{v:>w$}", w = widths[c])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = String::from("JCT, queue, rho and eff train columns: finished jobs only\n");
    out.push_str(&line(header.iter().map(|h| h.to_string()).collect()));
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    for r in results {
        let why = &r.summary.unfinished;
        if why.is_empty() {
            continue;
        }
        let parts: Vec<String> = why
            .iter()
            .map(|(w, n)| format!("{n} {}", w.as_str()))
            .collect();
        out.push_str(&format!(
            "{}: {} unfinished ({})\n",
            r.label,
            why.values().sum::<u32>(),
            parts.join(", ")
        ));
    }
    out
}

/// The columns of the jobs table, one row per job of each (policy, trace) replay: a job's
/// figures, then its JCT in parts
/// ([`optimizer::sim::JctAccount::NAMES`]; they add up to `jct_s`).
pub const JOB_COLUMNS: [&str; 34] = {
    const FIGURES: [&str; 22] = [
        "policy",
        "trace",
        "job",
        "application",
        "submit_s",
        "start_s",
        "finish_s",
        "jct_s",
        "queueing_s",
        "gpu_seconds",
        "restart_gpu_seconds",
        "rho",
        "unfinished",
        "restarts",
        "requested_gpus",
        "peak_gpus",
        "training_s",
        "effective_training",
        "stalled_gpu_seconds",
        "faults",
        "lost_training_s",
        "saving_gpu_seconds",
    ];
    let mut out = [""; 34];
    let mut i = 0;
    while i < out.len() {
        out[i] = if i < FIGURES.len() {
            FIGURES[i]
        } else {
            JctAccount::NAMES[i - FIGURES.len()]
        };
        i += 1;
    }
    out
};

/// A job's row of the jobs table.
pub(super) fn job_row(policy: &str, trace: &str, j: &JobRecord) -> Vec<Cell> {
    let text = |s: &str| Cell::Text(s.to_string());
    let mut row = vec![
        text(policy),
        text(trace),
        text(&j.name),
        text(&j.application),
        Cell::F64(Some(j.submit_s)),
        Cell::F64(j.start_s),
        Cell::F64(j.finish_s),
        Cell::F64(j.jct_s()),
        Cell::F64(j.queueing_s()),
        Cell::F64(Some(j.gpu_seconds)),
        Cell::F64(Some(j.restart_gpu_seconds)),
        Cell::F64(j.rho),
        text(j.unfinished.map_or("", |w| w.as_str())),
        Cell::U64(j.restarts as u64),
        Cell::U64(j.requested_replicas as u64),
        Cell::U64(j.peak_replicas as u64),
        Cell::F64(Some(j.training_s)),
        Cell::F64(j.effective_training()),
        Cell::F64(Some(j.stalled_gpu_seconds)),
        Cell::U64(j.faults as u64),
        Cell::F64(Some(j.lost_training_s)),
        Cell::F64(Some(j.saving_gpu_seconds)),
    ];
    let done = j.finish_s.is_some();
    row.extend(j.account.values().map(|v| Cell::F64(done.then_some(v))));
    row
}

/// The columns of the rounds table.
pub const ROUND_COLUMNS: [&str; 9] = [
    "policy",
    "trace",
    "time_s",
    "active_jobs",
    "queued_jobs",
    "gpus_used",
    "gpus_up",
    "changed_jobs",
    "decide_us",
];

/// A round's row of the rounds table.
pub(super) fn round_row(policy: &str, trace: &str, r: &RoundRecord) -> Vec<Cell> {
    vec![
        Cell::Text(policy.to_string()),
        Cell::Text(trace.to_string()),
        Cell::F64(Some(r.time_s)),
        Cell::U64(r.active_jobs as u64),
        Cell::U64(r.queued_jobs as u64),
        Cell::U64(r.gpus_used as u64),
        Cell::U64(r.gpus_up as u64),
        Cell::U64(r.changed_jobs as u64),
        Cell::U64(r.decide_us),
    ]
}

/// Writes `jobs.{parquet,csv}`, `rounds.{parquet,csv}` and `summary.{parquet,csv}` into `dir`.
pub fn write_outputs(dir: &Path, results: &[PolicyResult]) -> Result<Vec<PathBuf>, BrainError> {
    create_dir(dir)?;
    let mut written = Vec::new();
    let runs = || {
        results.iter().flat_map(|r| {
            r.runs
                .iter()
                .map(move |(t, rep)| (r.label.as_str(), t, rep))
        })
    };
    let jobs = runs().flat_map(|(p, t, rep)| rep.jobs.iter().map(move |j| job_row(p, t, j)));
    written.extend(write_table(&dir.join("jobs"), columns(&JOB_COLUMNS, jobs))?);
    let rounds = runs().flat_map(|(p, t, rep)| rep.rounds.iter().map(move |r| round_row(p, t, r)));
    written.extend(write_table(
        &dir.join("rounds"),
        columns(&ROUND_COLUMNS, rounds),
    )?);
    written.extend(write_summary(dir, results)?);
    Ok(written)
}

pub(super) fn create_dir(dir: &Path) -> Result<(), BrainError> {
    std::fs::create_dir_all(dir).map_err(|source| datasets::DatasetError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(())
}

/// Writes `summary.{parquet,csv}` into `dir`: one row per policy.
pub fn write_summary(dir: &Path, results: &[PolicyResult]) -> Result<Vec<PathBuf>, BrainError> {
    let mut written = Vec::new();
    let f = |g: &dyn Fn(&PolicyResult) -> f64| {
        Values::F64(results.iter().map(|r| Some(g(r))).collect())
    };
    written.extend(write_table(
        &dir.join("summary"),
        vec![
            (
                "policy",
                Values::Text(results.iter().map(|r| r.label.clone()).collect()),
            ),
            (
                "jobs",
                Values::U64(results.iter().map(|r| r.summary.jobs as u64).collect()),
            ),
            (
                "finished",
                Values::U64(results.iter().map(|r| r.summary.finished as u64).collect()),
            ),
            ("mean_jct_s", f(&|r| r.summary.mean_jct_s)),
            ("median_jct_s", f(&|r| r.summary.median_jct_s)),
            ("p99_jct_s", f(&|r| r.summary.p99_jct_s)),
            ("makespan_s", f(&|r| r.summary.makespan_s)),
            ("gpu_utilisation", f(&|r| r.summary.gpu_utilisation)),
            ("mean_queueing_s", f(&|r| r.summary.mean_queueing_s)),
            (
                "restarts",
                Values::U64(results.iter().map(|r| r.summary.restarts as u64).collect()),
            ),
            ("restart_gpu_share", f(&|r| r.summary.restart_gpu_share)),
            ("unfair_share", f(&|r| r.summary.unfair_share)),
            ("max_rho", f(&|r| r.summary.max_rho)),
            (
                "faults",
                Values::U64(results.iter().map(|r| r.summary.faults as u64).collect()),
            ),
            ("stalled_gpu_share", f(&|r| r.summary.stalled_gpu_share)),
            ("effective_training", f(&|r| r.summary.effective_training)),
            ("lost_training_s", f(&|r| r.summary.lost_training_s)),
            ("lost_per_fault_s", f(&|r| r.summary.lost_per_fault_s)),
            ("saving_gpu_share", f(&|r| r.summary.saving_gpu_share)),
            ("slowest_round_ms", f(&|r| r.max_decide_us as f64 / 1000.0)),
        ],
    )?);
    Ok(written)
}

/// How long each policy's slowest scheduling round took, on this machine.
pub fn render_timing(results: &[PolicyResult]) -> String {
    let parts: Vec<String> = results
        .iter()
        .map(|r| format!("{} {:.1} ms", r.label, r.max_decide_us as f64 / 1000.0))
        .collect();
    format!("slowest scheduling round: {}", parts.join(", "))
}
