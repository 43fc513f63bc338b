//! The offline plan of the what-if ([`optimizer::sim::offline`]): on small traces, the best
//! schedule that never resizes a job, found with every arrival known, replayed; set beside the
//! lower bound and the policies so that each policy's distance to the bound splits into
//! "policy vs the plan" and "the plan vs the bound".

use std::path::{Path, PathBuf};

use datasets::export::{Values, write_table};
use optimizer::sim::AppProfile;
use optimizer::sim::offline::{Offline, OfflineOptions, offline_plan};

use super::{BoundRow, NamedTrace, Options, PolicyResult};
use crate::BrainError;

/// The offline plans of the traces replayed, pooled as the table pools the policies (mean JCT
/// over the jobs of every trace).
#[derive(Clone, Debug, PartialEq)]
pub struct OfflineRow {
    pub jobs: usize,
    pub slot_s: f64,
    /// Variables of the models, all traces together.
    pub variables: usize,
    /// Whether every trace's model was also solved exactly.
    pub exact: bool,
    /// The models' LP relaxation: no plan of the model does better.
    pub relaxation_mean_jct_s: f64,
    /// The best plan's mean JCT in the model, and replayed.
    pub model_mean_jct_s: f64,
    pub mean_jct_s: f64,
    pub p99_jct_s: f64,
    pub makespan_s: f64,
}

/// The offline plan of each trace on the options' cluster; a trace whose model is too large
/// is refused with its size.
pub fn offline(
    traces: &[NamedTrace],
    profiles: &[AppProfile],
    options: &Options,
    offline_options: &OfflineOptions,
) -> Result<OfflineRow, BrainError> {
    let mut jcts = Vec::new();
    let (mut variables, mut exact) = (0, true);
    let (mut relaxed, mut model, mut makespan) = (0.0, 0.0, 0.0f64);
    for t in traces {
        let o: Offline = offline_plan(
            &t.jobs,
            profiles,
            &options.cluster,
            &options.sim,
            offline_options,
        )
        .map_err(|error| BrainError::Simulation {
            trace: t.name.clone(),
            policy: "the offline plan".into(),
            error,
        })?;
        let n = t.jobs.len() as f64;
        variables += o.variables;
        exact &= o.exact.is_some();
        relaxed += o.relaxation_mean_jct_s * n;
        let (plan, report) = match &o.exact {
            Some((p, r)) if r.summary.mean_jct_s < o.rounded_replay.summary.mean_jct_s => (p, r),
            _ => (&o.rounded, &o.rounded_replay),
        };
        model += plan.model_mean_jct_s * n;
        makespan = makespan.max(report.summary.makespan_s);
        jcts.extend(report.jobs.iter().filter_map(|j| j.jct_s()));
    }
    let n = jcts.len().max(1) as f64;
    let mean = jcts.iter().sum::<f64>() / n;
    jcts.sort_by(f64::total_cmp);
    Ok(OfflineRow {
        jobs: jcts.len(),
        slot_s: offline_options.slot_s,
        variables,
        exact,
        relaxation_mean_jct_s: relaxed / n,
        model_mean_jct_s: model / n,
        mean_jct_s: mean,
        p99_jct_s: optimizer::sim::report::quantile(&jcts, 0.99),
        makespan_s: makespan,
    })
}

/// The plan's lines and each policy's distance to the bound split at the plan, for the
/// terminal.
pub fn render_offline(results: &[PolicyResult], b: &BoundRow, o: &OfflineRow) -> String {
    let mut out = format!(
        "offline plan (every arrival known, never resized, slots of {:.0} s, {} variables, {}): \
         mean JCT {:.0} s replayed ({:.0} s in the model, whose relaxation is {:.0} s), p99 JCT \
         {:.0} s, makespan {:.0} s\n",
        o.slot_s,
        o.variables,
        if o.exact {
            "solved exactly"
        } else {
            "the relaxation rounded"
        },
        o.mean_jct_s,
        o.model_mean_jct_s,
        o.relaxation_mean_jct_s,
        o.p99_jct_s,
        o.makespan_s
    );
    let width = super::bound::label_width(results, 14);
    out.push_str(&format!(
        "{:<width$}  {:>12}  {:>12}  {:>12}\n",
        "mean JCT", "over bound", "over plan", "plan/bound"
    ));
    let split = o.mean_jct_s / b.mean_jct_s;
    for r in results {
        let m = r.summary.mean_jct_s;
        let done = r.summary.finished as usize == b.jobs;
        let cell = |v: f64| {
            if done { format!("{v:.2}x") } else { "-".into() }
        };
        out.push_str(&format!(
            "{:<width$}  {:>12}  {:>12}  {:>12}\n",
            r.label,
            cell(m / b.mean_jct_s),
            cell(m / o.mean_jct_s),
            format!("{split:.2}x"),
        ));
    }
    out
}

/// Writes `offline.{parquet,csv}` into `dir`: the plan's figures, replayed and in the model,
/// with the bound's beside them.
pub fn write_offline(dir: &Path, b: &BoundRow, o: &OfflineRow) -> Result<Vec<PathBuf>, BrainError> {
    let f = |v: f64| Values::F64(vec![Some(v)]);
    Ok(write_table(
        &dir.join("offline"),
        vec![
            ("jobs", Values::U64(vec![o.jobs as u64])),
            ("slot_s", f(o.slot_s)),
            ("variables", Values::U64(vec![o.variables as u64])),
            ("exact", Values::Text(vec![o.exact.to_string()])),
            ("relaxation_mean_jct_s", f(o.relaxation_mean_jct_s)),
            ("model_mean_jct_s", f(o.model_mean_jct_s)),
            ("mean_jct_s", f(o.mean_jct_s)),
            ("p99_jct_s", f(o.p99_jct_s)),
            ("makespan_s", f(o.makespan_s)),
            ("bound_mean_jct_s", f(b.mean_jct_s)),
            ("mean_jct_over_bound", f(o.mean_jct_s / b.mean_jct_s)),
        ],
    )?
    .into_iter()
    .collect())
}
