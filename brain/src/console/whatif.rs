//! The console's what-if page: the operator picks one of the traces the brain's config names
//! (`[console.whatif] traces`) and the policy files to compare with the policy in force
//! (`policies`); the brain replays it with `brainctl whatif`'s code ([`crate::whatif`]) on the
//! configured simulated cluster, one replay at a time off the async threads, and shows the
//! table and the charts ([`crate::plots`]).

use std::path::PathBuf;

use maud::{Markup, PreEscaped, html};
use serde::{Deserialize, Serialize};

use super::pages;
use super::session::Session;
use crate::BrainError;
use crate::whatif::{self, NamedPolicy, TraceFormat};

/// `[console.whatif]` in the brain's config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhatifSettings {
    /// Trace files the page may replay (Pollux/Sia workload CSVs with their application
    /// profiles in a `traces/` folder beside or above them, or Philly job lists) [default: none:
    /// the page says how to name some].
    #[serde(default)]
    pub traces: Vec<PathBuf>,
    /// Policy files (with a `[scheduler]` table) offered beside the policy in force.
    #[serde(default)]
    pub policies: Vec<PathBuf>,
    /// The simulated cluster (`brainctl whatif --cluster`).
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// The most jobs a trace may have to be replayed from the page (a larger one is refused,
    /// naming `brainctl whatif`).
    #[serde(default = "default_max_jobs")]
    pub max_jobs: usize,
}

fn default_cluster() -> String {
    "16x4:t4".into()
}

fn default_max_jobs() -> usize {
    2_000
}

impl Default for WhatifSettings {
    fn default() -> Self {
        WhatifSettings {
            traces: Vec::new(),
            policies: Vec::new(),
            cluster: default_cluster(),
            max_jobs: default_max_jobs(),
        }
    }
}

impl WhatifSettings {
    /// Checked at the brain's start: the cluster parses, every file named is there.
    pub fn validate(&self) -> Result<(), BrainError> {
        optimizer::sim::ClusterSpec::parse(&self.cluster)
            .map_err(|e| BrainError::Config(format!("console.whatif.cluster: {e}")))?;
        for p in self.traces.iter().chain(&self.policies) {
            if !p.is_file() {
                return Err(BrainError::Config(format!(
                    "console.whatif: {} is not a file",
                    p.display()
                )));
            }
        }
        Ok(())
    }
}

/// What a replay from the page produced: the table, and each chart as SVG.
pub struct Comparison {
    pub table: String,
    pub charts: Vec<(String, String)>,
}

/// Replays trace `trace` (an index into the settings' traces) under the policy in force
/// (`in_force`) and the chosen policy files (indices); blocking: run it off the async threads.
pub fn compare(
    settings: &WhatifSettings,
    trace: usize,
    chosen: &[usize],
    in_force: NamedPolicy,
) -> Result<Comparison, BrainError> {
    let path = settings
        .traces
        .get(trace)
        .ok_or_else(|| BrainError::InvalidArgument(format!("no trace number {trace}")))?;
    let mut policies = vec![in_force];
    for &i in chosen {
        let file = settings
            .policies
            .get(i)
            .ok_or_else(|| BrainError::InvalidArgument(format!("no policy number {i}")))?;
        policies.push(whatif::load_policy(file, false)?);
    }
    let traces = whatif::load_traces(std::slice::from_ref(path), TraceFormat::Auto)?;
    let jobs: usize = traces.iter().map(|t| t.jobs.len()).sum();
    if jobs > settings.max_jobs {
        return Err(BrainError::InvalidArgument(format!(
            "{} has {jobs} jobs, more than the console replays ({}, console.whatif.max_jobs): \
             use `brainctl whatif --trace {}`",
            path.display(),
            settings.max_jobs,
            path.display()
        )));
    }
    let profiles = whatif::profiles_for(&traces, None)?;
    let cluster = optimizer::sim::ClusterSpec::parse(&settings.cluster)
        .map_err(|e| BrainError::Config(format!("console.whatif.cluster: {e}")))?;
    whatif::check_traces(
        &traces,
        &whatif::limits(&cluster, &profiles, datasets::limits::DEFAULT_HORIZON_S),
    )?;
    let options = whatif::Options {
        cluster,
        sim: optimizer::sim::SimConfig::default(),
        // One replay at a time: the brain's own work goes first.
        parallel: 1,
    };
    let results = whatif::run(&traces, &profiles, &policies, &options, &|_| {})?;
    let bound = whatif::bound(&traces, &profiles, &options)?;
    let dir = tempfile::tempdir()?;
    let charts = crate::plots::draw(dir.path(), &results)?
        .into_iter()
        .map(|f| {
            let name = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let svg = std::fs::read_to_string(&f).unwrap_or_default();
            (name, svg)
        })
        .collect();
    Ok(Comparison {
        table: format!(
            "{}\n{}\n{}",
            whatif::render_table(&results),
            whatif::render_bound(&results, &bound),
            whatif::render_account(&results, &bound)
        ),
        charts,
    })
}

/// The form (what can be replayed) and, after a replay, its table and charts or why it failed.
pub fn page(
    s: &Session,
    settings: &WhatifSettings,
    in_force: &str,
    outcome: Option<Result<Comparison, String>>,
) -> Markup {
    let name = |p: &PathBuf| p.display().to_string();
    let body = html! {
        @if settings.traces.is_empty() {
            p { "No trace to replay: name some in the brain's config, e.g." }
            pre { "[console.whatif]\ntraces = [\"datasets/data/pollux/workloads/workload-1.csv\"]\n\
                   policies = [\"examples/policies/pollux.toml\", \"examples/policies/tiresias.toml\"]\n\
                   cluster = \"16x4:t4\"" }
        } @else {
            form method="post" action="/console/whatif" id="whatif" {
                input type="hidden" name="csrf" value=(s.csrf);
                p { label { "trace " select name="trace" id="trace" {
                    @for (i, t) in settings.traces.iter().enumerate() {
                        option value=(i) { (name(t)) }
                    }
                } } }
                p { "on the simulated cluster " code { (settings.cluster) } ", under the policy "
                    (in_force) " and:" }
                @for (i, p) in settings.policies.iter().enumerate() {
                    label { input type="checkbox" name="policy" value=(i) checked; " " (name(p)) } br;
                }
                button type="submit" id="whatif-submit" { "Replay" }
            }
        }
        @match outcome {
            Some(Ok(c)) => {
                h2 { "Side by side" }
                pre id="whatif-table" { (c.table) }
                @for (file, svg) in &c.charts {
                    h3 { (file) }
                    div class="chart" { (PreEscaped(svg)) }
                }
            }
            Some(Err(why)) => { p.error id="error" { (why) } }
            None => {}
        }
    };
    pages::layout("What-if", Some(s), None, body)
}
