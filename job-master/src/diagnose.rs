//! A job's diagnosis: what went wrong and what it cost, from its persisted context (and its
//! report, once it ended). What `job-master diagnose RUN_DIR` prints; and its events alone
//! ([`events`], `job-master events RUN_DIR`).
//!
//! After its effective training time, the work each group restart threw away (steps and
//! training since the checkpoint it went back to). The timeline holds the events that are about
//! trouble or change (faults, group restarts, plans, checkpoints, stragglers, hangs, nodes),
//! with the first and the last event; the hangs come with the stacks captured; then the
//! stragglers flagged now and the nodes the job avoids.

use std::fmt::Write;

use crate::job::{EventKind, JobContext};
use vocab::report::JobReport;

/// The diagnosis of the job in `ctx` (its `report` when it has ended), every event with `all`.
pub fn diagnosis(ctx: &JobContext, report: Option<&JobReport>, all: bool) -> String {
    let mut out = String::new();
    let (phase, reason) = match report {
        Some(r) => (r.phase.to_string(), r.reason.clone()),
        None => (
            ctx.phase.name().to_string(),
            ctx.phase.reason().map(str::to_string),
        ),
    };
    let _ = writeln!(
        out,
        "job {} ({}): {phase}{}",
        ctx.spec.name,
        ctx.spec.kind,
        reason.map(|r| format!(": {r}")).unwrap_or_default()
    );
    let e = report
        .and_then(|r| r.effective_training.clone())
        .unwrap_or_else(|| ctx.effective_training(ctx.clock_ms()));
    let _ = writeln!(
        out,
        "effective training time: {:.1} % of {:.1} s ({:.1} s trained and kept, {:.1} s thrown away by restarts)",
        100.0 * e.share,
        e.wall_ms as f64 / 1000.0,
        e.training_ms as f64 / 1000.0,
        e.lost_ms as f64 / 1000.0
    );
    let restarts: Vec<String> = ctx
        .roles
        .restarts()
        .iter()
        .map(|(role, n)| format!("{role} {n}"))
        .collect();
    let _ = writeln!(
        out,
        "relaunches: {}; checkpoints: {}; plans reached: {}",
        listed(&restarts, ", "),
        ctx.committed_checkpoints(),
        ctx.transitions.len()
    );
    lost(&mut out, ctx);
    precheck(&mut out, ctx);
    timeline(&mut out, ctx, all);
    hangs(&mut out, ctx);
    let stragglers: Vec<String> = ctx
        .stability
        .stragglers
        .iter()
        .map(|(k, s)| {
            format!(
                "{k} on {} ({:.1} ms a step, {:.2}x the median)",
                s.host,
                s.step_ms,
                s.ratio()
            )
        })
        .collect();
    let _ = writeln!(out, "stragglers now: {}", listed(&stragglers, "; "));
    let avoided: Vec<String> = ctx
        .stability
        .avoided
        .iter()
        .map(|(n, why)| format!("{n} ({why})"))
        .collect();
    let _ = writeln!(out, "nodes this job avoids: {}", listed(&avoided, "; "));
    out
}

/// The work each group restart threw away: the steps and training since the checkpoint it
/// went back to.
fn lost(out: &mut String, ctx: &JobContext) {
    let losses = &ctx.training_time.losses;
    let steps: u64 = losses.iter().map(|l| l.steps).sum();
    let ms: u64 = losses.iter().map(|l| l.ms).sum();
    let _ = writeln!(
        out,
        "work lost to restarts: {} restart(s), {steps} steps, {:.1} s of training",
        losses.len(),
        ms as f64 / 1000.0
    );
    for l in losses {
        let _ = writeln!(
            out,
            "  at {:.3} s: {}; {}",
            l.at_ms as f64 / 1000.0,
            l.why,
            l.describe()
        );
    }
}

/// `items` joined by `sep`, or `none`.
fn listed(items: &[String], sep: &str) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(sep)
    }
}

/// Every event of the job, one line each: seconds since its start, kind, text (what
/// `job-master events` and `brainctl events` print).
pub fn events(ctx: &JobContext) -> String {
    let mut out = String::new();
    for e in &ctx.events {
        let _ = writeln!(out, "{}", event_line(e));
    }
    out
}

/// One event as a line: seconds since the job's start, kind, text.
fn event_line(e: &crate::job::Event) -> String {
    format!(
        "{:>9.3} s  {:<10}  {}",
        e.at_ms as f64 / 1000.0,
        e.kind.as_str(),
        e.text
    )
}

fn timeline(out: &mut String, ctx: &JobContext, all: bool) {
    let _ = writeln!(
        out,
        "timeline ({}):",
        if all {
            "every event"
        } else {
            "faults, restarts, plans, checkpoints, stragglers, hangs, nodes; --all for every event"
        }
    );
    let last = ctx.events.len().saturating_sub(1);
    for (i, e) in ctx.events.iter().enumerate() {
        if all || e.kind != EventKind::Info || i == 0 || i == last {
            let _ = writeln!(out, "  {}", event_line(e));
        }
    }
}

/// The pre-run check, node by node, when the job ran one.
fn precheck(out: &mut String, ctx: &JobContext) {
    let Some(check) = &ctx.stability.precheck else {
        return;
    };
    let _ = writeln!(
        out,
        "pre-run check: {} node(s) in {:.1} s",
        check.nodes.len(),
        check.elapsed_ms as f64 / 1000.0
    );
    for n in &check.nodes {
        let rounds: Vec<String> = n
            .rounds
            .iter()
            .map(|r| match r.allreduce_ms {
                Some(ms) => format!("r{} {ms:.1} ms", r.round),
                None => format!("r{} failed", r.round),
            })
            .collect();
        let matmul = n
            .matmul_ms
            .map_or_else(|| "failed".to_string(), |ms| format!("{ms:.1} ms"));
        let _ = writeln!(
            out,
            "  {:<16} {:<9}  matmul {matmul}; all-reduce {}{}",
            n.node,
            n.health.as_str(),
            listed(&rounds, ", "),
            if n.why.is_empty() {
                String::new()
            } else {
                format!("\n      {}", n.why)
            }
        );
    }
}

fn hangs(out: &mut String, ctx: &JobContext) {
    let _ = writeln!(out, "hangs: {}", ctx.stability.hangs.len());
    for h in &ctx.stability.hangs {
        let _ = writeln!(out, "  at {:.3} s: {}", h.at_ms as f64 / 1000.0, h.why);
        if h.stacks.is_empty() {
            let _ = writeln!(out, "    (no stacks kept)");
        }
        for (process, text) in &h.stacks {
            let _ = writeln!(out, "    {process}:");
            for line in text.lines() {
                let _ = writeln!(out, "      {line}");
            }
        }
    }
}
