//! Issue 40: each hole found by trying to break into a real brain, tried again as an attacker
//! would, against real processes: names `.`/`..` and planted links under the runs directory, a
//! refused submission's leftovers, YAML alias amplification (memory measured), sizes beyond any
//! machine, world-readable files, a job's processes speaking for its master, loader and runtime
//! variables in a spec, a fake brain on the brain's port, a refusal echoing a 10 KiB word, and
//! token files that are FIFOs or links. (The connection flood is `lockout.rs`.)

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::brainctl;
use proto::service::v1 as pb;

/// A job spec named `name`, built-in workload, `extra` appended under `workload:` (indented).
fn spec_text(name: &str, workload_extra: &str) -> String {
    format!(
        "name: {name}\nkind: allreduce\nroles:\n  worker: {{ min: 1, max: 2 }}\n\
         workload:\n  builtin: {{ batch_size: 128, step_delay_us: 200 }}\n{workload_extra}\
         data: {{ num_samples: 20000, shard_size: 500, eval_samples: 1000 }}\n\
         checkpoint: {{ dir: checkpoints, every_shards: 8 }}\n"
    )
}

fn write(d: &Path, file: &str, text: &str) -> PathBuf {
    let p = d.join(file);
    std::fs::write(&p, text).unwrap();
    p
}

fn submit(url: &str, spec: &Path) -> (bool, String) {
    brainctl(&["submit", spec.to_str().unwrap(), "--brain", url])
}

/// A brain (its own TLS, the default) with its data in `d/data`, rounds every second.
fn brain(d: &Path) -> (common::Brain, String) {
    std::fs::write(
        d.join("policy.toml"),
        "heuristics = []\n[scheduler]\nkind = \"pollux\"\n[live]\ninterval_s = 1\n",
    )
    .unwrap();
    let data = d.join("data");
    let (b, addr) = common::spawn_brain(|cmd| {
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--cpus",
            "2",
            "--max-processes",
            "8",
        ])
        .arg("--database")
        .arg(data.join("brain.db"))
        .arg("--runs-dir")
        .arg(data.join("runs"))
        .arg("--policy")
        .arg(d.join("policy.toml"))
        .arg("--job-master-bin")
        .arg(common::bin_dir().join("job-master"))
        .stderr(std::fs::File::create(d.join("brain.log")).unwrap());
    });
    (b, format!("http://{addr}"))
}

fn runs(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d.join("data/runs"))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Attacks 2, 3 and 10 (a refused submission's empty directory): `.` and `..` and other
/// non-labels are refused; a link planted where a job's run directory would go is never
/// followed; a submission refused after its directory was made leaves nothing.
#[test]
fn names_and_planted_links_never_lead_a_job_out_of_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_b, url) = brain(d);
    for name in ["\".\"", "\"..\"", "Upper", "a_b", "a.b", "\"-a\""] {
        let spec = write(d, "bad-name.yaml", &spec_text(name, ""));
        let (ok, said) = submit(&url, &spec);
        assert!(!ok, "{name} accepted: {said}");
        assert!(said.contains("DNS-1123"), "{name}: {said}");
    }
    assert!(runs(d).is_empty(), "{:?}", runs(d));

    // A link planted at the next job's run directory, pointing where the brain keeps its store.
    let outside = d.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, d.join("data/runs/victim")).unwrap();
    let (ok, said) = submit(&url, &write(d, "victim.yaml", &spec_text("victim", "")));
    assert!(
        !ok && said.contains("a symbolic link, not followed"),
        "{said}"
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);

    // Refused after its directory was made (the spec's own bounds): nothing left behind.
    let bounds = spec_text("bounds", "").replace("min: 1, max: 2", "min: 3, max: 2");
    let (ok, said) = submit(&url, &write(d, "bounds.yaml", &bounds));
    assert!(!ok && said.contains("greater than max"), "{said}");
    // A checkpoint directory out of the run directory, however written.
    let escape = spec_text("escape", "").replace("dir: checkpoints", "dir: ../victim");
    let (ok, said) = submit(&url, &write(d, "escape.yaml", &escape));
    assert!(
        !ok && said.contains("outside the job's run directory"),
        "{said}"
    );
    // The master's own files (its run directory, logs, secrets, sandbox copies) or the run
    // directory that holds them: the job's processes would own them.
    let master_files = [
        ".",
        "master",
        "master/logs",
        "master/sandbox",
        "master/tls",
        "./master/x",
    ];
    for (i, ckpt) in master_files.into_iter().enumerate() {
        let name = format!("master-files-{i}");
        let text = spec_text(&name, "").replace("dir: checkpoints", &format!("dir: {ckpt}"));
        let (ok, said) = submit(&url, &write(d, "master-files.yaml", &text));
        assert!(
            !ok && said.contains("the job master's run directory"),
            "{ckpt}: {said}"
        );
    }
    assert_eq!(runs(d), ["victim"], "only the planted link");
}

