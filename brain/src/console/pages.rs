//! The console's pages as HTML (maud escapes every value it splices in). No script: pages
//! that change by themselves reload with a `refresh` meta tag, and every change is a form
//! POSTed with the session's CSRF token.

use std::collections::BTreeMap;

use maud::{DOCTYPE, Markup, PreEscaped, html};
use proto::service::v1 as pb;

use super::session::Session;
use crate::auth::Caller;

/// Seconds between reloads of the pages that follow a running cluster.
pub const REFRESH_S: u32 = 5;

const STYLE: &str = "body{font-family:sans-serif;margin:0;color:#222}\
header{background:#233;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}\
header a{color:#fff}header form{margin-left:auto}main{padding:8px 16px}\
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\
pre{background:#f6f6f6;padding:8px;max-height:420px;overflow:auto;white-space:pre-wrap}\
.notice{background:#eef6ee;border:1px solid #9c9;padding:6px}.error{background:#fbeaea;border:1px solid #c99;padding:6px}\
form.inline{display:inline}";

/// A whole page: `title`, the session's header (when signed in) and `body`; with `refresh`,
/// the page reloads `refresh.1` every `refresh.0` seconds.
pub fn layout(
    title: &str,
    session: Option<&Session>,
    refresh: Option<(u32, &str)>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · Brain" }
                @if let Some((s, url)) = refresh {
                    meta http-equiv="refresh" content=(format!("{s}; url={url}"));
                }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    strong { "Brain" }
                    @if let Some(s) = session {
                        @if !matches!(s.caller, Caller::Job(_) | Caller::Owner(_)) {
                            a href="/console" { "Cluster and jobs" }
                            a href="/console/policy" { "Policy and next round" }
                            a href="/console/whatif" { "What-if" }
                        }
                        span id="who" { "signed in as " (s.who()) }
                        form method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            button type="submit" id="sign-out" { "Sign out" }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// The sign-in form, with why the last try failed.
pub fn login(failed: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        None,
        html! {
            @if let Some(why) = failed { p.error id="error" { (why) } }
            p { "The operator signs in with the operator token (" code { "operator.token" }
                " beside the brain's database); a job's owner with the job's credential with the \
                 brain (" code { "brain.token" } " in the job's run directory, which the operator \
                 hands over), which shows that job only." }
            form method="post" action="/console/login" {
                label { "Token " input type="password" name="token" id="token" autofocus; }
                " " button type="submit" id="sign-in" { "Sign in" }
            }
        },
    )
}

/// A page that says what went wrong.
pub fn error(session: Option<&Session>, message: &str) -> Markup {
    layout(
        "Not possible",
        session,
        None,
        html! {
            p.error id="error" { (message) }
            p { a href="/console" { "Back to the console" } }
        },
    )
}

/// A job's training group (the role the brain sizes by its speed), if its shape names one.
pub fn training(s: &pb::JobShape) -> Option<&pb::RoleShape> {
    s.roles.iter().find(|r| r.training)
}

/// The role name of a job's training group: `worker`, or its all-reduce group's own name.
pub fn trainer(s: &pb::JobShape) -> &str {
    training(s).map_or("worker", |t| t.role.as_str())
}

/// The processes of `role` the job's shape counts now (0: none, or no such role).
pub fn count_of(s: &pb::JobShape, role: &str) -> u32 {
    s.roles
        .iter()
        .find(|r| r.role == role)
        .map_or(0, |r| r.count)
}

/// The sizes of a job's role groups, e.g. `worker 3 [1, 4], ps 1, rollout 2 [1, 4]`: the
/// training group first, a ps job's parameter servers without bounds.
pub fn sizes(shape: Option<&pb::JobShape>) -> String {
    let Some(s) = shape else {
        return String::new();
    };
    let ps = |r: &pb::RoleShape| s.kind == "ps" && r.role == "ps";
    s.roles
        .iter()
        .filter(|r| !ps(r) || r.count > 0)
        .map(|r| match ps(r) {
            true => format!("ps {}", r.count),
            false => format!("{} {} [{}, {}]", r.role, r.count, r.min, r.max),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// GPUs by model: the nodes', and those the running jobs' processes hold (thousandths).
fn gpus_by_type(
    jobs: &[pb::JobRecord],
    nodes: &[pb::NodeState],
) -> BTreeMap<String, (u32, u32, u64)> {
    let mut by: BTreeMap<String, (u32, u32, u64)> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.gpus > 0) {
        let e = by.entry(n.gpu_type.clone()).or_default();
        e.0 += 1;
        e.1 += n.gpus;
    }
    for j in jobs.iter().filter(|j| j.state == "running") {
        let Some(s) = &j.shape else { continue };
        let mut held = |r: Option<&proto::jobmaster::v1::Resources>, n: u32| {
            if let Some(r) = r.filter(|r| r.gpu_milli > 0) {
                let model = if r.gpu_type.is_empty() {
                    "any".to_string()
                } else {
                    r.gpu_type.clone()
                };
                by.entry(model).or_default().2 += u64::from(r.gpu_milli) * u64::from(n);
            }
        };
        for r in s.roles.iter().filter(|r| !r.shares_worker_devices) {
            held(r.resources.as_ref(), r.count);
        }
    }
    by
}

/// The cluster and its jobs (the operator's front page).
pub fn overview(
    s: &Session,
    jobs: &[pb::JobRecord],
    nodes: &[pb::NodeState],
    cluster: &optimizer::live::LiveCluster,
) -> Markup {
    let gpus = gpus_by_type(jobs, nodes);
    let body = html! {
        h2 { "Capacity" }
        p id="capacity" {
            (format!("{:.1}", cluster.cpu_millicores as f64 / 1000.0)) " CPUs for jobs, at most "
            (cluster.max_processes) " processes."
        }
        @if !gpus.is_empty() {
            table id="gpus" {
                tr { th { "GPU model" } th { "nodes" } th { "GPUs" } th { "held by running jobs" } }
                @for (model, (nodes, total, held)) in &gpus {
                    tr { td { (model) } td { (nodes) } td { (total) }
                         td { (format!("{:.1}", *held as f64 / 1000.0)) } }
                }
            }
        }
        h2 { "Nodes" }
        table id="nodes" {
            tr { th { "node" } th { "CPUs" } th { "GPUs" } th { "state" } th { "why" } }
            @for n in nodes {
                tr {
                    td { (n.name) }
                    td { (format!("{:.1}", n.cpu_millicores as f64 / 1000.0)) }
                    td { (n.gpus) " " (n.gpu_type) }
                    td { (n.state) }
                    td { (n.reason) @for st in &n.stragglers { br; "straggler: " (st) } }
                }
            }
        }
        h2 { "Jobs" }
        @if jobs.is_empty() { p { "No job yet: " code { "brainctl submit JOB.yaml" } } }
        @else {
            table id="jobs" {
                tr { th { "job" } th { "state" } th { "roles and sizes" } th { "samples/s (30 s)" }
                     th { "GPU %" } th { "why it waits / how it ended" } }
                @for j in jobs {
                    tr {
                        td { a href=(format!("/console/jobs/{}", j.job_id)) { (j.job_name) } }
                        td { (j.state) }
                        td { (sizes(j.shape.as_ref())) }
                        td { (format!("{:.1}", j.recent_samples_per_second)) }
                        td { (format!("{:.0}", j.gpu_utilisation_pct)) }
                        td { (j.waiting_reason) (j.outcome) }
                    }
                }
            }
        }
    };
    layout(
        "Cluster and jobs",
        Some(s),
        Some((REFRESH_S, "/console")),
        body,
    )
}

/// What a job's page shows besides its record.
pub struct JobView<'a> {
    pub job: &'a pb::JobRecord,
    /// The timeline chart (SVG), empty while there are too few points.
    pub chart: &'a str,
    pub events: &'a str,
    pub processes: &'a [String],
    pub process: &'a str,
    /// The process's newest output (its file and last lines), or why there is none.
    pub logs: Result<(String, String), String>,
    /// What the brain answered to the form just sent: (ok, text).
    pub notice: Option<(bool, String)>,
}

/// One job: its sizes, timeline, plans and reasons, events, output; scale and cancel.
pub fn job(s: &Session, v: &JobView<'_>) -> Markup {
    let j = v.job;
    let url = format!("/console/jobs/{}", j.job_id);
    // Whoever may see the page (the operator, the job's owner) may scale and cancel the job.
    let running = j.state == "running";
    let body = html! {
        @if let Some((ok, text)) = &v.notice {
            pre class=(if *ok { "notice" } else { "error" }) id="notice" { (text) }
        }
        table id="record" {
            tr { th { "state" } td id="state" { (j.state) } }
            tr { th { "roles and sizes" } td id="sizes" { (sizes(j.shape.as_ref())) } }
            tr { th { "samples/s (last 30 s)" } td { (format!("{:.1}", j.recent_samples_per_second)) } }
            tr { th { "samples done" } td { (j.samples_done) } }
            tr { th { "plans reached" } td id="reached" { (j.reached_version) " of " (j.plan_version) } }
            tr { th { "GPU" } td { (format!("{:.0} %, {} MiB", j.gpu_utilisation_pct, j.gpu_memory_bytes >> 20)) } }
            @if !j.waiting_reason.is_empty() { tr { th { "why it waits" } td { (j.waiting_reason) } } }
            @if !j.outcome.is_empty() { tr { th { "outcome" } td { (j.outcome) } } }
            @if !j.reasons.is_empty() { tr { th { "why this size" } td { (j.reasons.join("; ")) } } }
            tr { th { "run directory" } td { (j.run_dir) } }
        }
        @if running {
            form method="post" action=(format!("{url}/scale")) id="scale" {
                input type="hidden" name="csrf" value=(s.csrf);
                @let trainer = j.shape.as_ref().map_or("worker", trainer);
                input type="hidden" name="training_role" value=(trainer);
                label { (trainer) " " input type="number" name="workers" min="0" id="workers"; }
                @if j.shape.as_ref().is_some_and(|s| count_of(s, "ps") > 0) {
                    " " label { "ps " input type="number" name="ps" min="0"; }
                }
                " " label { input type="checkbox" name="force" value="1"; " even if the next round would undo it" }
                " " button type="submit" id="scale-submit" { "Scale" }
            }
        }
        @if matches!(j.state.as_str(), "running" | "queued") {
            form method="post" action=(format!("{url}/cancel")) id="cancel" {
                input type="hidden" name="csrf" value=(s.csrf);
                button type="submit" id="cancel-submit" { "Cancel the job" }
            }
        }
        h2 { "Timeline" }
        @if v.chart.is_empty() { p { "Not enough reports yet." } }
        @else {
            div id="timeline" { (PreEscaped(v.chart)) }
            p { "Workers (blue), samples/s (green); an orange line is a plan the brain made." }
        }
        h2 { "Plans" }
        @if j.plans.is_empty() { p { "None yet." } }
        @else {
            table id="plans" {
                tr { th { "version" } th { "made (unix ms)" } th { "why" } th { "its job master's answer" } }
                @for p in &j.plans {
                    tr { td { (p.version) } td { (p.created_unix_ms) } td { (p.reason) }
                         td { @if p.answer.is_empty() { "not yet" } @else { (p.answer) } } }
                }
            }
        }
        h2 { "Events" }
        pre id="events" { (v.events) }
        h2 { "Output" }
        @if !v.processes.is_empty() {
            p { @for p in v.processes {
                @if p == v.process { strong { (p) } } @else { a href=(format!("{url}?process={p}")) { (p) } }
                " "
            } }
        }
        @match &v.logs {
            Ok((path, text)) => { p { "last lines of " code { (path) } } pre id="logs" { (text) } }
            Err(why) => { p id="logs" { (why) } }
        }
    };
    let refresh_url = format!("{url}?process={}", v.process);
    layout(
        &format!("Job {}", j.job_name),
        Some(s),
        running.then_some((REFRESH_S, refresh_url.as_str())),
        body,
    )
}

/// The policy in force and what the next round would decide with it.
pub fn policy(s: &Session, source: &str, text: &str, dry: &pb::DryRunResponse) -> Markup {
    let body = html! {
        h2 { "Policy in force" }
        p { (source) }
        pre id="policy" { @if text.trim().is_empty() { "(the defaults)" } @else { (text) } }
        h2 { "The next round, dry run" }
        p id="round" {
            "scheduler " (dry.scheduler) ": "
            (format!("{:.1} of {:.1} CPUs, {} of {} processes after the round (solved in {:.2} ms)",
                dry.cpu_millicores as f64 / 1000.0, dry.capacity_millicores as f64 / 1000.0,
                dry.processes, dry.max_processes, dry.solve_ms))
        }
        @for n in &dry.notes { p { "note: " (n) } }
        table id="decisions" {
            tr { th { "job" } th { "state" } th { "roles" } th { "predicted samples/s" } th { "why" } }
            @for d in &dry.decisions {
                tr {
                    td { a href=(format!("/console/jobs/{}", d.job_id)) { (d.job_name) } }
                    td { (d.state) }
                    td { (d.roles.iter().map(|c| format!("{} {} → {}", c.role, c.from, c.to)).collect::<Vec<_>>().join(", ")) }
                    td { (format!("{:.1}", d.predicted_samples_per_second)) }
                    td { (d.reasons.join("; ")) }
                }
            }
        }
    };
    layout("Policy and next round", Some(s), None, body)
}
