//! Fuzzing the job master's and the parameter server's RPC handlers on stable Rust
//! (proptest): random protobuf bytes decoded as each of the 11 JobMaster and 7
//! ParameterServer requests (what decodes is sent, with the job's secret, so every handler is
//! reached) go to a real job master (an all-reduce job whose agents are started by someone
//! else) and a real parameter server over loopback. Every answer is a success or a clear
//! refusal: never UNKNOWN or INTERNAL (nor UNAUTHENTICATED), never an empty message; no handler panics (a panic hook
//! counts them, on any thread); both still answer afterwards. Paths and addresses in requests
//! are pointed inside the test's directory and at 127.0.0.1 before they are sent. CI runs 300
//! calls; the long run is `PROPTEST_CASES=100000 cargo test -p job-master --test fuzz_rpc`.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use common::*;
use job_master::platform::PlatformConfig;
use proptest::prelude::any;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use prost::Message;
use proto::jobmaster::v1 as pb;
use tonic::Code;

static PANICS: AtomicU32 = AtomicU32::new(0);

/// Decodes `bytes` as request `$t`, lets `$fix` make it safe to send, and calls `$m`.
macro_rules! send {
    ($c:expr, $m:ident, $t:ty, $bytes:expr) => {
        send!($c, $m, $t, $bytes, |_: &mut $t| {})
    };
    ($c:expr, $m:ident, $t:ty, $bytes:expr, $fix:expr) => {{
        let Ok(mut req) = <$t>::decode($bytes) else {
            return None;
        };
        $fix(&mut req);
        Some($c.$m(req).await.map(drop))
    }};
}

/// JobMaster RPC number `rpc` (of 13) with `bytes` as its request; `None` when they do not
/// decode.
async fn master_call(
    c: &mut Client,
    rpc: u8,
    bytes: &[u8],
    dir: &std::path::Path,
) -> Option<Result<(), tonic::Status>> {
    match rpc % 13 {
        0 => send!(
            c,
            register_agent,
            pb::RegisterAgentRequest,
            bytes,
            |r: &mut pb::RegisterAgentRequest| {
                r.host = "127.0.0.1".into();
                r.service_addr = "127.0.0.1:1".into();
            }
        ),
        1 => send!(c, heartbeat, pb::HeartbeatRequest, bytes),
        2 => send!(c, report_process_exit, pb::ProcessExit, bytes),
        3 => send!(
            c,
            join_rendezvous,
            pb::JoinRendezvousRequest,
            bytes,
            |r: &mut pb::JoinRendezvousRequest| {
                if !r.service_addr.is_empty() {
                    r.service_addr = "127.0.0.1:1".into();
                }
            }
        ),
        4 => send!(c, get_workload, pb::ProcessRef, bytes),
        5 => send!(c, lease_shard, pb::LeaseShardRequest, bytes),
        6 => send!(c, report_shard_done, pb::ShardDone, bytes),
        7 => send!(c, report_metrics, pb::TrainingMetrics, bytes),
        8 => send!(
            c,
            commit_checkpoint,
            pb::CheckpointCommit,
            bytes,
            |r: &mut pb::CheckpointCommit| {
                r.path = dir
                    .join(r.path.replace(['/', '\0'], "_"))
                    .display()
                    .to_string();
            }
        ),
        9 => send!(c, get_status, pb::StatusRequest, bytes),
        10 => send!(c, report_stacks, pb::ProcessStacks, bytes),
        11 => send!(c, report_checkpoint_damaged, pb::CheckpointDamaged, bytes),
        _ => send!(c, apply_scale_plan, pb::ScalePlan, bytes),
    }
}

/// ParameterServer RPC number `rpc` (of 7).
async fn ps_call(
    c: &mut Ps,
    rpc: u8,
    bytes: &[u8],
    dir: &std::path::Path,
) -> Option<Result<(), tonic::Status>> {
    match rpc % 7 {
        0 => send!(c, pull, pb::PullRequest, bytes),
        1 => send!(c, push, pb::PushRequest, bytes),
        2 => send!(
            c,
            save,
            pb::SaveRequest,
            bytes,
            |r: &mut pb::SaveRequest| {
                r.dir = dir
                    .join(r.dir.replace(['/', '\0'], "_"))
                    .display()
                    .to_string();
            }
        ),
        3 => send!(c, stats, pb::StatsRequest, bytes),
        4 => send!(
            c,
            reshard,
            pb::ReshardRequest,
            bytes,
            |r: &mut pb::ReshardRequest| {
                for a in &mut r.ps {
                    *a = "127.0.0.1:1".into();
                }
            }
        ),
        5 => {
            let Ok(chunk) = pb::AbsorbChunk::decode(bytes) else {
                return None;
            };
            Some(c.absorb(tokio_stream::iter(vec![chunk])).await.map(drop))
        }
        _ => send!(c, drop, pb::DropRequest, bytes),
    }
}

/// A refusal for what the request says: with the job's secret, never for who sent it.
fn clear(e: &tonic::Status) -> bool {
    !matches!(
        e.code(),
        Code::Unknown | Code::Internal | Code::Unauthenticated
    ) && !e.message().is_empty()
}

#[test]
fn random_requests_to_a_job_master_and_a_parameter_server_never_crash_them() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::Relaxed);
        default(info);
    }));
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (master, mut c, mut ps) = rt.block_on(async {
        let master = start_on(
            builtin_spec(dir.path(), "fuzzed", "allreduce", 0, 2, 8_000, 1, 0, 0),
            &dir.path().join("run"),
            job_master::job::Timing::default(),
            PlatformConfig::External,
        )
        .await;
        let c = client_with(master.addr, Some(wait_secret(master.addr).await))
            .await
            .unwrap();
        let token = auth::Token::generate();
        let ps = ps_with(&start_ps(&token).await, Some(token)).await;
        (master, c, ps)
    });
    let mut runner = TestRunner::new(Config::with_cases(test_support::fuzz::cases(300)));
    let sent = AtomicU32::new(0);
    let strategy = (any::<bool>(), any::<u8>(), test_support::fuzz::message());
    runner
        .run(&strategy, |(to_ps, rpc, bytes)| {
            let answer = rt.block_on(async {
                if to_ps {
                    ps_call(&mut ps.clone(), rpc, &bytes, &files).await
                } else {
                    master_call(&mut c.clone(), rpc, &bytes, &files).await
                }
            });
            if let Some(Err(e)) = &answer
                && !clear(e)
            {
                let to = if to_ps { "ps" } else { "master" };
                return Err(TestCaseError::fail(format!(
                    "{to} rpc {rpc} with {bytes:?}: {e:?}"
                )));
            }
            if answer.is_some() {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
        .unwrap();
    rt.block_on(async {
        c.get_status(pb::StatusRequest {}).await.unwrap();
        ps.stats(pb::StatsRequest {}).await.unwrap();
    });
    assert_eq!(PANICS.load(Ordering::Relaxed), 0, "a handler panicked");
    let sent = sent.into_inner();
    assert!(sent > 0, "no request decoded");
    eprintln!("{sent} random requests sent");
    master.handle.abort();
}
