//! The pre-run check (the spec's `precheck:`): before a job's first launch, one check process
//! (`python -m brain_sdk.precheck`) runs on every node the platform offers the job, and they
//! meet on a check server of the job master's own, open only while the check runs, with the
//! job's credentials. [`board`] keeps the steps and takes the verdict; this module runs the
//! server, the processes ([`Platform::run_check`]) and the clock: a step ends when every node
//! has answered it or after the spec's `step_timeout_s`, a node whose process ends early fails
//! whatever it still owed. The job then avoids the faulty nodes and the stragglers.

pub mod board;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::jobmaster::v1 as pb;
use tokio::sync::{Mutex, Notify, watch};
use vocab::report::PrecheckRecord;
use vocab::spec::Precheck;

use crate::error::Error;
use crate::platform::{CheckEnd, CheckLaunch, CheckNode, Platform};
use board::{Board, Next, Report};

/// How long a step call waits before it answers "again" (no connection sits silent long).
const ANSWER_WITHIN: Duration = Duration::from_secs(20);
/// How long the check processes get to exit once told the check is done.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// What a check needs besides the platform.
pub struct CheckRun {
    pub settings: Precheck,
    /// Environment for every check process (the workload's, the job's secret and TLS paths).
    pub env: BTreeMap<String, String>,
    /// GPUs each check process asks for (on nodes that have them).
    pub gpus: u32,
    /// Where the check server listens, and the address the processes are given for it.
    pub bind: IpAddr,
    pub advertise: IpAddr,
    pub creds: auth::JobCreds,
    pub connections: auth::listen::ConnLimits,
}

struct State {
    check: String,
    board: Mutex<Board>,
    /// The step the board is at, for the calls waiting on it.
    step: watch::Sender<u32>,
    /// A report came in (the clock looks whether the step is over).
    reported: Notify,
    round_timeout_s: u32,
}

/// Runs the check over the nodes `platform` offers and returns its verdict. Fails only when
/// the check cannot be run at all (no node, the server cannot listen); a node that fails is a
/// verdict.
pub async fn run(platform: Arc<dyn Platform>, c: CheckRun) -> Result<PrecheckRecord, Error> {
    let started = Instant::now();
    let mut nodes = platform.check_nodes().await?;
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    if nodes.is_empty() {
        return Err(Error::Precheck(
            "no node to check: every node is cordoned or avoided".into(),
        ));
    }
    let id = format!(
        "precheck-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    );
    let names = nodes.iter().map(|n| n.name.clone()).collect();
    let (step, _) = watch::channel(0);
    let state = Arc::new(State {
        check: id.clone(),
        board: Mutex::new(Board::new(names, c.settings.straggler_ratio)),
        step,
        reported: Notify::new(),
        round_timeout_s: c.settings.step_timeout_s,
    });
    let listener = tokio::net::TcpListener::bind((c.bind, 0))
        .await
        .map_err(|source| Error::Io {
            path: "the pre-run check's listener".into(),
            source,
        })?;
    let port = listener
        .local_addr()
        .map_err(|source| Error::Io {
            path: "the pre-run check's listener".into(),
            source,
        })?
        .port();
    let url = format!("http://{}", SocketAddr::new(c.advertise, port));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = serve(state.clone(), listener, &c, stop_rx)?;
    tracing::info!(%url, nodes = nodes.len(), "pre-run check started");

    let processes: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let launch = launch(&c, &id, i, &url);
            tokio::spawn(watch_process(
                platform.clone(),
                state.clone(),
                i,
                node.clone(),
                launch,
            ))
        })
        .collect();
    drive(&state).await;
    let verdict = state
        .board
        .lock()
        .await
        .verdict(started.elapsed().as_millis() as u64);
    // Told they are done, the processes exit; one that does not is let go of (a local one is
    // killed with its task, a Ray one fails its next call once the server is gone).
    let _ = tokio::time::timeout(EXIT_WITHIN, futures_join(processes)).await;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    Ok(verdict)
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        let _ = h.await;
    }
}

