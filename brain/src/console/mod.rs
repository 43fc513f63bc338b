//! The web console the brain serves under `/console`, on its own address and TLS: the nodes
//! and capacity by GPU model, the jobs with their role groups and sizes, a job's timeline
//! (sizes and speed over time, plans and their reasons), its events and output, the policy in
//! force with the next round's dry run; scale and cancel.
//!
//! * [`session`]: sign-in with the operator token or a job owner's token, the session cookie
//!   (HttpOnly, SameSite=Strict) and each session's CSRF token.
//! * [`pages`]: the markup, rendered on the server (no script, no build chain).
//! * [`chart`]: a job's timeline as SVG.
//! * [`whatif`]: the what-if page: a configured trace replayed under the policy in force and
//!   chosen policy files, with `brainctl whatif`'s code, table and charts.
//!
//! The handlers here are thin: each calls the brain's own gRPC handlers ([`BrainService`])
//! in-process, as the session's caller, so the console can do exactly what that caller could
//! with `brainctl`, refused with the same messages. Nothing is readable without a session
//! (a request without one is sent to sign in); a job's secret shows that job only; every
//! change is a POST carrying the session's CSRF token, and one a browser marks cross-site is
//! refused.

pub mod chart;
pub mod pages;
pub mod session;
pub mod whatif;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use optimizer::schedule::Scheduler;
use proto::service::v1 as pb;
use proto::service::v1::brain_server::Brain;
use serde::Deserialize;

use crate::auth::{Caller, Keys};
use crate::control::Control;
use crate::service::BrainService;
use crate::store::JobId;
use session::{Session, Sessions};

/// The most of a process's output a job page shows (its end).
const LOG_TAIL_BYTES: u64 = 32 << 10;
/// The most timeline points a chart draws.
const TIMELINE_POINTS: usize = 2_000;

pub struct Console {
    api: BrainService,
    control: Arc<Control>,
    keys: Arc<Keys>,
    /// The API's rate limits: every page's calls count as the API's do, and sign-ins per
    /// address.
    throttle: Arc<crate::throttle::Throttle>,
    sessions: Sessions,
    /// Served under TLS: the cookie says `Secure`.
    secure: bool,
    whatif: whatif::WhatifSettings,
    /// One what-if replay at a time.
    replaying: tokio::sync::Mutex<()>,
}

impl Console {
    pub fn new(
        api: BrainService,
        control: Arc<Control>,
        keys: Arc<Keys>,
        throttle: Arc<crate::throttle::Throttle>,
        secure: bool,
        whatif: whatif::WhatifSettings,
    ) -> Self {
        Console {
            api,
            control,
            keys,
            throttle,
            sessions: Sessions::default(),
            secure,
            whatif,
            replaying: tokio::sync::Mutex::new(()),
        }
    }

    /// The session of a page's request, its call counted against the caller's rate as an
    /// API call is; else the answer (sent to sign in, or too many calls).
    fn session(&self, headers: &HeaderMap) -> Result<Session, Box<Response>> {
        let Some(s) = self.sessions.get(headers) else {
            return Err(Box::new(to_sign_in()));
        };
        if let Err(e) = self.throttle.call(&as_caller(s.caller, ())) {
            return Err(Box::new(refused(Some(&s), &e)));
        }
        Ok(s)
    }
}

/// The console's routes, for the brain's HTTP router.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/console", get(overview))
        .route("/console/", get(overview))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/policy", get(policy))
        .route("/console/whatif", get(whatif_page).post(whatif_replay))
        .route("/console/jobs/{id}", get(job))
        .route("/console/jobs/{id}/scale", post(scale))
        .route("/console/jobs/{id}/cancel", post(cancel))
        .with_state(console)
        .layer(axum::middleware::map_response(guarded))
        .layer(axum::middleware::map_request(with_host))
}

/// An HTTP/2 request names its host in the URI (`:authority`), not in a `Host` header: put it
/// there, so that [`session::same_origin`] reads one place whatever the version.
async fn with_host(mut request: axum::extract::Request) -> axum::extract::Request {
    if !request.headers().contains_key(header::HOST)
        && let Some(v) = request
            .uri()
            .authority()
            .and_then(|a| header::HeaderValue::from_str(a.as_str()).ok())
    {
        request.headers_mut().insert(header::HOST, v);
    }
    request
}