/// VmHWM (peak resident memory) of a process, KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Attack 6: a spec just under the 256 KiB limit that repeats one anchored 100 KB string
/// through aliases (about 1,500 of them: 150 MB expanded) is refused before anything is
/// built; the brain's peak memory does not move by more than a few MiB.
#[test]
fn yaml_aliases_are_refused_before_they_expand() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (b, url) = brain(d);
    let (ok, said) = brainctl(&["jobs", "--brain", &url]);
    assert!(ok, "{said}");
    let before = peak_kib(b.pid());
    let mut text = spec_text("bomb", "").replace(
        "workload:\n",
        &format!(
            "workload:\n  env: {{ A: &a \"{}\" }}\n",
            "x".repeat(100_000)
        ),
    );
    text.push_str("x-repeat: [");
    while text.len() < (256 << 10) - 100 {
        text.push_str("*a, ");
    }
    text.push_str("*a]\n");
    let (ok, said) = submit(&url, &write(d, "bomb.yaml", &text));
    assert!(!ok, "{said}");
    assert!(said.contains("a YAML alias"), "{said}");
    let after = peak_kib(b.pid());
    assert!(
        after.saturating_sub(before) < 16 << 10,
        "peak memory {before} KiB -> {after} KiB"
    );
}

/// Attacks 6 and 10: sizes beyond any machine are refused with the limit (the job master used
/// to panic on `capacity overflow`); loader, interpreter and runtime variables are refused in
/// any case (attack 9); a refusal quoting a 10 KiB command word keeps its reason (it used to
/// overflow the client's header limit as RESOURCE_EXHAUSTED).
#[test]
fn sizes_variables_and_long_words_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_b, url) = brain(d);
    let cases = [
        (
            spec_text("mem", "").replace("max: 2 }", "max: 2, resources: { memory: 1e30 } }"),
            "roles.worker.resources.memory",
        ),
        (
            spec_text("samples", "")
                .replace("num_samples: 20000", "num_samples: 9223372036854775807"),
            "data.num_samples",
        ),
        (
            spec_text("buckets", "").replace(
                "batch_size: 128",
                "batch_size: 128, hash_buckets: 4294967296",
            ),
            "workload.builtin.hash_buckets",
        ),
    ];
    for (text, says) in cases {
        let (ok, said) = submit(&url, &write(d, "big.yaml", &text));
        assert!(!ok, "{said}");
        assert!(said.contains(says) && said.contains("limit"), "{said}");
    }
    for key in [
        "PYTHONPATH",
        "ld_preload",
        "Ld_Audit",
        "BASH_ENV",
        "ENV",
        "NODE_OPTIONS",
        "GCONV_PATH",
        "PERL5OPT",
        "PYTHONSTARTUP",
        "RANK",
        "MASTER_ADDR",
        "torchelastic_run_id",
    ] {
        let text = spec_text("env", &format!("  env: {{ {key}: x }}\n"));
        let (ok, said) = submit(&url, &write(d, "env.yaml", &text));
        assert!(!ok, "{key}: {said}");
        assert!(
            said.contains(&format!("{key} may not be set"))
                || said.contains("is the runtime's to set"),
            "{key}: {said}"
        );
    }
    let long = spec_text("long", "").replace(
        "  builtin: { batch_size: 128, step_delay_us: 200 }\n",
        &format!("  command: [python3, \"{}\"]\n", "x".repeat(10 << 10)),
    );
    let (ok, said) = submit(&url, &write(d, "long.yaml", &long));
    assert!(!ok, "{said}");
    assert!(
        said.contains("InvalidArgument") && said.contains("workload.command"),
        "{said}"
    );
    assert!(runs(d).is_empty(), "{:?}", runs(d));
}