/// The check server: the PreCheck service alone, behind the job's secret (and TLS).
fn serve(
    state: Arc<State>,
    listener: tokio::net::TcpListener,
    c: &CheckRun,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let listening = c.creds.listening("pre-run check", c.connections)?;
    let require = auth::Require::new(c.creds.token.clone(), "the job master's pre-run check");
    let server = tonic::transport::Server::builder()
        .add_service(pb::pre_check_server::PreCheckServer::with_interceptor(
            CheckService { state },
            require,
        ))
        .serve_with_incoming_shutdown(auth::listen::incoming(listener, listening), async {
            let _ = stop.await;
        });
    Ok(tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::warn!("the pre-run check's server: {e}");
        }
    }))
}

/// Node `i`'s check process, as the platform runs it.
fn launch(c: &CheckRun, id: &str, i: usize, url: &str) -> CheckLaunch {
    let s = &c.settings;
    let argv = [
        s.python.as_str(),
        "-m",
        "brain_sdk.precheck",
        "--master",
        url,
        "--check",
        id,
        "--node",
        &i.to_string(),
        "--matmul-size",
        &s.matmul_size.to_string(),
        "--allreduce-mb",
        &s.allreduce_mb.to_string(),
        "--step-timeout-s",
        &s.step_timeout_s.to_string(),
    ]
    .map(str::to_string)
    .to_vec();
    CheckLaunch {
        id: format!("{id}-{i}"),
        argv,
        env: c.env.clone(),
        gpus: c.gpus,
        // Every step at most its timeout, and a minute to start and to exit.
        timeout: Duration::from_secs(
            u64::from(s.step_timeout_s) * u64::from(board::ROUNDS + 1) + 60,
        ),
        // Before the first step's time is up, so that a node without room counts as
        // unchecked, not as one that never answered.
        place_within: Duration::from_secs(u64::from(s.step_timeout_s) / 2),
    }
}

/// Runs node `i`'s process; its end before the check is done fails what it still owed.
async fn watch_process(
    platform: Arc<dyn Platform>,
    state: Arc<State>,
    i: usize,
    node: CheckNode,
    launch: CheckLaunch,
) {
    let ended = platform.run_check(&node, launch).await;
    let mut board = state.board.lock().await;
    if !board.done() {
        match ended {
            Err(CheckEnd::NotPlaced(why)) => {
                tracing::warn!(node = %node.name, "pre-run check: not checked: {why}");
                board.unplaced(i, &why);
            }
            other => {
                let why = match other {
                    Err(CheckEnd::Failed(why)) => format!("its check process failed: {why}"),
                    _ => "its check process exited before the check was done".to_string(),
                };
                tracing::warn!(node = %node.name, "pre-run check: {why}");
                board.lost(i, &why);
            }
        }
        drop(board);
        state.reported.notify_one();
    }
}

/// The check's clock: each step ends once every node answered it, or at its timeout.
async fn drive(state: &State) {
    let timeout = Duration::from_secs(u64::from(state.round_timeout_s));
    loop {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if state.board.lock().await.all_reported() {
                break;
            }
            if tokio::time::timeout_at(deadline, state.reported.notified())
                .await
                .is_err()
            {
                break;
            }
        }
        let mut board = state.board.lock().await;
        board.advance(&format!("no answer within {} s", state.round_timeout_s));
        let _ = state.step.send(board.step());
        if board.done() {
            return;
        }
    }
}

struct CheckService {
    state: Arc<State>,
}

impl CheckService {
    async fn step(&self, r: pb::PreCheckReport) -> Result<pb::PreCheckStep, Error> {
        let state = &self.state;
        if r.check != state.check {
            return Err(Error::StaleCheck {
                got: r.check,
                current: state.check.clone(),
            });
        }
        state
            .board
            .lock()
            .await
            .report(&Report {
                node: r.node,
                step: r.step,
                ok: r.ok,
                millis: r.millis,
                store: r.store,
                cuda: r.cuda,
                error: r.error,
            })
            .map_err(Error::InvalidRequest)?;
        state.reported.notify_one();
        let mut step = state.step.subscribe();
        let _ = tokio::time::timeout(ANSWER_WITHIN, step.wait_for(|s| *s > r.step)).await;
        let next = state.board.lock().await.next(r.node as usize, r.step);
        Ok(match next {
            Next::Wait => pb::PreCheckStep {
                again: true,
                ..Default::default()
            },
            Next::Done => pb::PreCheckStep {
                done: true,
                ..Default::default()
            },
            Next::SitOut { step } => pb::PreCheckStep {
                step,
                ..Default::default()
            },
            Next::Round {
                step,
                rank,
                world,
                store,
                backend,
            } => pb::PreCheckStep {
                step,
                rank,
                world,
                store,
                backend: backend.into(),
                timeout_s: state.round_timeout_s,
                ..Default::default()
            },
        })
    }
}