/// What every console answer says to the browser: never framed (`X-Frame-Options`, the CSP's
/// `frame-ancestors`), nothing loaded or run but the page's own (no script at all), forms
/// posted to the console only, no type sniffing, no referrer to other sites.
async fn guarded(mut response: Response) -> Response {
    let h = response.headers_mut();
    let set = [
        ("x-frame-options", "DENY"),
        (
            "content-security-policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
    ];
    for (name, value) in set {
        h.insert(name, header::HeaderValue::from_static(value));
    }
    response
}

/// A request of the brain's API made as `caller`.
fn as_caller<T>(caller: Caller, message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.extensions_mut().insert(caller);
    r
}

fn to_sign_in() -> Response {
    Redirect::to("/console/login").into_response()
}

/// The page for a refusal or failure of the brain's API, with its HTTP status.
fn refused(session: Option<&Session>, status: &tonic::Status) -> Response {
    use tonic::Code;
    let code = match status.code() {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::InvalidArgument | Code::FailedPrecondition | Code::AlreadyExists => {
            StatusCode::BAD_REQUEST
        }
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (
        code,
        Html(pages::error(session, status.message()).into_string()),
    )
        .into_response()
}

async fn login_page(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    if c.sessions.get(&headers).is_some() {
        return Redirect::to("/console").into_response();
    }
    Html(pages::login(None).into_string()).into_response()
}

#[derive(Deserialize)]
struct SignIn {
    token: String,
}

async fn login(
    State(c): State<Arc<Console>>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    Form(form): Form<SignIn>,
) -> Response {
    if session::cross_site(&headers) || !session::same_origin(&headers) {
        return (StatusCode::FORBIDDEN, "a sign-in from another site").into_response();
    }
    let address = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
        .map(|a| a.ip());
    if let Err(e) = c.throttle.sign_in(address) {
        let page = pages::login(Some(e.message()));
        return (StatusCode::TOO_MANY_REQUESTS, Html(page.into_string())).into_response();
    }
    let caller = match c.keys.caller(Some(form.token.trim())) {
        Ok(caller) => caller,
        Err(_) => {
            c.control.metrics.sign_in_failures.inc();
            let from = address.map_or_else(|| "an unknown address".into(), |a| a.to_string());
            tracing::warn!(from = %from, "console sign-in with a token this brain did not give");
            let page = pages::login(Some(
                "That token is not one this brain gave: the operator token, or a job \
                 owner's token (NAME.owner.token, kept by brainctl submit).",
            ));
            return (StatusCode::UNAUTHORIZED, Html(page.into_string())).into_response();
        }
    };
    if let Caller::Job(j) = caller {
        // A process's credential is never a person's: the master's secret stays the master's.
        c.control.metrics.sign_in_failures.inc();
        tracing::warn!(job = %j, "console sign-in with a job master's secret, refused");
        let page = pages::login(Some(
            "That is a job master's secret, which signs in nowhere: a job's owner signs in \
             with the owner's token brainctl submit kept for them (NAME.owner.token).",
        ));
        return (StatusCode::FORBIDDEN, Html(page.into_string())).into_response();
    }
    let (cookie, _) = c.sessions.sign_in(caller, c.secure);
    let to = match caller {
        Caller::Owner(j) => format!("/console/jobs/{}", j.0),
        _ => "/console".into(),
    };
    ([(header::SET_COOKIE, cookie)], Redirect::to(&to)).into_response()
}

#[derive(Deserialize)]
struct Csrf {
    #[serde(default)]
    csrf: String,
}

/// The session of a POST whose CSRF token is the session's; else the answer to give.
fn posted(c: &Console, headers: &HeaderMap, csrf: &str) -> Result<Session, Box<Response>> {
    let s = c.session(headers)?;
    if session::cross_site(headers) || !session::same_origin(headers) || !s.csrf_matches(csrf) {
        let page = pages::error(
            Some(&s),
            "This form did not come from this console (its origin, or its CSRF token, is \
             missing or wrong): nothing changed.",
        );
        return Err(Box::new(
            (StatusCode::FORBIDDEN, Html(page.into_string())).into_response(),
        ));
    }
    Ok(s)
}

async fn logout(
    State(c): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<Csrf>,
) -> Response {
    if let Err(answer) = posted(&c, &headers, &form.csrf) {
        return *answer;
    }
    let cookie = c.sessions.sign_out(&headers, c.secure);
    (
        [(header::SET_COOKIE, cookie)],
        Redirect::to("/console/login"),
    )
        .into_response()
}

async fn overview(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let s = match c.session(&headers) {
        Ok(s) => s,
        Err(answer) => return *answer,
    };
    if let Caller::Owner(j) | Caller::Job(j) = s.caller {
        return Redirect::to(&format!("/console/jobs/{}", j.0)).into_response();
    }
    let jobs = match c
        .api
        .list_jobs(as_caller(s.caller, pb::ListJobsRequest {}))
        .await
    {
        Ok(r) => r.into_inner().jobs,
        Err(e) => return refused(Some(&s), &e),
    };
    let nodes = match c
        .api
        .list_nodes(as_caller(s.caller, pb::ListNodesRequest {}))
        .await
    {
        Ok(r) => r.into_inner().nodes,
        Err(e) => return refused(Some(&s), &e),
    };
    let page = pages::overview(&s, &jobs, &nodes, &c.control.cluster());
    Html(page.into_string()).into_response()
}

async fn policy(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let s = match c.session(&headers) {
        Ok(s) => s,
        Err(answer) => return *answer,
    };
    let text = match c
        .api
        .get_policy(as_caller(s.caller, pb::GetPolicyRequest {}))
        .await
    {
        Ok(r) => r.into_inner().toml,
        Err(e) => return refused(Some(&s), &e),
    };
    let dry = match c
        .api
        .dry_run(as_caller(s.caller, pb::DryRunRequest {}))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(e) => return refused(Some(&s), &e),
    };
    let page = pages::policy(&s, &c.control.policy_source(), &text, &dry);
    Html(page.into_string()).into_response()
}

#[derive(Deserialize)]
struct JobQuery {
    process: Option<String>,
}

async fn job(
    State(c): State<Arc<Console>>,
    Path(id): Path<u64>,
    Query(q): Query<JobQuery>,
    headers: HeaderMap,
) -> Response {
    let s = match c.session(&headers) {
        Ok(s) => s,
        Err(answer) => return *answer,
    };
    c.job_page(&s, id, q.process, None).await
}

impl Console {
    /// Job `id`'s page as session `s` may see it, with what the brain answered to a form.
    async fn job_page(
        &self,
        s: &Session,
        id: u64,
        process: Option<String>,
        notice: Option<(bool, String)>,
    ) -> Response {
        // The record first: it is what refuses another job's secret or an unknown job.
        let job = match self
            .api
            .get_job(as_caller(s.caller, pb::GetJobRequest { job_id: id }))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(e) => return refused(Some(s), &e),
        };
        let events = match self
            .api
            .job_events(as_caller(s.caller, pb::JobEventsRequest { job_id: id }))
            .await
        {
            Ok(r) => r.into_inner().text,
            Err(e) => format!("({})", e.message()),
        };
        let processes = process_names(job.shape.as_ref());
        let process = process
            .filter(|p| processes.contains(p))
            .or_else(|| processes.first().cloned())
            .unwrap_or_default();
        let logs = self
            .api
            .job_logs(as_caller(
                s.caller,
                pb::JobLogsRequest {
                    job_id: id,
                    process: process.clone(),
                    tail: LOG_TAIL_BYTES,
                    ..Default::default()
                },
            ))
            .await
            .map(|r| {
                let r = r.into_inner();
                (r.path, r.text)
            })
            .map_err(|e| e.message().to_string());
        let plans: Vec<i64> = job.plans.iter().map(|p| p.created_unix_ms).collect();
        let store = self.control.store.clone();
        let chart = tokio::task::spawn_blocking(move || {
            let points = store
                .lock()
                .expect("no panic under the lock")
                .timeline(JobId(id), TIMELINE_POINTS)
                .unwrap_or_default();
            chart::timeline_svg(&points, &plans)
        })
        .await
        .unwrap_or_default();
        let view = pages::JobView {
            job: &job,
            chart: &chart,
            events: &events,
            processes: &processes,
            process: &process,
            logs,
            notice,
        };
        Html(pages::job(s, &view).into_string()).into_response()
    }
}