async fn wait_running(url: &str, name: &str) -> pb::JobRecord {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let all = common::jobs(url).await.unwrap_or_default();
        if let Some(j) = all
            .iter()
            .find(|j| j.job_name == name && j.state == "running" && !j.master_address.is_empty())
        {
            return j.clone();
        }
        assert!(Instant::now() < deadline, "{name} not running: {all:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Attacks 7 and 8: the brain's data is its user's alone (directory 0700, store, specs, tokens
/// 0600); a job's processes hold the job's secret, which the brain does not take, so they
/// cannot report their job's outcome (the forged "exactly-once: ok"); only the master's own
/// credential, outside what the processes are told, speaks for the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_private_and_a_jobs_processes_cannot_speak_for_its_master() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_b, url) = brain(d);
    let spec = spec_text("private", "").replace("step_delay_us: 200", "step_delay_us: 2000");
    let (ok, said) = submit(&url, &write(d, "private.yaml", &spec));
    assert!(ok, "{said}");
    let job = wait_running(&url, "private").await;
    let run_dir = PathBuf::from(&job.run_dir);
    let data = d.join("data");
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join("runs")), 0o700);
    for f in [
        data.join("brain.db"),
        data.join("operator.token"),
        run_dir.join("spec.yaml"),
        run_dir.join("brain.token"),
        run_dir.join("job-master.log"),
        run_dir.join("master").join(vocab::run_dir::CONTEXT_FILE),
    ] {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }

    // What the processes hold: the job's secret. The brain refuses it for the job's calls.
    let secret = auth::read_secret(&brain::launch::job_secret_file(&run_dir)).unwrap();
    let master = auth::read_secret(&brain::launch::credential_file(&run_dir)).unwrap();
    assert_ne!(secret, master);
    let mut forged = common::client_with(&url, Some(secret)).await;
    let e = forged
        .report_outcome(pb::JobOutcome {
            job_id: job.job_id,
            phase: "succeeded".into(),
            samples_done: 40_000,
            exactly_once: "ok".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    // No process of the job is told where the master's credential is.
    let credential = brain::launch::credential_file(&run_dir);
    for pid in test_support::descendants(std::process::id()) {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("worker-agent") {
            let env = String::from_utf8_lossy(&env);
            assert!(
                !env.contains(credential.to_str().unwrap()),
                "{pid} {cmd}: {env}"
            );
        }
    }
    let record = common::jobs(&url)
        .await
        .unwrap()
        .into_iter()
        .find(|j| j.job_id == job.job_id)
        .unwrap();
    assert_eq!(record.state, "running", "{record:#?}");
}

/// A job owner's token is a person's: `brainctl submit` keeps it (0600) beside the operator
/// token; with it the owner reads, diagnoses, scales and cancels their own job, through gRPC,
/// brainctl and the console, and nothing else. No call a job master makes (registration,
/// reports, a node's fault, the outcome, plans) takes it, nor any operator call; and the
/// master's secret makes no person's call (cancel, scale, diagnose).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_owner_s_token_reads_and_steers_its_job_and_forges_nothing() {
    use tonic::Code;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_b, url) = brain(d);
    // Slow enough to run through the whole test (about 4 min alone); cancelled at its end.
    let slow =
        |name: &str| spec_text(name, "").replace("step_delay_us: 200", "step_delay_us: 50000");
    for name in ["owned", "other"] {
        let (ok, said) = submit(&url, &write(d, &format!("{name}.yaml"), &slow(name)));
        assert!(ok, "{said}");
        assert!(
            said.contains("the owner's token for this job alone"),
            "{said}"
        );
    }
    let (job, other) = (
        wait_running(&url, "owned").await,
        wait_running(&url, "other").await,
    );
    let owner_file = common::owner_token_file(&url, job.job_id);
    assert_eq!(mode(&owner_file), 0o600);
    let owner = auth::read_secret(&owner_file).unwrap();
    let mut c = common::client_with(&url, Some(owner)).await;
    let denied = |what: &str, r: Result<(), tonic::Status>| match r {
        Err(e) if e.code() == Code::PermissionDenied => {}
        other => panic!("{what} with the owner's token: {other:?}"),
    };

    // Every call of a job master: refused, nothing changed.
    let id = job.job_id;
    denied(
        "register",
        c.register_job(pb::RegisterJobRequest {
            job_name: "owned".into(),
            master_address: "http://127.0.0.1:1".into(),
            ..Default::default()
        })
        .await
        .map(drop),
    );
    let fault = pb::MetricReport {
        faulty_nodes: vec![pb::NodeFault {
            host: "127.0.0.1".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    denied(
        "report metrics",
        c.report_metrics(pb::MetricsBatch {
            job_id: id,
            reports: vec![fault],
        })
        .await
        .map(drop),
    );
    denied(
        "get plan",
        c.get_plan(pb::GetPlanRequest {
            job_id: id,
            after_version: 0,
        })
        .await
        .map(drop),
    );
    denied(
        "ack plan",
        c.ack_plan(pb::PlanAck {
            job_id: id,
            version: 1,
            accepted: true,
            ..Default::default()
        })
        .await
        .map(drop),
    );
    denied(
        "report outcome",
        c.report_outcome(pb::JobOutcome {
            job_id: id,
            phase: "succeeded".into(),
            samples_done: 40_000,
            exactly_once: "ok".into(),
            ..Default::default()
        })
        .await
        .map(drop),
    );
    // Every operator call.
    denied(
        "list nodes",
        c.list_nodes(pb::ListNodesRequest {}).await.map(drop),
    );
    denied(
        "cordon",
        c.cordon_node(pb::CordonNodeRequest {
            node: "127.0.0.1".into(),
            ..Default::default()
        })
        .await
        .map(drop),
    );
    denied(
        "uncordon",
        c.uncordon_node(pb::UncordonNodeRequest {
            node: "127.0.0.1".into(),
        })
        .await
        .map(drop),
    );
    denied(
        "submit",
        c.submit_job(pb::SubmitJobRequest {
            spec_yaml: slow("more"),
            origin: "x".into(),
        })
        .await
        .map(drop),
    );
    denied(
        "get policy",
        c.get_policy(pb::GetPolicyRequest {}).await.map(drop),
    );
    denied(
        "set policy",
        c.set_policy(pb::PolicyText {
            toml: String::new(),
            ..Default::default()
        })
        .await
        .map(drop),
    );
    denied("dry run", c.dry_run(pb::DryRunRequest {}).await.map(drop));
    // Another job: neither read nor steered.
    let o = other.job_id;
    denied(
        "another's record",
        c.get_job(pb::GetJobRequest { job_id: o }).await.map(drop),
    );
    denied(
        "another's events",
        c.job_events(pb::JobEventsRequest { job_id: o })
            .await
            .map(drop),
    );
    denied(
        "another's diagnosis",
        c.diagnose(pb::DiagnoseRequest {
            job_id: o,
            all: false,
        })
        .await
        .map(drop),
    );
    denied(
        "cancel another",
        c.cancel_job(pb::CancelJobRequest {
            job_id: o,
            reason: String::new(),
        })
        .await
        .map(drop),
    );
    denied(
        "scale another",
        c.propose_plan(pb::ProposePlanRequest {
            job_id: o,
            roles: vec![],
            migrations: vec![],
            reason: String::new(),
            force: true,
        })
        .await
        .map(drop),
    );

    // Its own job: read, and the list holds it alone.
    let record = c
        .get_job(pb::GetJobRequest { job_id: id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(record.state, "running");
    let listed = c
        .list_jobs(pb::ListJobsRequest {})
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(
        listed.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        vec![id]
    );
    c.job_events(pb::JobEventsRequest { job_id: id })
        .await
        .unwrap();
    c.diagnose(pb::DiagnoseRequest {
        job_id: id,
        all: false,
    })
    .await
    .unwrap();

    // The master's secret is the master's: no person's call.
    let run_dir = PathBuf::from(&job.run_dir);
    let master = auth::read_secret(&brain::launch::credential_file(&run_dir)).unwrap();
    let mut m = common::client_with(&url, Some(master)).await;
    let refused = |what: &str, r: Result<(), tonic::Status>| match r {
        Err(e) if e.code() == Code::PermissionDenied => {}
        other => panic!("{what} with the master's secret: {other:?}"),
    };
    refused(
        "cancel",
        m.cancel_job(pb::CancelJobRequest {
            job_id: id,
            reason: String::new(),
        })
        .await
        .map(drop),
    );
    refused(
        "scale",
        m.propose_plan(pb::ProposePlanRequest {
            job_id: id,
            roles: vec![],
            migrations: vec![],
            reason: String::new(),
            force: true,
        })
        .await
        .map(drop),
    );
    refused(
        "diagnose",
        m.diagnose(pb::DiagnoseRequest {
            job_id: id,
            all: false,
        })
        .await
        .map(drop),
    );

    // brainctl with the owner's token: its job by name, another's refused, then cancelled.
    let as_owner = |args: &[&str]| common::brainctl_as(Some(&owner_file), args);
    let (ok, said) = as_owner(&["jobs", "--brain", &url]);
    assert!(
        ok && said.contains("owned") && !said.contains("other"),
        "{said}"
    );
    let (ok, said) = as_owner(&["events", "owned", "--brain", &url]);
    assert!(ok, "{said}");
    let (ok, said) = as_owner(&["cancel", "other", "--brain", &url]);
    assert!(!ok, "{said}");
    let (ok, said) = as_owner(&["cancel", "owned", "--brain", &url]);
    assert!(ok, "{said}");

    // Nothing the owner tried stuck: no node cordoned, the other job runs on.
    let (ok, said) = brainctl(&["nodes", "--brain", &url]);
    assert!(ok && !said.contains("cordoned"), "{said}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let all = common::jobs(&url).await.unwrap();
        let state = |n: &str| all.iter().find(|j| j.job_name == n).unwrap().state.clone();
        assert_eq!(state("other"), "running", "{all:#?}");
        if state("owned") == "cancelled" {
            break;
        }
        assert!(Instant::now() < deadline, "owned not cancelled: {all:#?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What an impostor on a port saw: every byte it read (after TLS, where it speaks TLS), and
/// every HTTP/2 header a client sent it, decoded (HPACK's indexes and Huffman coding undone by
/// the `h2` crate, as a real server would).
#[derive(Clone, Default)]
struct Seen {
    bytes: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    headers: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Seen {
    /// Whether the token (its hex, or any header named `authorization`) reached the impostor.
    fn got(&self, token: &str) -> Option<String> {
        let bytes = String::from_utf8_lossy(&self.bytes.lock().unwrap()).into_owned();
        let headers = self.headers.lock().unwrap().join("\n");
        (bytes.contains(token)
            || headers.contains(token)
            || headers.to_ascii_lowercase().contains("authorization"))
        .then(|| format!("headers:\n{headers}\nbytes: {bytes:?}"))
    }
}

/// A stream that copies what is read from it into `seen`.
struct Tee<S> {
    inner: S,
    seen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Tee<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let new = buf.filled()[before..].to_vec();
        self.seen.lock().unwrap().extend_from_slice(&new);
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Tee<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// An impostor on `listener`: TLS with its own certificate where `tls` is given, then an
/// HTTP/2 server that records every request's headers and answers each `unavailable`.
fn impostor(
    listener: tokio::net::TcpListener,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    seen: Seen,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (seen, tls) = (seen.clone(), tls.clone());
            tokio::spawn(async move {
                type Io = Box<dyn AsyncStream>;
                let s: Io = match tls {
                    Some(c) => match tokio_rustls::TlsAcceptor::from(c).accept(s).await {
                        Ok(t) => Box::new(t),
                        Err(_) => return,
                    },
                    None => Box::new(s),
                };
                let tee = Tee {
                    inner: s,
                    seen: seen.bytes.clone(),
                };
                let Ok(mut conn) = h2::server::handshake(tee).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    for (k, v) in req.headers() {
                        let v = String::from_utf8_lossy(v.as_bytes());
                        seen.headers.lock().unwrap().push(format!("{k}: {v}"));
                    }
                    let answer = http::Response::builder()
                        .status(200)
                        .header("content-type", "application/grpc")
                        .header("grpc-status", "14")
                        .body(())
                        .unwrap();
                    let _ = respond.send_response(answer, true);
                }
            });
        }
    })
}

trait AsyncStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> AsyncStream for T {}

/// Attack 4: with the brain down, whoever takes its port gets no token: brainctl checks the
/// server against the brain's CA before it sends anything, whether the impostor answers TLS
/// with a certificate of its own or plain HTTP/2. The impostor decodes what it gets, and is
/// first shown to catch a client that does send its token in plain HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_brain_on_the_brains_port_never_receives_the_operator_token() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut b, url) = brain(d);
    let (ok, said) = brainctl(&["jobs", "--brain", &url]);
    assert!(ok, "{said}");
    let addr = url.trim_start_matches("http://").to_string();
    b.kill();
    let token = auth::read_secret(&d.join("data/operator.token")).unwrap();
    // The port as soon as the brain (or the impostor before) has let it go.
    let take_port = || async {
        loop {
            match tokio::net::TcpListener::bind(&addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    };

    // The impostor catches a client that leaks: a plain gRPC client with the token.
    let seen = Seen::default();
    let recorder = impostor(take_port().await, None, seen.clone());
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut leaky = pb::brain_client::BrainClient::with_interceptor(
        channel,
        auth::WithToken::new(Some(token.clone())),
    );
    let _ = leaky.list_jobs(pb::ListJobsRequest::default()).await;
    recorder.abort();
    let caught = seen
        .got(token.expose())
        .expect("a plain client's token is caught");
    assert!(
        caught.contains(&format!("authorization: Bearer {}", token.expose())),
        "{caught}"
    );

    // An impostor with a certificate of its own (a CA brainctl does not know), decrypting
    // whatever comes; then one in plain HTTP/2.
    let fake_ca = d.join("fake-tls");
    auth::tls::make(&fake_ca, &[]).unwrap();
    let server = auth::tls::ServerTls {
        cert_file: fake_ca.join(auth::tls::SERVER_CERT),
        key_file: fake_ca.join(auth::tls::SERVER_KEY),
        client_ca_file: None,
    }
    .rustls()
    .unwrap();
    for tls in [Some(server), None] {
        let seen = Seen::default();
        let recorder = impostor(take_port().await, tls, seen.clone());
        let url = url.clone();
        let (ok, said) = tokio::task::spawn_blocking(move || brainctl(&["jobs", "--brain", &url]))
            .await
            .unwrap();
        assert!(!ok, "{said}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        recorder.abort();
        if let Some(what) = seen.got(token.expose()) {
            panic!("the impostor got the token:\n{what}");
        }
    }
}

/// Attack 10: a token file that is a FIFO is refused at once (brainctl hung on it), one that is
/// a link is not followed.
#[test]
fn brainctl_refuses_a_fifo_or_a_link_as_its_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_b, url) = brain(d);
    let fifo = d.join("fifo.token");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let link = d.join("link.token");
    std::os::unix::fs::symlink(d.join("data/operator.token"), &link).unwrap();
    for (file, says) in [(&fifo, "not a regular file"), (&link, "a symbolic link")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_brainctl"))
            .args(["jobs", "--brain", &url, "--token-file"])
            .arg(file)
            .arg("--ca")
            .arg(d.join("data/tls/ca.pem"))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        assert!(said.contains(says), "{said}");
    }
}