#[tonic::async_trait]
impl pb::pre_check_server::PreCheck for CheckService {
    async fn step(
        &self,
        request: tonic::Request<pb::PreCheckReport>,
    ) -> Result<tonic::Response<pb::PreCheckStep>, tonic::Status> {
        Ok(tonic::Response::new(
            CheckService::step(self, request.into_inner()).await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(check: &str, nodes: usize) -> Arc<State> {
        let (step, _) = watch::channel(0);
        Arc::new(State {
            check: check.into(),
            board: Mutex::new(Board::new(
                (0..nodes).map(|i| format!("10.0.0.{i}")).collect(),
                2.0,
            )),
            step,
            reported: Notify::new(),
            round_timeout_s: 5,
        })
    }

    /// The check server refuses a caller without the job's secret, a process of another
    /// check, and a node outside it; the step answers once every node has reported.
    #[tokio::test]
    async fn the_check_server_wants_the_secret_and_this_check_and_answers_each_step_once_all_reported()
     {
        let token = auth::Token::generate();
        let creds = auth::JobCreds::from(token.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let st = state("precheck-1", 2);
        let run = CheckRun {
            settings: Precheck {
                matmul_size: 64,
                allreduce_mb: 1,
                straggler_ratio: 2.0,
                step_timeout_s: 5,
                python: "python3".into(),
            },
            env: BTreeMap::new(),
            gpus: 0,
            bind: std::net::Ipv4Addr::LOCALHOST.into(),
            advertise: std::net::Ipv4Addr::LOCALHOST.into(),
            creds: creds.clone(),
            connections: Default::default(),
        };
        let (_stop, stop_rx) = tokio::sync::oneshot::channel();
        let _server = serve(st.clone(), listener, &run, stop_rx).unwrap();
        let report = |node: u32, check: &str| pb::PreCheckReport {
            check: check.into(),
            node,
            step: 0,
            ok: true,
            millis: 3.0,
            store: format!("127.0.0.1:{}", 9000 + node),
            ..Default::default()
        };

        let anyone = auth::connect_with(url.clone(), auth::WithToken::new(None), None)
            .await
            .unwrap();
        let e = pb::pre_check_client::PreCheckClient::new(anyone)
            .step(report(0, "precheck-1"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

        let channel = creds
            .connect(url, auth::Deadlines::all(Duration::from_secs(30)))
            .await
            .unwrap();
        let mut client = pb::pre_check_client::PreCheckClient::new(channel);
        let e = client.step(report(0, "precheck-0")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("older check"), "{e:?}");
        let e = client.step(report(7, "precheck-1")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

        // Both nodes report their matmul; the clock lays out round 1: one pair.
        let driver = tokio::spawn({
            let st = st.clone();
            async move { drive(&st).await }
        });
        let (mut c0, mut c1) = (client.clone(), client.clone());
        let (a, b) = tokio::join!(
            c0.step(report(0, "precheck-1")),
            c1.step(report(1, "precheck-1"))
        );
        let (a, b) = (a.unwrap().into_inner(), b.unwrap().into_inner());
        assert_eq!((a.step, a.rank, a.world), (1, 0, 2), "{a:?}");
        assert_eq!((b.step, b.rank, b.world), (1, 1, 2), "{b:?}");
        assert_eq!(a.store, "127.0.0.1:9000");
        assert_eq!(a.backend, "gloo");
        driver.abort();
    }
}