/// The processes a job's shape names (`worker-0`, `ps-0`, `rollout-1`, ...).
fn process_names(shape: Option<&pb::JobShape>) -> Vec<String> {
    let Some(s) = shape else {
        return Vec::new();
    };
    s.roles
        .iter()
        .flat_map(|r| (0..r.count).map(move |i| format!("{}-{i}", r.role)))
        .collect()
}

#[derive(Deserialize)]
struct ScaleForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    workers: String,
    /// The role `workers` counts: the job's training group's name (`worker` when left out).
    #[serde(default)]
    training_role: String,
    #[serde(default)]
    ps: String,
    #[serde(default)]
    force: Option<String>,
}

/// A count from a form field: none when empty.
fn count(field: &str, value: &str) -> Result<Option<u32>, String> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .map_err(|_| format!("{field}: {v:?} is not a count (0 or more)"))
}

async fn scale(
    State(c): State<Arc<Console>>,
    Path(id): Path<u64>,
    headers: HeaderMap,
    Form(form): Form<ScaleForm>,
) -> Response {
    let s = match posted(&c, &headers, &form.csrf) {
        Ok(s) => s,
        Err(answer) => return *answer,
    };
    let counts = count("workers", &form.workers).and_then(|w| Ok((w, count("ps", &form.ps)?)));
    let notice = match counts {
        Err(why) => (false, why),
        Ok((None, None)) => (false, "Say how many workers (or ps) to scale to.".into()),
        Ok((workers, ps)) => {
            let trainer = match form.training_role.trim() {
                "" => "worker",
                name => name,
            };
            let roles = [(trainer, workers), ("ps", ps)]
                .into_iter()
                .filter_map(|(role, n)| {
                    n.map(|count| proto::jobmaster::v1::RoleTarget {
                        nodes: Vec::new(),
                        role: role.into(),
                        count,
                        resources: None,
                    })
                })
                .collect();
            let request = pb::ProposePlanRequest {
                job_id: id,
                roles,
                migrations: Vec::new(),
                reason: "by hand (the console)".into(),
                force: form.force.is_some(),
            };
            match c.api.propose_plan(as_caller(s.caller, request)).await {
                Ok(r) => {
                    let r = r.into_inner();
                    let mut text = format!(
                        "Plan {} proposed; the job's master takes it at its next poll.",
                        r.version
                    );
                    for n in &r.notes {
                        text.push_str(&format!("\nnote: {n}"));
                    }
                    (true, text)
                }
                Err(e) => (false, e.message().to_string()),
            }
        }
    };
    c.job_page(&s, id, None, Some(notice)).await
}

