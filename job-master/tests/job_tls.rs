//! Mutual TLS inside a job (`job-master run --job-tls`): the master makes the job's CA and
//! certificate, and every link carries it: agents and training processes to the master,
//! workers to the parameter servers, the master to the PS (checkpoints, reshard), PS to PS
//! (the keys a reshard moves), and the allreduce ring. A PS job resharded 1 -> 2 and an
//! allreduce job run to the end exactly once over it; a client with the job's secret but no
//! TLS, or with another job's certificate, is refused by the master and by a PS. The Python
//! SDK's calls go over it too (a PyTorch DDP script; skipped without torch). A job master run
//! by hand speaks it unless told `--job-insecure`, and `job-master status --run-dir` finds
//! the master, the secret and the TLS in the run directory.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use proto::jobmaster::v1 as pb;

const N: u64 = 40_000;

/// The service address of the job's first PS, from the master's persisted context.
fn ps_addr(run_dir: &Path) -> String {
    let ctx = context(run_dir);
    ctx["roles"]["ps"]["slots"]["0"]["service_addr"]
        .as_str()
        .unwrap_or_else(|| panic!("no ps-0 address in {:#}", ctx["roles"]))
        .to_string()
}

/// Whether a `GetStatus` (job master) or `Stats` (PS) with the job's secret, over `tls` (or
/// plain TCP), is answered.
async fn answered(
    addr: &str,
    token: &auth::Token,
    tls: Option<&auth::tls::JobTls>,
    ps: bool,
) -> bool {
    let creds = auth::JobCreds {
        token: token.clone(),
        tls: tls.cloned(),
    };
    let channel = match tokio::time::timeout(
        Duration::from_secs(10),
        creds.connect(
            format!("http://{addr}"),
            auth::Deadlines::all(Duration::from_secs(30)),
        ),
    )
    .await
    {
        Ok(Ok(c)) => c,
        _ => return false,
    };
    let call = async {
        if ps {
            pb::parameter_server_client::ParameterServerClient::new(channel)
                .stats(pb::StatsRequest {})
                .await
                .is_ok()
        } else {
            pb::job_master_client::JobMasterClient::new(channel)
                .get_status(pb::StatusRequest {})
                .await
                .is_ok()
        }
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ps_job_resharded_over_the_jobs_tls_trains_each_sample_once_and_refuses_others() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = builtin_spec(dir.path(), "tls-ps", "ps", 1, 2, N, 1, 60, 10);
    let ps = spec.roles.get_mut(&job_master::spec::Role::PS).unwrap();
    (ps.min, ps.max) = (Some(1), Some(2));
    let mut run = start_tls(spec, dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 5).await;

    // The job's files: a CA, the job's certificate, its owner-only key; no CA key.
    let tls_dir = run.run_dir.join(job_master::master::JOB_TLS_DIR);
    let mut files: Vec<String> = std::fs::read_dir(&tls_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["ca.pem", "job.key", "job.pem"]);
    let ours = tls_of(addr).unwrap();
    let token = secret_of(addr).unwrap();
    let foreign_dir = tempfile::tempdir().unwrap();
    let foreign = auth::tls::JobTls::make_or_load(foreign_dir.path()).unwrap();
    let master = addr.to_string();
    let ps0 = ps_addr(&run.run_dir);
    for (target, ps) in [(&master, false), (&ps0, true)] {
        assert!(answered(target, &token, Some(&ours), ps).await, "{target}");
        assert!(
            !answered(target, &token, None, ps).await,
            "{target} answered a plain client"
        );
        assert!(
            !answered(target, &token, Some(&foreign), ps).await,
            "{target} answered another job's certificate"
        );
    }

    // A reshard: the master drives the PS over TLS, the old PS streams keys to the new one.
    send(addr, plan(1, None, Some(2))).await;
    reached(addr, 1).await;
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert_ps_applied_each_sample_once(&report, N, 1);
    assert_eq!(report.reshards.len(), 1, "{:#?}", report.events);
    let r = &report.reshards[0];
    assert_eq!((r.from_ps, r.to_ps), (1, 2));
    assert!(
        r.moved_keys > 0 && r.digest_before == r.digest_after,
        "{r:?}"
    );
    assert_no_process_left(addr).await;
}

/// Tokens go to no impostor inside a job run by hand either (issue 40, attack 4): `job-master
/// run` with no flag makes the job's TLS, and a client that speaks plain text with the job's
/// secret gets no answer; `--job-insecure` is plain text, as it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_master_run_by_hand_speaks_the_jobs_tls_unless_told_otherwise() {
    for insecure in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("job.yaml");
        std::fs::write(
            &spec,
            builtin_yaml(dir.path(), "by-hand", "ps", 1, 2, 30_000, 1, 300, 4),
        )
        .unwrap();
        let run_dir = dir.path().join("run");
        let mut args: Vec<&std::ffi::OsStr> = vec!["--run-dir".as_ref(), run_dir.as_os_str()];
        if insecure {
            args.push("--job-insecure".as_ref());
        }
        let (master, addr) = spawn_run(&spec, &args);
        let token = wait_secret(addr).await;
        let tls_dir = run_dir.join(job_master::master::JOB_TLS_DIR);
        assert_eq!(tls_dir.is_dir(), !insecure);
        let plain = answered(&addr.to_string(), &token, None, false).await;
        assert_eq!(plain, insecure, "plain text answered: {plain}");
        if !insecure {
            let tls = auth::tls::JobTls::load(&tls_dir).unwrap();
            assert!(answered(&addr.to_string(), &token, Some(&tls), false).await);
        }
        // The operator's view from the run directory alone.
        let mut status = std::process::Command::new(job_master_bin());
        status.arg("status").arg("--run-dir").arg(&run_dir);
        if insecure {
            status.arg("--insecure");
        }
        let out = status.output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("ps-0") && said.contains("worker-1"),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report = finished_run(master, &run_dir).await;
        assert!(report.succeeded(), "{:?}", report.reason);
        assert_eq!(report.exactly_once, "ok");
        assert_ps_applied_each_sample_once(&report, 30_000, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allreduce_job_rescaled_over_the_jobs_tls_ring_trains_each_sample_once() {
    let dir = tempfile::tempdir().unwrap();
    let spec = builtin_spec(dir.path(), "tls-ring", "allreduce", 0, 2, N, 1, 60, 10);
    let mut run = start_tls(spec, dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 5).await;
    // The group re-forms at 3: a new ring, over TLS.
    rescale_workers(addr, 1, 3).await;
    let report = run.report().await;
    assert_each_sample_once(&report, N, 1);
    assert_no_process_left(addr).await;
}

/// The SDK (Python gRPC) reaches a master that takes TLS only: a DDP script trains to the
/// end. (torch's own store and gloo are not TLS: see the threat model in docs/operators.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pytorch_script_reaches_its_master_over_the_jobs_tls_through_the_sdk() {
    let Some((python, sdk)) = torch_with_sdk() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let samples = 4_000;
    let yaml = format!(
        r#"
name: tls-ddp
kind: allreduce
roles:
  worker: {{ replicas: 2, max_restarts: 0 }}
workload:
  command: {argv:?}
  env: {{ OMP_NUM_THREADS: "1", PYTHONPATH: {sdk:?} }}
data: {{ num_samples: {samples}, shard_size: 400 }}
checkpoint: {{ dir: {ckpt:?}, every_shards: 5 }}
"#,
        argv = [
            python.as_str(),
            &example_script("pytorch-ddp/train.py").display().to_string(),
            "--samples",
            &samples.to_string(),
        ],
        ckpt = dir.path().join("checkpoints"),
    );
    let spec = job_master::spec::JobSpec::from_yaml(&yaml).unwrap();
    let mut run = start_tls(spec, dir.path()).await;
    let report = run.report().await;
    assert!(
        report.succeeded(),
        "{:?}\n{}",
        report.reason,
        run.last_events(30)
    );
    assert_eq!(report.exactly_once, "ok");
}
