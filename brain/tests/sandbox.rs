//! Jobs never run as the brain's user (issue 40, attack 5): a `command:` job the operator
//! allows runs as the unprivileged `--run-as` user (when the tests run as root) inside
//! bubblewrap, and tries what a hostile job would: read the brain's data directory and the
//! operator token, see its master's credential with the brain, write into its own code. It
//! sees its checkpoint directory (writable), its own copy of the job's secret, its code read
//! only, and nothing of the brain's. An interpreter's `-c` is no way around the allow-list;
//! a brain that runs as root refuses to start without a user for its jobs.
//!
//! Needs bubblewrap (`.ci/run` installs Debian's `bubblewrap`); without it the test says
//! SKIPPED, unless BRAIN_REQUIRE_SANDBOX is set.

mod common;

use std::path::Path;

fn have_bwrap() -> bool {
    if vocab::spec::host::resolve_program("bwrap").is_some() {
        return true;
    }
    test_support::optional_server(
        "BRAIN_REQUIRE_SANDBOX",
        "bubblewrap",
        "apt-get install bubblewrap",
    );
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_job_runs_as_its_user_in_a_sandbox_that_hides_the_brain() {
    if !have_bwrap() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let code = d.join("code");
    let data = d.join("data");
    let script = common::confined::write_probe(&code);
    // A job that floods its output: 3 MiB on stdout and on stderr, against a cap of 1 MiB.
    let flood = code.join("flood.sh");
    std::fs::write(
        &flood,
        "head -c 3145728 /dev/zero | tr '\\0' o\nhead -c 3145728 /dev/zero | tr '\\0' e >&2\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&flood, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let allowed = format!("/bin/sh {}", script.display());
    let allowed_flood = format!("/bin/sh {}", flood.display());
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        data.join("policy.toml"),
        format!(
            "heuristics = []\n[scheduler]\nkind = \"pollux\"\n[live]\ninterval_s = 1\n\
             [submissions]\ncommands = [{allowed:?}, {allowed_flood:?}]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("brain.toml"),
        format!(
            "database = {:?}\n[launcher.sandbox]\nread_only = [{:?}]\noutput_cap = \"1Mi\"\n",
            data.join("brain.db"),
            code
        ),
    )
    .unwrap();
    // The brain's own environment: none of it may reach a job.
    let (_b, addr) = common::start_brain_with(&data, "127.0.0.1:0", 2, |cmd| {
        cmd.arg("--config")
            .arg(d.join("brain.toml"))
            .env("SECRET_CANARY", "the-brains-own")
            .env("OLDPWD", "/the/brains/last/directory");
    });
    let url = format!("http://{addr}");
    let run = data.join("runs").join("probe");
    let spec = |name: &str, command: &str| {
        let p = d.join(format!("{name}.yaml"));
        std::fs::write(
            &p,
            format!(
                "name: {name}\nkind: allreduce\nroles:\n  worker: {{ replicas: 1 }}\n\
                 workload:\n  command: {command}\n  env: {{ DATA: {:?}, CODE: {:?}, RUN: {:?} }}\n\
                 data: {{ num_samples: 10, shard_size: 10 }}\n\
                 checkpoint: {{ dir: checkpoints }}\n",
                data, code, run
            ),
        )
        .unwrap();
        p
    };
    // The interpreter with code of the job's choosing: refused, whatever the program.
    let (ok, said) = common::brainctl(&[
        "submit",
        spec("escape", "[/bin/sh, -c, \"cat /etc/shadow\"]")
            .to_str()
            .unwrap(),
        "--brain",
        &url,
    ]);
    assert!(!ok && said.contains("is not one of the commands"), "{said}");

    let probe = spec("probe", &format!("[/bin/sh, {:?}]", script));
    let (ok, said) =
        common::brainctl(&["submit", probe.to_str().unwrap(), "--brain", &url, "--wait"]);
    assert!(ok, "{said}\n{}", log(&run));
    let report = std::fs::read_to_string(run.join("checkpoints/probe-0.txt"))
        .unwrap_or_else(|e| panic!("{e}\n{}", log(&run)));
    common::confined::assert_probe(&report, "probe");
    assert!(!code.join("planted").exists());

    // 6 MiB of output: the first 1 MiB is kept in the process's log, then one note; the job
    // is not held up by it and succeeds.
    let flooding = spec("flood", &format!("[/bin/sh, {:?}]", flood));
    let (ok, said) = common::brainctl(&[
        "submit",
        flooding.to_str().unwrap(),
        "--brain",
        &url,
        "--wait",
    ]);
    let run = data.join("runs").join("flood");
    assert!(ok, "{said}\n{}", log(&run));
    let kept = std::fs::read(run.join("master/logs/worker-0.1.log")).unwrap();
    let text = String::from_utf8_lossy(&kept);
    // The flood's bytes: its long runs of `o` and `e` (the agent's own lines lie between).
    let flooded: usize = text
        .split(|c| c != 'o' && c != 'e')
        .filter(|run| run.len() >= 256)
        .map(str::len)
        .sum();
    assert!(
        (1 << 20..(1 << 20) + (64 << 10)).contains(&flooded),
        "{flooded} bytes of the flood kept, of a cap of 1 MiB"
    );
    assert_eq!(
        text.matches("output reached its cap of 1048576 bytes")
            .count(),
        1,
        "{}",
        text.lines()
            .filter(|l| l.len() < 400)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let short: Vec<&str> = text.lines().filter(|l| l.len() < 400).collect();
    assert!(
        text.contains("5242880 bytes dropped"),
        "{}",
        short.join("\n")
    );
}

fn log(run: &Path) -> String {
    let mut out = std::fs::read_to_string(run.join("job-master.log")).unwrap_or_default();
    if let Ok(logs) = std::fs::read_dir(run.join("master/logs")) {
        for l in logs.flatten() {
            out += &format!("--- {}\n", l.path().display());
            out += &std::fs::read_to_string(l.path()).unwrap_or_default();
        }
    }
    out
}

/// A brain that runs as root refuses to start without an unprivileged user for its jobs.
#[test]
fn a_root_brain_without_a_user_for_its_jobs_refuses_to_start() {
    if !nix::unistd::geteuid().is_root() {
        test_support::skipped("not root: a brain that is not root runs its jobs as its own user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brain"))
        .args(["--listen", "127.0.0.1:0", "--cpus", "2", "--database"])
        .arg(dir.path().join("brain.db"))
        .env_remove("BRAIN_RUN_AS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("runs as root") && err.contains("--run-as"),
        "{err}"
    );
    for (user, says) in [("root", "is root"), ("no-such-user-x", "no user named")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_brain"))
            .args(["--listen", "127.0.0.1:0", "--cpus", "2", "--run-as", user])
            .arg("--database")
            .arg(dir.path().join("brain.db"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
    assert!(!dir.path().join("operator.token").exists());
}

/// A brain that runs its jobs confined refuses to start beside a Ray dashboard that answers
/// anyone on loopback (here its own cluster's: the tests' Ray head on 127.0.0.1), saying why
/// and how to accept it, and makes nothing; with `--allow-open-ray-dashboard` it starts.
#[test]
fn a_confined_brain_refuses_to_start_beside_an_open_ray_dashboard() {
    let Some(user) = test_support::run_as() else {
        test_support::skipped("not root: the jobs run as the brain's own user");
        return;
    };
    let Some(address) = std::env::var("BRAIN_RAY_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty())
    else {
        test_support::optional_server(
            "BRAIN_REQUIRE_RAY",
            "a Ray cluster",
            "set BRAIN_RAY_ADDRESS to its dashboard, as .ci/run does with .ci/ray-head",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_brain"))
        .args(["--listen", "127.0.0.1:0", "--cpus", "2", "--run-as", &user])
        .args(["--ray-address", &address])
        .arg("--database")
        .arg(dir.path().join("brain.db"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the brain started beside an open Ray dashboard at {address}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("a Ray dashboard answers without a credential at")
            && err.contains(address.trim_end_matches('/'))
            && err.contains("outside its sandbox")
            && err.contains("--allow-open-ray-dashboard"),
        "{err}"
    );
    assert!(!dir.path().join("operator.token").exists());
    // Accepted by the operator: it starts.
    let (mut brain, _) = common::spawn_brain(|cmd| {
        cmd.args(["--listen", "127.0.0.1:0", "--cpus", "2"])
            .args(["--ray-address", &address, "--allow-open-ray-dashboard"])
            .arg("--database")
            .arg(dir.path().join("brain.db"))
            .arg("--runs-dir")
            .arg(dir.path().join("runs"));
    });
    brain.kill();
}

/// The built-in workload (Brain's own code, no user code) runs confined too: as the job's
/// user, without privileges, the brain's data out of its sight. A parameter-server job, whose
/// servers write their checkpoint parts into directories the master makes, trains to the end
/// that way.
#[test]
fn the_built_in_workload_runs_as_the_jobs_user_in_the_sandbox_too() {
    if !have_bwrap() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        data.join("policy.toml"),
        "heuristics = []\n[scheduler]\nkind = \"pollux\"\n[live]\ninterval_s = 1\n",
    )
    .unwrap();
    let (_b, addr) = common::start_brain(&data, "127.0.0.1:0", 4);
    let url = format!("http://{addr}");
    let run = data.join("runs").join("builtin");
    let spec = d.join("builtin.yaml");
    std::fs::write(
        &spec,
        "name: builtin\nkind: ps\nroles:\n  ps: { replicas: 1, min: 1, max: 1 }\n  \
         worker: { replicas: 2, min: 2, max: 2 }\n\
         workload:\n  builtin: { batch_size: 64, step_delay_us: 300 }\n\
         data: { num_samples: 12000, shard_size: 500, eval_samples: 1000 }\n\
         checkpoint: { dir: checkpoints, every_shards: 4 }\n",
    )
    .unwrap();
    let submit = {
        let (spec, url) = (spec.clone(), url.clone());
        std::thread::spawn(move || {
            common::brainctl(&["submit", spec.to_str().unwrap(), "--brain", &url, "--wait"])
        })
    };
    // Every process of the job, seen while they train.
    let checkpoints = run.join("checkpoints");
    let mut seen = std::collections::BTreeMap::new();
    let start = std::time::Instant::now();
    while !submit.is_finished() && start.elapsed() < std::time::Duration::from_secs(120) {
        common::confined::look_at_builtin(&checkpoints, &data, &mut seen);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (ok, said) = submit.join().unwrap();
    assert!(ok, "{said}\n{}", log(&run));
    let kinds: std::collections::BTreeSet<&str> = seen.values().map(|s| s.what.as_str()).collect();
    assert!(
        kinds.contains("ps-server") && kinds.contains("ps-worker"),
        "the job's processes were not all seen: {seen:?}\n{}",
        log(&run)
    );
    common::confined::assert_confined(&seen);
    let uid = common::confined::job_uid();
    // The parameter server wrote its checkpoint parts as the job's user.
    let parts: Vec<_> = std::fs::read_dir(&checkpoints)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ckpt-"))
        .collect();
    assert!(!parts.is_empty(), "no parameter-server checkpoint");
    for p in parts {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(p.metadata().unwrap().uid(), uid.as_raw(), "{:?}", p.path());
    }
}

/// The pid of the job's built-in process `role`-`index` (the command bubblewrap runs, which
/// the agent gives `BRAIN_ROLE` and `BRAIN_INDEX`) of the job whose run directory is `run`.
fn pid_of(role: &str, index: u32, run: &Path) -> Option<u32> {
    let want = [format!("BRAIN_ROLE={role}"), format!("BRAIN_INDEX={index}")];
    let ckpt = format!("BRAIN_CHECKPOINT_DIR={}", run.join("checkpoints").display());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        if !String::from_utf8_lossy(&cmdline).contains("allreduce-worker") {
            return None;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let vars: Vec<String> = env
            .split(|&b| b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        let has = |s: &str| vars.iter().any(|v| v == s);
        (want.iter().all(|w| has(w)) && has(&ckpt)).then_some(pid)
    })
}

/// Flash checkpoints through a sandboxed brain: the agents (root) write each cut's parts out
/// as the job's user's alone, and the confined processes restore from them. After a cut,
/// worker 2's copies in memory are removed and it is killed -9: the group restarts from the
/// committed step, workers 0 and 1 from their node's memory and worker 2 from disk (a part a
/// confined process could not read would fail the job), each sample applied once per epoch.
#[test]
fn a_flash_job_in_the_sandbox_restores_from_memory_and_from_disk() {
    use std::os::unix::fs::MetadataExt;
    use std::time::{Duration, Instant};
    if !have_bwrap() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        data.join("policy.toml"),
        "heuristics = []\n[scheduler]\nkind = \"pollux\"\n[live]\ninterval_s = 1\n",
    )
    .unwrap();
    let (_b, addr) = common::start_brain(&data, "127.0.0.1:0", 4);
    let url = format!("http://{addr}");
    let run = data.join("runs").join("flash");
    let spec = d.join("flash.yaml");
    std::fs::write(
        &spec,
        "name: flash\nkind: allreduce\nroles:\n  worker: { replicas: 3, min: 3, max: 3 }\n\
         workload:\n  builtin: { batch_size: 128, step_delay_us: 150 }\n\
         data: { num_samples: 40000, shard_size: 500, eval_samples: 1000 }\nepochs: 2\n\
         checkpoint: { dir: checkpoints, every_shards: 8, flash: { memory: 4Mi } }\n",
    )
    .unwrap();
    let submit = {
        let (spec, url) = (spec.clone(), url.clone());
        std::thread::spawn(move || {
            common::brainctl(&["submit", spec.to_str().unwrap(), "--brain", &url, "--wait"])
        })
    };
    let flash = run.join("checkpoints").join("flash");
    let start = Instant::now();
    let parts = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&flash)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|s| std::fs::read_dir(s.path()).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "bin"))
            .collect()
    };
    while parts().is_empty() || pid_of("worker", 2, &run).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(120) && !submit.is_finished(),
            "no flash part written out while the job ran\n{}",
            log(&run)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A little past the first cut (it is committed once its part is written out).
    std::thread::sleep(Duration::from_millis(500));
    let context: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("master/job-context.json")).unwrap())
            .unwrap();
    let run_id = context["run_id"].as_str().unwrap();
    let copies = vocab::flash::process_dir(&vocab::flash::root(), run_id, "worker", 2);
    for slot in ["slot-0", "slot-1", "slot-0.json", "slot-1.json"] {
        let _ = std::fs::remove_file(copies.join(slot));
    }
    let victim = pid_of("worker", 2, &run).expect("worker 2 runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let (ok, said) = submit.join().unwrap();
    assert!(ok, "{said}\n{}", log(&run));
    assert!(said.contains("exactly-once: ok"), "{said}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("master/report.json")).unwrap()).unwrap();
    let events: Vec<&str> = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .collect();
    let from = |what: &str| {
        events
            .iter()
            .filter(|e| e.contains("(incarnation 2) restored step") && e.ends_with(what))
            .count()
    };
    assert_eq!(
        (from("from memory"), from("from disk")),
        (2, 1),
        "{events:#?}"
    );
    // Every part on disk is the job's user's, and nobody else's to read.
    let uid = common::confined::job_uid();
    let written = parts();
    assert!(!written.is_empty());
    for p in written.iter().chain([&flash]) {
        let m = std::fs::metadata(p).unwrap();
        assert_eq!(m.uid(), uid.as_raw(), "{}", p.display());
        assert_eq!(m.mode() & 0o077, 0, "{}: {:o}", p.display(), m.mode());
    }
}