async fn cancel(
    State(c): State<Arc<Console>>,
    Path(id): Path<u64>,
    headers: HeaderMap,
    Form(form): Form<Csrf>,
) -> Response {
    let s = match posted(&c, &headers, &form.csrf) {
        Ok(s) => s,
        Err(answer) => return *answer,
    };
    let request = pb::CancelJobRequest {
        job_id: id,
        reason: "cancelled by hand (the console)".into(),
    };
    let notice = match c.api.cancel_job(as_caller(s.caller, request)).await {
        Ok(r) => (true, format!("The job is {}.", r.into_inner().state)),
        Err(e) => (false, e.message().to_string()),
    };
    c.job_page(&s, id, None, Some(notice)).await
}

/// The operator's session (the what-if page is theirs alone), or the answer to give.
fn operator_only(s: &Session) -> Result<(), Box<Response>> {
    if matches!(s.caller, Caller::Job(_) | Caller::Owner(_)) {
        let page = pages::error(Some(s), "The what-if page is the operator's.");
        return Err(Box::new(
            (StatusCode::FORBIDDEN, Html(page.into_string())).into_response(),
        ));
    }
    Ok(())
}

/// The policy in force as the what-if replays it, and its label.
fn in_force(c: &Console) -> (crate::whatif::NamedPolicy, String) {
    let scheduler = c.control.policy().0.scheduler();
    let label = format!("in force ({})", scheduler.name());
    (
        crate::whatif::NamedPolicy {
            label: label.clone(),
            scheduler,
            live_round: None,
            handling: None,
        },
        label,
    )
}

async fn whatif_page(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let s = match c.session(&headers) {
        Ok(s) => s,
        Err(answer) => return *answer,
    };
    if let Err(answer) = operator_only(&s) {
        return *answer;
    }
    let (_, label) = in_force(&c);
    Html(whatif::page(&s, &c.whatif, &label, None).into_string()).into_response()
}

async fn whatif_replay(
    State(c): State<Arc<Console>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (mut csrf, mut trace, mut chosen) = (String::new(), None, Vec::new());
    for (k, v) in form_urlencoded::parse(&body) {
        match &*k {
            "csrf" => csrf = v.into_owned(),
            "trace" => trace = v.parse::<usize>().ok(),
            "policy" => chosen.extend(v.parse::<usize>().ok()),
            _ => {}
        }
    }
    let s = match posted(&c, &headers, &csrf) {
        Ok(s) => s,
        Err(answer) => return *answer,
    };
    if let Err(answer) = operator_only(&s) {
        return *answer;
    }
    let (policy, label) = in_force(&c);
    let outcome = match trace {
        None => Err("Say which trace to replay.".to_string()),
        Some(trace) => {
            let _one = c.replaying.lock().await;
            let settings = c.whatif.clone();
            tokio::task::spawn_blocking(move || {
                whatif::compare(&settings, trace, &chosen, policy).map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|e| Err(format!("the replay failed: {e}")))
        }
    };
    Html(whatif::page(&s, &c.whatif, &label, Some(outcome)).into_string()).into_response()
}
