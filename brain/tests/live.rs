//! The live brain end to end on local processes: three resource-free jobs submitted at
//! staggered times on a brain that may hand out 4 CPUs. The brain sizes them, starts their job
//! masters, resizes them as jobs arrive and finish, and is killed with SIGKILL in the middle and
//! started again on the same database. Every job must finish with each sample consumed exactly
//! once, the training processes must never hold more than the 4 CPUs, and what the brain
//! stored before the kill (plans, metric summaries) must be there after it. And the brain
//! sizing the roles of one job against each other, from the rates of the calls between them.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Brain, alive, bin_dir, brainctl, jobs, master_status, start_brain, start_brain_with};
use proto::service::v1 as pb;

const CPUS: u32 = 4;

fn spec(dir: &Path, name: &str, kind: &str, step_delay_us: u32) -> PathBuf {
    spec_max(dir, name, kind, step_delay_us, 4)
}

/// A spec of at most `max` workers.
fn spec_max(dir: &Path, name: &str, kind: &str, step_delay_us: u32, max: u32) -> PathBuf {
    let ps = if kind == "ps" { "  ps: {}\n" } else { "" };
    let text = format!(
        "name: {name}\nkind: {kind}\nroles:\n{ps}  worker:\n    min: 1\n    max: {max}\n\
         workload:\n  builtin:\n    batch_size: 128\n    step_delay_us: {step_delay_us}\n\
         data:\n  num_samples: 40000\n  shard_size: 500\n  eval_samples: 2000\n\
         epochs: 2\ncheckpoint:\n  dir: checkpoints\n  every_shards: 16\n"
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// A brain on the test's 4 CPUs whose policy is Pollux-style rounds every second, resizing a
/// job at most once per `cooldown_s`, with `spec(d, name, kind, delay)` submitted to it.
fn brain_with_job(
    d: &Path,
    cooldown_s: u32,
    name: &str,
    kind: &str,
    delay: u32,
) -> (Brain, String) {
    std::fs::write(
        d.join("policy.toml"),
        format!(
            "heuristics = []\n[scheduler]\nkind = \"pollux\"\n[live]\ninterval_s = 1\n\
             cooldown_s = {cooldown_s}\n"
        ),
    )
    .unwrap();
    let (brain, addr) = start_brain(d, "127.0.0.1:0", CPUS);
    let url = format!("http://{addr}");
    let path = spec(d, name, kind, delay);
    let (ok, text) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
    assert!(ok, "{text}");
    (brain, url)
}

/// Waits up to 300 s for the brain's first job to end; its record.
async fn first_job_ended(url: &str) -> pb::JobRecord {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let all = jobs(url).await.unwrap();
        if matches!(all[0].state.as_str(), "succeeded" | "failed" | "cancelled") {
            return all[0].clone();
        }
        assert!(Instant::now() < deadline, "the job did not end: {all:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_resource_free_jobs_share_four_cpus_through_a_brain_kill_9() {
    three_jobs_share_four_cpus("pollux", 4).await;
}

/// The same under the default scheduler, Brain's own elastic LP. Jobs of up to 4 workers
/// would each take the machine in turn (the LP serves the job closest to done first), so here
/// they take at most 3: the fourth CPU starts the next job small, which grows when the first
/// ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_jobs_share_four_cpus_under_elastic_lp() {
    three_jobs_share_four_cpus("elastic_lp", 3).await;
}

async fn three_jobs_share_four_cpus(scheduler: &str, max_workers: u32) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("policy.toml"),
        // The scheduler alone (the heuristics have tests of their own in live_heuristics.rs).
        format!(
            "heuristics = []\n[scheduler]\nkind = \"{scheduler}\"\nrestart_delay_s = 3\n\
             max_growth = 2\n[live]\ninterval_s = 1\ncooldown_s = 3\n"
        ),
    )
    .unwrap();
    let (mut brain, addr) = start_brain(d, "127.0.0.1:0", CPUS);
    let url = format!("http://{addr}");

    // Watch what the training processes hold, through every job master, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU32::new(0));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let watcher = {
        let (stop, peak, seen, url) = (stop.clone(), peak.clone(), seen.clone(), url.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Some(jobs) = jobs(&url).await {
                    let mut total = 0;
                    let mut line = Vec::new();
                    for j in jobs.iter().filter(|j| j.state == "running") {
                        if let Some(n) = alive(&j.master_address, &j.run_dir).await {
                            total += n;
                            line.push(format!("{}:{n}", j.job_name));
                        }
                    }
                    peak.fetch_max(total, Ordering::Relaxed);
                    let line = line.join(" ");
                    let mut seen = seen.lock().unwrap();
                    if seen.last() != Some(&line) {
                        seen.push(line);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let specs = [
        spec_max(d, "free-a", "allreduce", 600, max_workers),
        spec_max(d, "free-b", "ps", 600, max_workers),
        spec_max(d, "free-c", "allreduce", 600, max_workers),
    ];
    let submit = |path: &Path| {
        let (ok, text) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
        assert!(ok, "{text}");
        assert!(
            text.contains("queued") && text.contains("worker replicas"),
            "{text}"
        );
    };
    submit(&specs[0]);
    tokio::time::sleep(Duration::from_secs(6)).await;
    submit(&specs[1]);
    tokio::time::sleep(Duration::from_secs(6)).await;
    submit(&specs[2]);
    tokio::time::sleep(Duration::from_secs(3)).await;

    // What the brain would do now, and why.
    let (ok, text) = brainctl(&["plan", "--dry-run", "--brain", &url]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("scheduler {scheduler}")) && text.contains("free-"),
        "{text}"
    );
    // Role by role: the ps job's training group (`worker`) and its parameter servers.
    let ps_job = text.lines().find(|l| l.contains("free-b")).unwrap_or("");
    assert!(
        ps_job.contains(" worker ") && ps_job.contains(", ps "),
        "{text}"
    );

    // kill -9 in the middle; what it stored must survive.
    let before = jobs(&url).await.unwrap();
    brain.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut brain, addr2) = start_brain(d, &addr, CPUS);
    assert_eq!(addr2, addr);
    let after = jobs(&url).await.unwrap();
    for b in &before {
        let a = after.iter().find(|a| a.job_id == b.job_id).unwrap();
        assert!(a.reports >= b.reports, "{b:?} -> {a:?}");
        assert!(a.plan_version >= b.plan_version, "{b:?} -> {a:?}");
        assert_eq!(a.reasons, b.reasons);
    }

    // Every job ends.
    let deadline = Instant::now() + Duration::from_secs(300);
    let done = loop {
        let all = jobs(&url).await.unwrap();
        if all.len() == 3
            && all
                .iter()
                .all(|j| j.state == "succeeded" || j.state == "failed")
        {
            break all;
        }
        assert!(
            Instant::now() < deadline,
            "jobs did not end: {all:#?}\nprocesses seen: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    stop.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    let seen = seen.lock().unwrap().clone();
    eprintln!("processes per job over time: {seen:#?}");
    for j in &done {
        assert_eq!(j.state, "succeeded", "{j:#?}");
        assert!(j.outcome.contains("exactly-once: ok"), "{j:#?}");
        let report: serde_json::Value = serde_json::from_slice(
            &std::fs::read(Path::new(&j.run_dir).join("master/report.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(report["exactly_once"], "ok", "{report}");
        for (_, n) in report["samples_per_epoch"].as_object().unwrap() {
            assert_eq!(n.as_u64(), Some(40_000), "{report}");
        }
    }
    assert!(
        peak.load(Ordering::Relaxed) <= CPUS,
        "the training processes held {} CPUs of {CPUS}: {seen:#?}",
        peak.load(Ordering::Relaxed)
    );
    // The brain resized running jobs (as others arrived and finished), and they carried it out.
    let plans: u64 = done.iter().map(|j| j.plan_version).sum();
    let reached: u64 = done.iter().map(|j| j.reached_version).sum();
    assert!(plans >= 2, "{done:#?}\n{seen:#?}");
    assert!(reached >= 2, "{done:#?}");

    // Prometheus' scrape needs the metrics token (beside the operator token).
    let (status, refused) = common::get(&addr, "/metrics", None);
    assert!(
        status == 401 && refused.contains("metrics token"),
        "{status} {refused}"
    );
    let metrics = common::scrape(&addr);
    assert!(
        metrics.contains("brain_jobs{state=\"succeeded\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("brain_round_solve_seconds_count"),
        "{metrics}"
    );
    brain.kill();
}

/// kill -9 of a job master the brain started, after a checkpoint: the brain starts it again
/// with `--resume`, says so in the job's reasons, and the job still ends with every sample
/// applied by its PS exactly once per epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_job_master_is_started_again_and_its_job_ends_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut brain, url) = brain_with_job(d, 3, "resumed", "ps", 600);
    // Running, with a checkpoint to go on from.
    let deadline = Instant::now() + Duration::from_secs(120);
    let run_dir = loop {
        let all = jobs(&url).await.unwrap_or_default();
        if let Some(j) = all
            .iter()
            .find(|j| j.state == "running" && !j.run_dir.is_empty())
        {
            let ctx = std::fs::read(Path::new(&j.run_dir).join("master/job-context.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
            if ctx.is_some_and(|c| c["checkpoints"].as_array().is_some_and(|a| !a.is_empty())) {
                break j.run_dir.clone();
            }
        }
        assert!(Instant::now() < deadline, "no checkpoint: {all:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pid = common::master_pid(&run_dir).expect("the job master runs");
    test_support::kill9(pid);

    let job = first_job_ended(&url).await;
    assert_eq!(job.state, "succeeded", "{job:#?}");
    assert!(
        job.reasons
            .iter()
            .any(|r| r.contains("started again with --resume") && r.contains("attempt 1 of 3")),
        "{job:#?}"
    );
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(Path::new(&run_dir).join("master/report.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["exactly_once"], "ok", "{report}");
    let events = report["events"].to_string();
    assert!(events.contains("the job master restarted"), "{report}");
    for ps in report["ps_stats"].as_array().unwrap() {
        assert_eq!(ps["applied_samples"].as_u64(), Some(2 * 40_000), "{ps}");
    }
    // The operator's diagnosis, through the brain: the kill and the restart it cost.
    let (ok, text) = brainctl(&["diagnose", "resumed", "--brain", &url]);
    assert!(ok, "{text}");
    assert!(text.contains("job resumed (ps): succeeded"), "{text}");
    assert!(text.contains("effective training time:"), "{text}");
    assert!(text.contains("the job master restarted"), "{text}");
    let (ok, text) = brainctl(&["diagnose", "no-such-job", "--brain", &url]);
    assert!(!ok && text.contains("no-such-job"), "{text}");
    brain.kill();
}

/// A job whose master cannot write its state (its run directory removed under it) fails once
/// the writes have failed for the policy's `live.state_write_give_up_s` (4 s here, against 60
/// by default), with the reason, and `/metrics` counts the failed writes meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_state_cannot_be_written_fails_at_the_policy_s_give_up_time() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("policy.toml"),
        "heuristics = []\n[live]\ninterval_s = 1\ncooldown_s = 3600\nstate_write_give_up_s = 4\n",
    )
    .unwrap();
    let (mut brain, addr) = start_brain(d, "127.0.0.1:0", CPUS);
    let url = format!("http://{addr}");
    let path = spec(d, "diskless", "allreduce", 3000);
    let (ok, text) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
    assert!(ok, "{text}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let run_dir = loop {
        let all = jobs(&url).await.unwrap_or_default();
        if let Some(j) = all
            .iter()
            .find(|j| j.state == "running" && !j.run_dir.is_empty())
            && Path::new(&j.run_dir)
                .join("master/job-context.json")
                .exists()
        {
            break PathBuf::from(&j.run_dir);
        }
        assert!(Instant::now() < deadline, "not running: {all:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    std::fs::remove_dir_all(run_dir.join("master")).unwrap();
    let counted = |metrics: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("brain_job_state_write_failures{job=\"diskless\"} "))
            .and_then(|n| n.trim().parse::<u64>().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = common::scrape(&url);
        if counted(&metrics).is_some_and(|n| n > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no failed write counted: {:?}",
            counted(&metrics)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let job = first_job_ended(&url).await;
    assert_eq!(job.state, "failed", "{job:#?}");
    let reason = &job.outcome;
    assert!(reason.contains("cannot persist job context"), "{job:#?}");
    let for_s: u64 = reason
        .split("writes failing for ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("how long: {reason}"));
    assert!(
        (4..30).contains(&for_s),
        "gave up after {for_s} s: {reason}"
    );
    brain.kill();
}

#[tokio::test]
async fn bad_submissions_get_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("policy.toml"), "[live]\ninterval_s = 60\n").unwrap();
    // One CPU: the accepted job (at least 2 workers) stays queued and nothing starts.
    let (mut brain, addr) = start_brain(d, "127.0.0.1:0", 1);
    let url = format!("http://{addr}");
    let good = spec(d, "ok-job", "allreduce", 0);
    let text = std::fs::read_to_string(&good)
        .unwrap()
        .replace("min: 1", "min: 2");
    std::fs::write(&good, &text).unwrap();
    let command = text.replace(
        &text[text.find("  builtin:").unwrap()..text.find("data:").unwrap()],
        "  command: [python3, train.py]\n",
    );
    assert!(command.contains("command: [python3"), "{command}");
    let bad = |name: &str, body: String| {
        let p = d.join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    let cases = [
        (
            bad("typo.yaml", text.replace("min: 2", "mni: 2")),
            "roles.worker: unknown field `mni`",
        ),
        (
            bad("bounds.yaml", text.replace("min: 2", "min: 6")),
            "roles.worker.min: 6 is greater than max 4",
        ),
        (
            bad(
                "noname.yaml",
                text.replace("name: ok-job", "name: \"bad name\""),
            ),
            "name",
        ),
        (
            bad("ps.yaml", text.replace("kind: allreduce", "kind: ps")),
            "roles.ps",
        ),
        // What a job may run: no program the policy does not name, no environment that
        // changes what runs, nothing outside its run directory, no platform of its own.
        (
            bad("command.yaml", command.clone()),
            "the operator's policy allows no `command:` jobs",
        ),
        (
            bad(
                "preload.yaml",
                text.replace(
                    "workload:\n",
                    "workload:\n  env: { LD_PRELOAD: /tmp/x.so }\n",
                ),
            ),
            "LD_PRELOAD may not be set",
        ),
        (
            bad(
                "escape.yaml",
                text.replace("dir: checkpoints", "dir: ../../elsewhere"),
            ),
            "outside the job's run directory",
        ),
        (
            bad(
                "platform.yaml",
                format!("{text}platform: {{ type: local, agent_bin: /bin/sh }}\n"),
            ),
            "where a job runs is the brain's choice",
        ),
    ];
    for (path, says) in &cases {
        let (ok, out) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
        assert!(!ok, "{} was accepted: {out}", path.display());
        assert!(
            out.contains(says),
            "{}: expected {says:?} in {out}",
            path.display()
        );
    }
    assert_eq!(jobs(&url).await.unwrap().len(), 0);
    // A name is used once.
    let (ok, out) = brainctl(&["submit", good.to_str().unwrap(), "--brain", &url]);
    assert!(ok, "{out}");
    let (ok, out) = brainctl(&["submit", good.to_str().unwrap(), "--brain", &url]);
    assert!(
        !ok && out.contains("the name \"ok-job\" is taken by job 1"),
        "{out}"
    );
    let all = jobs(&url).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].state, "queued", "{all:?}");
    let (ok, out) = brainctl(&["plan", "--dry-run", "--brain", &url]);
    assert!(ok && out.contains("waits"), "{out}");
    // Its status says why it waits, as the brain's round decided.
    let (ok, out) = brainctl(&["status", "ok-job", "--brain", &url]);
    assert!(ok && out.contains("waiting: "), "{out}");
    // Cancelling: an unknown job is refused; the queued one is cancelled before it starts, and
    // a second cancel says it has ended.
    let (ok, out) = brainctl(&["cancel", "nope", "--brain", &url]);
    assert!(!ok && out.contains("no job named \"nope\""), "{out}");
    let (ok, out) = brainctl(&["cancel", "ok-job", "--brain", &url]);
    assert!(
        ok && out.contains("ok-job cancelled before it started"),
        "{out}"
    );
    let all = jobs(&url).await.unwrap();
    assert_eq!(all[0].state, "cancelled", "{all:?}");
    let (ok, out) = brainctl(&["cancel", "ok-job", "--brain", &url]);
    assert!(
        !ok && out.contains("job ok-job already cancelled: nothing to cancel"),
        "{out}"
    );
    // A policy that does not parse is refused and the one in force stays.
    let bad_policy = bad("bad.toml", "[live]\ninterval_s = -1\n".into());
    let (ok, out) = brainctl(&[
        "policy",
        "set",
        bad_policy.to_str().unwrap(),
        "--brain",
        &url,
    ]);
    assert!(!ok && out.contains("live.interval_s is -1"), "{out}");
    let (ok, out) = brainctl(&["policy", "show", "--brain", &url]);
    assert!(ok && out.contains("interval_s = 60"), "{out}");
    let good_policy = bad(
        "good.toml",
        "[live]\ninterval_s = 30\ncooldown_s = 10\n[submissions]\ncommands = [\"python3 train.py ...\"]\n"
            .into(),
    );
    let (ok, out) = brainctl(&[
        "policy",
        "set",
        good_policy.to_str().unwrap(),
        "--brain",
        &url,
    ]);
    assert!(ok, "{out}");
    // In force, kept by the brain; the file it was started with is not rewritten.
    let (ok, out) = brainctl(&["policy", "show", "--brain", &url]);
    assert!(
        ok && out.contains("commands = [\"python3 train.py ...\"]"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("policy.toml")).unwrap(),
        "[live]\ninterval_s = 60\n"
    );
    // The program the policy now names is accepted (and waits for room like any job).
    let cmd = bad(
        "command-ok.yaml",
        command.replace("name: ok-job", "name: cmd-job"),
    );
    let (ok, out) = brainctl(&["submit", cmd.to_str().unwrap(), "--brain", &url]);
    assert!(ok, "{out}");
    let (ok, out) = brainctl(&["plan", "--brain", &url]);
    assert!(!ok && out.contains("--dry-run"), "{out}");
    brain.kill();
}

/// A size beyond the cluster's capacity, which the next round would undo at once, is refused
/// with the round's reason and changes nothing; `--force` proposes it anyway, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_beyond_capacity_is_refused_with_the_reason_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Two CPUs; the job may take up to four workers of one CPU each.
    let (mut brain, url) = common::still_brain(d, 2);
    let path = spec(d, "big", "allreduce", 300);
    let (ok, text) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
    assert!(ok, "{text}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !jobs(&url)
        .await
        .unwrap_or_default()
        .iter()
        .any(|j| j.state == "running")
    {
        assert!(Instant::now() < deadline, "not running");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (ok, said) = brainctl(&["scale", "big", "--workers", "4", "--brain", &url]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("the brain's next round would change big again at once")
            && said.contains("slots of 2")
            && said.contains("nothing changed (`brainctl scale --force` proposes it anyway)"),
        "{said}"
    );
    assert!(
        !said.contains("panicked") && !said.contains("backtrace"),
        "{said}"
    );
    let (ok, said) = brainctl(&["status", "big", "--brain", &url]);
    assert!(ok && !said.contains("by hand"), "no plan was made: {said}");
    let (ok, said) = brainctl(&["scale", "big", "--workers", "4", "--force", "--brain", &url]);
    assert!(ok, "{said}");
    assert!(
        said.contains("plan 1 proposed for big")
            && said.contains(
                "note: proposed anyway (--force): the brain's next round would change big again"
            ),
        "{said}"
    );
    brain.kill();
}

/// An operator resizes a brain-managed job through the brain (`brainctl scale`), whose job
/// master refuses plans from anywhere else; counts the job cannot take are refused with the
/// reason and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_scales_a_brain_managed_job_through_the_brain_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // No resize of a job within 10 minutes of its last change: the operator's plan is the only
    // one.
    let (mut brain, url) = brain_with_job(d, 600, "scaled", "allreduce", 300);
    let deadline = Instant::now() + Duration::from_secs(120);
    let (master, run_dir) = loop {
        let all = jobs(&url).await.unwrap_or_default();
        if let Some(j) = all
            .iter()
            .find(|j| j.state == "running" && !j.master_address.is_empty())
        {
            break (j.master_address.clone(), j.run_dir.clone());
        }
        assert!(Instant::now() < deadline, "not running: {all:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Straight to the job master: without the job's secret, refused; with it, refused, the
    // brain named.
    let out = std::process::Command::new(bin_dir().join("job-master"))
        .args(["scale", "--master", &master, "--workers", "3"])
        .env_remove(auth::JOB_TOKEN_ENV)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("--token-file"), "{said}");
    let out = std::process::Command::new(bin_dir().join("job-master"))
        .args([
            "scale",
            "--master",
            &master,
            "--workers",
            "3",
            "--token-file",
        ])
        .arg(brain::launch::job_secret_file(Path::new(&run_dir)))
        // The brain's jobs run with TLS inside them: the job's own certificate.
        .arg("--tls-dir")
        .arg(Path::new(&run_dir).join("master").join(auth::tls::JOB_DIR))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("job scaled is managed by the brain at https://")
            && said.contains(url.trim_start_matches("http://")),
        "{said}"
    );

    // Through the brain: counts the job cannot take are refused with the reason.
    let (ok, said) = brainctl(&["scale", "scaled", "--workers", "9", "--brain", &url]);
    assert!(!ok);
    assert!(
        said.contains("job scaled: 9 workers is outside the job's bounds [1, 4]; nothing changed"),
        "{said}"
    );
    let (ok, said) = brainctl(&["scale", "scaled", "--ps", "2", "--brain", &url]);
    assert!(!ok);
    assert!(
        said.contains("an allreduce job has no parameter servers"),
        "{said}"
    );
    let (ok, said) = brainctl(&["scale", "scaled", "--brain", &url]);
    assert!(!ok);
    assert!(
        said.contains("--workers N, --ps M and/or --role NAME=N"),
        "{said}"
    );
    let (ok, said) = brainctl(&["scale", "scaled", "--role", "critic=1", "--brain", &url]);
    assert!(!ok);
    assert!(
        said.contains("job scaled: the job has no critic role; nothing changed"),
        "{said}"
    );

    // A count it can take: a versioned plan its job master carries out.
    let (ok, said) = brainctl(&["scale", "scaled", "--workers", "3", "--brain", &url]);
    assert!(ok, "{said}");
    // The operator is told how long the brain keeps this size.
    assert!(
        said.contains(
            "note: the brain's rounds keep this size for the policy's cool-down of 600 s"
        ),
        "{said}"
    );
    let version: u64 = said
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no plan version in {said:?}"));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let s = master_status(&master, &run_dir).await.unwrap();
        if s.reached_plan_version >= version {
            assert_eq!(alive(&master, &run_dir).await, Some(3), "{s:#?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "plan {version} not reached: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // While it runs: its events and a worker's output through the brain (issue 44, item 2).
    let (ok, events) = brainctl(&["events", "scaled", "--brain", &url]);
    assert!(ok && events.contains("plan"), "{events}");
    // The job runs to its end at the operator's size.
    let job = first_job_ended(&url).await;
    assert_eq!(job.state, "succeeded", "{job:#?}");
    // Its plan with the operator's reason and the master's answer; its output, plain text,
    // followed to the end; a process it never had is named with those it had.
    let (ok, status) = brainctl(&["status", "scaled", "--brain", &url]);
    assert!(
        ok && status.contains(&format!("v{version} by hand (brainctl scale): accepted")),
        "{status}"
    );
    let (ok, log) = brainctl(&[
        "logs", "scaled", "--role", "worker", "--index", "2", "--follow", "--brain", &url,
    ]);
    assert!(
        ok && log.contains("INFO") && !log.contains('\u{1b}'),
        "{log}"
    );
    let (ok, out) = brainctl(&["logs", "scaled", "--index", "7", "--brain", &url]);
    assert!(
        !ok && out.contains("no output of worker-7; there is output of")
            && out.contains("worker-2"),
        "{out}"
    );
    // The same from the run directory alone, without the brain.
    let out = std::process::Command::new(bin_dir().join("job-master"))
        .arg("events")
        .arg(Path::new(&run_dir).join("master"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        events_after(&url, "scaled")
    );
    let out = std::process::Command::new(bin_dir().join("job-master"))
        .arg("logs")
        .arg(Path::new(&run_dir).join("master"))
        .args(["--index", "2", "--follow"])
        .output()
        .unwrap();
    assert!(out.status.success());
    // brainctl's output holds the file's name (on stderr) before its text.
    let text: String = log
        .lines()
        .filter(|l| !l.starts_with("== "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(String::from_utf8_lossy(&out.stdout), text);
    brain.kill();
}

/// The job's events as `brainctl events` prints them now.
fn events_after(url: &str, job: &str) -> String {
    let (ok, out) = brainctl(&["events", job, "--brain", url]);
    assert!(ok, "{out}");
    out
}

/// An operator cancels a running job through the brain: its job master takes a last
/// checkpoint, stops every process and the job is recorded as cancelled, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cancels_a_running_job_which_checkpoints_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut brain, url) = brain_with_job(d, 600, "doomed", "ps", 300);
    let deadline = Instant::now() + Duration::from_secs(120);
    let (master, run_dir) = loop {
        let all = jobs(&url).await.unwrap_or_default();
        if let Some(j) = all
            .iter()
            .find(|j| j.state == "running" && j.samples_done > 0)
        {
            break (j.master_address.clone(), j.run_dir.clone());
        }
        assert!(Instant::now() < deadline, "not training: {all:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (ok, out) = brainctl(&[
        "cancel",
        "doomed",
        "--reason",
        "wrong data",
        "--brain",
        &url,
    ]);
    assert!(ok && out.contains("doomed is being cancelled"), "{out}");
    let job = first_job_ended(&url).await;
    assert_eq!(job.state, "cancelled", "{job:#?}");
    assert!(
        job.outcome
            .contains("cancelled: asked through the brain: wrong data (after checkpoint"),
        "{job:#?}"
    );
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(Path::new(&run_dir).join("master/report.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["phase"], "cancelled");
    assert!(report["checkpoints"].as_u64().unwrap() >= 1, "{report:#}");
    // Nothing of the job runs any more: its master is gone, and so are its processes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while common::master_pid(&run_dir).is_some() || alive(&master, &run_dir).await.is_some() {
        assert!(Instant::now() < deadline, "the job master still runs");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (ok, out) = brainctl(&["cancel", "doomed", "--brain", &url]);
    assert!(!ok && out.contains("already cancelled"), "{out}");
    brain.kill();
}

/// A job master run by hand with a brain of `cpus` CPUs: a job whose training group (two
/// workers of `worker_cpu`, `worker_min` to 4) and driver (a `single` role, two threads) keep
/// calling a rollout role of one engine (`rollout_cpu`, up to 3, of `topology`: `service` or
/// a further `allreduce` group) that serves one episode at a time. The SDK counts the calls; the job master turns them into the rollout role's rates and
/// sends them to the brain. Killed when dropped.
struct RoleJob {
    dir: tempfile::TempDir,
    _brain: Brain,
    master: std::process::Child,
}

impl Drop for RoleJob {
    fn drop(&mut self) {
        let _ = self.master.kill();
        let _ = self.master.wait();
    }
}

impl RoleJob {
    fn start(
        python: &str,
        sdk: &Path,
        cpus: u32,
        worker: (u32, f64),
        (rollout_cpu, topology): (f64, &str),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("policy.toml"),
            // A cool-down for the first rates to come in before the first resize (the brain
            // also holds the workers until the rates cover a window: `[live.roles]
            // measure_s`; a cool-down alone did not suffice on a loaded 2-core CI run).
            "heuristics = []\n[live]\ninterval_s = 1\ncooldown_s = 20\n",
        )
        .unwrap();
        let (brain, addr) = start_brain(d, "127.0.0.1:0", cpus);
        let url = format!("http://{addr}");
        std::fs::write(
            d.join("engine.py"),
            "import threading, time\n\
             class Engine:\n    def __init__(self):\n        self.lock = threading.Lock()\n\
             \x20   def episode(self, n):\n        with self.lock:\n            time.sleep(0.1)\n\
             \x20       return n\n",
        )
        .unwrap();
        std::fs::write(
            d.join("driver.py"),
            "import threading, time\nfrom brain_sdk import roles\n\
             g = roles.group('rollout', timeout=60)\n\
             def loop():\n    i = 0\n    while True:\n        g.call('episode', i)\n        i += 1\n\
             for _ in range(2):\n    threading.Thread(target=loop, daemon=True).start()\n\
             while True:\n    time.sleep(1)\n",
        )
        .unwrap();
        // The training group's program: each worker keeps calling the engine too.
        std::fs::write(
            d.join("worker.py"),
            "from brain_sdk import roles\ng = roles.group('rollout', timeout=60)\ni = 0\n\
             while True:\n    g.call('episode', i)\n    i += 1\n",
        )
        .unwrap();
        let env = format!("env: {{ PYTHONPATH: {:?} }}", sdk.display().to_string());
        let spec = d.join("balance.yaml");
        std::fs::write(
            &spec,
            format!(
                "name: balance-{pid}-{cpus}\nkind: allreduce\nroles:\n  \
                 worker: {{ replicas: 2, min: {min}, max: 4, resources: {{ cpu: {wcpu} }} }}\n  \
                 driver: {{ topology: single, command: [{python:?}, {driver:?}], {env}, \
                 resources: {{ cpu: 0.25 }} }}\n  \
                 rollout: {{ topology: {topology}, replicas: 1, min: 1, max: 3, \
                 command: [{python:?}, -m, \
                 brain_sdk.roles, {engine:?}], {env}, resources: {{ cpu: {rcpu} }} }}\n\
                 workload:\n  command: [{python:?}, {worker:?}]\n  {env}\n\
                 data: {{ num_samples: 60000, shard_size: 1000 }}\n\
                 checkpoint: {{ dir: {ckpt:?} }}\n",
                pid = std::process::id(),
                min = worker.0,
                wcpu = worker.1,
                rcpu = rollout_cpu,
                driver = d.join("driver.py").display().to_string(),
                worker = d.join("worker.py").display().to_string(),
                engine = format!("{}:Engine", d.join("engine.py").display()),
                ckpt = d.join("ckpt").display().to_string(),
            ),
        )
        .unwrap();
        let mut master = std::process::Command::new(bin_dir().join("job-master"));
        master
            .arg("run")
            .arg(&spec)
            .arg("--run-dir")
            .arg(d.join("run"))
            .args(["--listen", "127.0.0.1:0", "--brain", &url])
            .args(["--brain-interval-ms", "300"])
            .arg("--brain-token-file")
            .arg(common::token_file(&url))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(d.join("job-master.log")).unwrap());
        match common::own_ca(&url) {
            Some(ca) => master.arg("--brain-ca").arg(ca),
            None => master.arg("--brain-insecure"),
        };
        let master = master.spawn().unwrap();
        RoleJob {
            dir,
            _brain: brain,
            master,
        }
    }

    /// `job-master status` now.
    fn status(&self) -> String {
        let out = std::process::Command::new(bin_dir().join("job-master"))
            .arg("status")
            .arg("--run-dir")
            .arg(self.dir.path().join("run"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Waits up to 120 s for `done` of the status (`what`); the status then.
    async fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.status();
            if done(&s) {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{what}: {s}\n{}",
                std::fs::read_to_string(self.dir.path().join("job-master.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Whether process `key` runs, by a `job-master status`.
fn runs(s: &str, key: &str) -> bool {
    s.lines()
        .any(|l| l.starts_with(&format!("{key} ")) && l.contains("running"))
}

/// The brain sizes roles within a job (issue 41, item 6), on a [`RoleJob`] with room (8 CPUs,
/// workers of 0.5, engines of 0.25): the rollout role's callers, the workers among them, wait
/// nearly all their time for it, and it is busy all of its own. The brain's round grows the
/// role to its max of 3, and holds the workers at 2 though there is room for more (more
/// workers would wait as well): they are never resized or restarted (they keep their first
/// incarnation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brain_grows_the_role_its_job_waits_for() {
    let Some((python, sdk)) = test_support::torch_with_sdk() else {
        return;
    };
    let job = RoleJob::start(&python, &sdk, 8, (2, 0.5), (0.25, "service"));
    let first = job
        .wait_for("the workers did not start", |s| {
            runs(s, "worker-0") && runs(s, "worker-1")
        })
        .await;
    let s = job
        .wait_for("the rollout role did not grow to 3", |s| {
            runs(s, "rollout-2")
        })
        .await;
    // Its rates, as the job master measured them from the SDK's counts.
    assert!(
        s.contains("calls between roles")
            && s.lines().any(|l| l.trim_start().starts_with("rollout ")),
        "{s}"
    );
    // The workers wait for the engine too: held at 2 (never a third), and the training
    // group went on: its workers are still their first incarnation.
    assert!(
        !s.lines().any(|l| l.starts_with("worker-2 ")),
        "the workers were grown: {s}"
    );
    assert!(s.contains("callers by role: driver ×1"), "{s}");
    for w in ["worker-0", "worker-1"] {
        let line = s.lines().find(|l| l.starts_with(&format!("{w} "))).unwrap();
        assert_eq!(
            line.split_whitespace().nth(1),
            Some("1"),
            "{w} was restarted: {s}\n(first: {first})"
        );
    }
}

/// The same job with its rollout role a further all-reduce group (`topology: allreduce`, a
/// command of its own): the brain grows it as it would a service role, to its max of 3 in one
/// plan, and the resize restarts the group (its first engine is in its second incarnation:
/// the group forms again at its new size), while the workers go on in their first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brain_grows_a_further_all_reduce_group_its_job_waits_for_restarting_it_alone() {
    let Some((python, sdk)) = test_support::torch_with_sdk() else {
        return;
    };
    let job = RoleJob::start(&python, &sdk, 8, (2, 0.5), (0.25, "allreduce"));
    job.wait_for("the workers did not start", |s| {
        runs(s, "worker-0") && runs(s, "worker-1")
    })
    .await;
    job.wait_for("the rollout group did not grow to 3", |s| {
        runs(s, "rollout-1") && runs(s, "rollout-2")
    })
    .await;
    let incarnation = |s: &str, key: &str| {
        let line = s.lines().find(|l| l.starts_with(&format!("{key} ")));
        line.and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
    };
    let s = job
        .wait_for("rollout-0 was not restarted by the resize", |s| {
            runs(s, "rollout-0") && incarnation(s, "rollout-0").as_deref() != Some("1")
        })
        .await;
    for w in ["worker-0", "worker-1"] {
        assert_eq!(
            incarnation(&s, w).as_deref(),
            Some("1"),
            "{w} restarted: {s}"
        );
    }
    assert!(!runs(&s, "worker-2"), "the workers were grown: {s}");
}

/// With no room for the engine (4 CPUs; the driver and one engine of 1 CPU hold 1.25, the two
/// workers of 1 CPU 2, and 0.75 is left), the workers, waiting most of their time for it, give
/// one of theirs: the training group goes down to one worker, and the engine grows into the
/// CPU it freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_that_wait_for_a_role_give_it_one_of_theirs_when_no_room_is_left() {
    let Some((python, sdk)) = test_support::torch_with_sdk() else {
        return;
    };
    let job = RoleJob::start(&python, &sdk, 4, (1, 1.0), (1.0, "service"));
    job.wait_for("the workers did not start", |s| {
        runs(s, "worker-0") && runs(s, "worker-1")
    })
    .await;
    let s = job
        .wait_for("the engines did not grow", |s| runs(s, "rollout-1"))
        .await;
    assert!(!runs(&s, "worker-1"), "worker-1 still runs: {s}");
    assert!(runs(&s, "worker-0"), "{s}");
}

/// GPU use as the agents sample it (here from the device stand-in, `BRAIN_GPU_STANDIN`, on a
/// machine without a GPU; NVML on one with) reaches `brainctl jobs` and `/metrics`, per
/// process and per job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_use_the_agents_sample_reaches_brainctl_jobs_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("policy.toml"),
        "heuristics = []\n[live]\ninterval_s = 1\ncooldown_s = 3600\n",
    )
    .unwrap();
    let gpus = d.join("gpus.json");
    std::fs::write(
        &gpus,
        r#"{"devices": [{"utilisation_pct": 37, "memory_bytes": 566231040}]}"#,
    )
    .unwrap();
    // Readable by the job's user too (the agents run as the brain's user; the file is theirs).
    let (mut brain, addr) = start_brain_with(d, "127.0.0.1:0", 4, |cmd| {
        cmd.env("BRAIN_GPU_STANDIN", &gpus);
    });
    let url = format!("http://{addr}");
    let path = spec_max(d, "gpu-seen", "allreduce", 4000, 2);
    let (ok, out) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
    assert!(ok, "{out}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let job = loop {
        let all = jobs(&url).await.unwrap_or_default();
        // Every worker's report in (they start a moment apart).
        if let Some(j) = all.iter().find(|j| {
            j.shape
                .as_ref()
                .and_then(brain::console::pages::training)
                .is_some_and(|t| t.count > 0 && j.gpu_processes.len() == t.count as usize)
        }) {
            break j.clone();
        }
        assert!(Instant::now() < deadline, "no GPU use reported: {all:#?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(job.gpu_utilisation_pct, 37.0, "{job:#?}");
    // Each process's 540 MiB, summed over the job's.
    let processes = job.gpu_processes.len() as u64;
    assert_eq!(job.gpu_memory_bytes, processes * 566_231_040, "{job:#?}");
    let (ok, out) = brainctl(&["jobs", "--brain", &url]);
    assert!(ok, "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("gpu-seen") || l.contains(" gpu-seen "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains(" 37 ") && row.contains(&format!(" {} ", processes * 540)),
        "{out}"
    );
    assert!(out.contains("worker-0 37% 540 MiB"), "{out}");
    let metrics = common::scrape(&addr);
    assert!(
        metrics.contains("brain_job_gpu_utilisation_pct{job=\"gpu-seen\"} 37"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "brain_process_gpu_memory_bytes{job=\"gpu-seen\",role=\"worker\",index=\"0\"} 566231040"
        ),
        "{metrics}"
    );
    let (ok, out) = brainctl(&["cancel", "gpu-seen", "--brain", &url]);
    assert!(ok, "{out}");
    brain.kill();
}

/// A job whose all-reduce group is named `actor` (`topology: allreduce`), through the brain:
/// sized at submission under that name, grown by the brain's own rounds with plans that name
/// it (a plan naming `worker` would be refused by its master), resized by an operator by name
/// (`--workers` refused with the group's name), shown as `actor` by `brainctl jobs`, and ended
/// with every sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brain_sizes_grows_and_scales_a_training_group_by_its_own_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("policy.toml"),
        "heuristics = []\n[scheduler]\nkind = \"pollux\"\nmax_growth = 2\n[live]\n\
         interval_s = 1\ncooldown_s = 10\n",
    )
    .unwrap();
    let (mut brain, addr) = start_brain(d, "127.0.0.1:0", CPUS);
    let url = format!("http://{addr}");
    let text = std::fs::read_to_string(spec(d, "named", "allreduce", 1500))
        .unwrap()
        .replace(
            "  worker:\n    min: 1",
            "  actor:\n    topology: allreduce\n    replicas: 1\n    min: 1",
        );
    let path = d.join("named-actor.yaml");
    std::fs::write(&path, text).unwrap();
    let (ok, said) = brainctl(&["submit", path.to_str().unwrap(), "--brain", &url]);
    assert!(ok && said.contains("queued"), "{said}");

    // The brain's round grows the lone job past the 1 it asked for: its plan names `actor`,
    // which the master takes.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (master, run_dir) = loop {
        let all = jobs(&url).await.unwrap_or_default();
        if let Some(j) = all.first()
            && j.state == "running"
            && j.reached_version >= 1
            && let Some(s) = master_status(&j.master_address, &j.run_dir).await
            && s.processes.iter().filter(|p| p.role == "actor").count() > 1
        {
            assert!(s.processes.iter().all(|p| p.role == "actor"), "{s:?}");
            break (j.master_address.clone(), j.run_dir.clone());
        }
        assert!(Instant::now() < deadline, "not grown: {all:#?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let (ok, listed) = brainctl(&["jobs", "--brain", &url]);
    assert!(ok && listed.contains(" actor "), "{listed}");
    let (ok, one) = brainctl(&["status", "named", "--brain", &url]);
    assert!(ok && one.contains("actor (its training group)"), "{one}");

    // By hand: `--workers` names a role the job does not have; `--role actor=N` is the way.
    let (ok, said) = brainctl(&["scale", "named", "--workers", "2", "--brain", &url]);
    assert!(!ok);
    assert!(
        said.contains("the job has no worker role: its training group is actor"),
        "{said}"
    );
    let (ok, said) = brainctl(&["scale", "named", "--role", "actor=1", "--brain", &url]);
    assert!(ok, "{said}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(s) = master_status(&master, &run_dir).await
            && s.processes
                .iter()
                .filter(|p| p.role == "actor" && p.state != "removed")
                .count()
                == 1
        {
            break;
        }
        assert!(Instant::now() < deadline, "not scaled to 1 actor");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let j = first_job_ended(&url).await;
    assert_eq!(j.state, "succeeded", "{j:#?}");
    assert!(j.outcome.contains("exactly-once: ok"), "{j:#?}");
    // The round's growth and the operator's shrink, both carried out.
    assert!(j.reached_version >= 2, "{j:#?}");
    brain.kill();
}
