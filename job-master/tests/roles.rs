//! Jobs of several roles, with real processes: an all-reduce training group (the built-in
//! workload) beside a `service` role (rollout engines) and a `single` role (a driver), each
//! running its own command. A killed process restarts at its role's failover level and no
//! further; a service role is resized by `job-master scale --role` while the training group
//! trains on, untouched.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use job_master::spec::{JobSpec, Role};
use proto::jobmaster::v1 as pb;

const N: u64 = 60_000;

/// The job: 2 all-reduce workers, `rollout` engines (2, elastic 1..4) and one `driver`. Each
/// service process writes what it was told (role, index, topology, its env) to `out`, then
/// sleeps until it is stopped.
fn spec(dir: &Path, rollout_extra: &str) -> JobSpec {
    let out = dir.join("seen");
    std::fs::create_dir_all(&out).unwrap();
    let script = format!(
        "echo \"$BRAIN_ROLE $BRAIN_INDEX $BRAIN_TOPOLOGY $MODE ${{BRAIN_PROCESS_JOINS:-none}} \
         ${{RANK:-none}}\" > {}/$BRAIN_ROLE-$BRAIN_INDEX.$$; exec sleep 600",
        out.display()
    );
    let yaml = builtin_yaml(dir, "rl-roles", "allreduce", 0, 2, N, 1, 1000, 10).replace(
        "workload:",
        &format!(
            "  rollout: {{ replicas: 2, min: 1, max: 4, max_restarts: 5, command: [/bin/sh, -c, \
             {script:?}], env: {{ MODE: rollout }}{rollout_extra} }}\n  driver: {{ topology: \
             single, command: [/bin/sh, -c, {script:?}], env: {{ MODE: drive }} }}\nworkload:"
        ),
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    spec.validate().unwrap();
    spec
}

type Seen = BTreeMap<(String, u32), (u64, u32)>;

/// Role and index → (incarnation, pid) of every process that runs.
fn seen(s: &pb::JobStatus) -> Seen {
    s.processes
        .iter()
        .filter(|p| p.state == "running" && p.pid != 0)
        .map(|p| ((p.role.clone(), p.index), (p.incarnation, p.pid)))
        .collect()
}

async fn all_running(addr: std::net::SocketAddr, n: usize, why: &str) -> pb::JobStatus {
    wait_for(addr, Duration::from_secs(60), why, |s| {
        seen(s).len() == n && s.processes.iter().filter(|p| p.state == "running").count() == n
    })
    .await
}

fn of_role(s: &Seen, role: &str) -> Seen {
    s.iter()
        .filter(|((r, _), _)| r == role)
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_runs_its_own_program_fails_over_alone_and_is_resized_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start(spec(dir.path(), ""), dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 2).await;
    let before = seen(&all_running(addr, 5, "2 workers, 2 rollouts and a driver").await);

    // Each service process got its role's program and env, and no training group.
    let files: Vec<String> = std::fs::read_dir(dir.path().join("seen"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    for want in [
        "rollout 0 service rollout none none",
        "rollout 1 service rollout none none",
        "driver 0 single drive none none",
    ] {
        assert!(files.iter().any(|f| f.trim() == want), "{want}: {files:?}");
    }

    // kill -9 one rollout engine: it alone restarts (failover: process).
    kill9(before[&("rollout".to_string(), 1)].1);
    let s = wait_for(addr, Duration::from_secs(30), "rollout-1 back", |s| {
        seen(s)
            .get(&("rollout".to_string(), 1))
            .is_some_and(|&(inc, _)| inc == 2)
    })
    .await;
    let after = seen(&s);
    for (k, v) in &before {
        if k.0 != "rollout" || k.1 != 1 {
            assert_eq!(after.get(k), Some(v), "{k:?} must not have moved");
        }
    }

    // 2 -> 4 rollout engines by the CLI while the workers train: no worker pauses.
    let step_before = status(addr).await.unwrap().global_step;
    let out = scale_cli(addr, &run.run_dir, &["--role", "rollout=4", "--wait"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("plan 1 reached"), "{stdout}");
    let s = all_running(addr, 7, "4 rollouts").await;
    let grown = seen(&s);
    assert_eq!(of_role(&grown, "worker"), of_role(&before, "worker"));
    assert_eq!(of_role(&grown, "driver"), of_role(&before, "driver"));
    let s = wait_for(addr, Duration::from_secs(30), "the workers go on", |s| {
        s.global_step > step_before
    })
    .await;
    assert_eq!(of_role(&seen(&s), "worker"), of_role(&before, "worker"));

    // 4 -> 1: the engines above index 0 leave; nobody else moves.
    let bad = scale_cli(addr, &run.run_dir, &["--role", "critic=1"]).await;
    assert_eq!(bad.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("the job has no critic role"));
    let mut p = plan(3, None, None);
    p.roles.push(pb::RoleTarget {
        nodes: Vec::new(),
        role: "rollout".into(),
        count: 1,
        resources: None,
    });
    send(addr, p).await;
    let s = wait_for(addr, Duration::from_secs(30), "one rollout left", |s| {
        s.processes
            .iter()
            .filter(|p| p.role == "rollout" && p.state == "removed")
            .count()
            == 3
    })
    .await;
    let shrunk = seen(&s);
    assert_eq!(of_role(&shrunk, "worker"), of_role(&before, "worker"));
    // Each role group's size wanted and what runs, the training group first.
    let groups: Vec<(&str, bool, u32, u32)> = s
        .role_groups
        .iter()
        .map(|g| (g.role.as_str(), g.training, g.desired, g.live))
        .collect();
    let workers = of_role(&before, "worker").len() as u32;
    assert_eq!(
        groups,
        [
            ("worker", true, workers, workers),
            ("driver", false, 1, 1),
            ("rollout", false, 1, 1)
        ]
    );
    assert_eq!(
        of_role(&shrunk, "rollout").keys().collect::<Vec<_>>(),
        vec![&("rollout".to_string(), 0)]
    );

    // A worker killed: the all-reduce group restarts (failover: role); the services stay.
    let services_before = seen(&status(addr).await.unwrap());
    kill9(services_before[&("worker".to_string(), 0)].1);
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.restarts.get(&Role::WORKER), Some(&1));
    let ctx = context(&run.run_dir);
    let rollout0 = &ctx["roles"]["rollout"]["slots"]["0"];
    let driver0 = &ctx["roles"]["driver"]["slots"]["0"];
    assert_eq!(rollout0["incarnation"], 1, "{rollout0}");
    assert_eq!(driver0["incarnation"], 1, "{driver0}");
    assert_eq!(ctx["roles"]["rollout"]["slots"]["1"]["incarnation"], 2);
    assert_no_process_left(addr).await;
}

/// `failover: job` on a service: its failure restarts every process of the job, the training
/// group from its latest checkpoint, and the job still trains each sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_with_failover_job_restarts_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = start(spec(dir.path(), ", failover: job"), dir.path()).await;
    let addr = run.addr;
    shards_at_least(addr, 2).await;
    let before = seen(&all_running(addr, 5, "every process").await);
    kill9(before[&("rollout".to_string(), 0)].1);
    let s = wait_for(
        addr,
        Duration::from_secs(60),
        "every process restarted",
        |s| {
            let now = seen(s);
            now.len() == 5
                && before
                    .iter()
                    .all(|(k, (inc, _))| now.get(k).is_some_and(|n| n.0 > *inc))
        },
    )
    .await;
    assert!(seen(&s).values().all(|(_, pid)| *pid != 0));
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.exactly_once, "ok");
    assert_each_sample_once(&report, N, 1);
    assert_no_process_left(addr).await;
}

/// Calls between roles through the SDK: a `driver` calls the `reward` role's method on every
/// member, on any, on the lowest index. A reward engine killed with kill -9 is called again on
/// its successor, the role resized to 3 is called on its new member, and no call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_call_each_other_and_follow_restarts_and_resizes() {
    let Some((python, sdk)) = torch_with_sdk() else {
        eprintln!("SKIPPED: no Python with torch and the SDK's build requirements");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("calls.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/role_calls.py");
    let argv = |mode: &str| {
        format!(
            "[{python:?}, {:?}, {mode}, --out, {:?}]",
            script.display().to_string(),
            out.display().to_string()
        )
    };
    let yaml = builtin_yaml(dir.path(), "rl-calls", "allreduce", 0, 1, N, 1, 1000, 10).replace(
        "workload:",
        &format!(
            "  reward: {{ replicas: 2, min: 1, max: 4, command: {}, env: {{ PYTHONPATH: {:?} }} }}\n  \
             driver: {{ topology: single, command: {}, env: {{ PYTHONPATH: {:?} }} }}\nworkload:",
            argv("serve"),
            sdk.display().to_string(),
            argv("drive"),
            sdk.display().to_string(),
        ),
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    spec.validate().unwrap();
    let mut run = start(spec, dir.path()).await;
    let addr = run.addr;

    let lines = |path: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    // [index, incarnation] of each member an `all` call reached.
    let reached = |l: &serde_json::Value| -> Vec<(u64, u64)> {
        l["all"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| (r[0].as_u64().unwrap(), r[1].as_u64().unwrap()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let until = async |want: &dyn Fn(&serde_json::Value) -> bool, why: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            if lines(&out).iter().any(want) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no call {why}: {:?}",
                lines(&out).last()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    until(&|l| reached(l) == [(0, 1), (1, 1)], "reached both engines").await;
    let first = lines(&out)
        .into_iter()
        .find(|l| reached(l).len() == 2)
        .unwrap();
    assert_eq!(first["rank0"][0], 0, "{first}");
    assert!(
        first["remote_error"]
            .as_str()
            .is_some_and(|e| e.contains("ValueError: as asked")),
        "{first}"
    );
    assert!(
        first["private"]
            .as_str()
            .is_some_and(|e| e.contains("cannot be called")),
        "{first}"
    );
    // driver-0 → reward-0 → reward-0: refused at once, the chain named.
    assert!(
        first["cycle"].as_str().is_some_and(|e| {
            e.contains("a cycle of calls that can never be served")
                && e.contains("driver-0 → reward-0 → reward-0")
        }),
        "{first}"
    );

    kill9(pid_of(addr, "reward", 1).await);
    until(
        &|l| reached(l) == [(0, 1), (1, 2)],
        "reached reward-1's successor",
    )
    .await;
    let mut p = plan(1, None, None);
    p.roles.push(pb::RoleTarget {
        nodes: Vec::new(),
        role: "reward".into(),
        count: 3,
        resources: None,
    });
    send(addr, p).await;
    until(&|l| reached(l).len() == 3, "reached the new engine").await;

    let all = lines(&out);
    let errors: Vec<&serde_json::Value> = all.iter().filter(|l| l.get("error").is_some()).collect();
    assert!(errors.is_empty(), "calls failed: {errors:?}");
    // `any` went round the members.
    let anys: std::collections::BTreeSet<u64> =
        all.iter().filter_map(|l| l["any"][0].as_u64()).collect();
    assert!(anys.len() >= 2, "{anys:?}");

    // The training group went on untouched.
    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.restarts.get(&Role::WORKER), None);
    assert_no_process_left(addr).await;
}

/// A further all-reduce group (`critic: { topology: allreduce, command: ... }`) beside the
/// built-in training group: its processes form their own torch.distributed group through
/// `brain_sdk.roles.collective()` (ranks by index, the world at the role's size) and serve
/// calls too (rank 1 calls rank 0); a member killed -9 restarts the group whole, `job-master scale --role critic=3`
/// re-forms it at 3; the training group's processes never move. The group checkpoints itself
/// through the SDK (`g.checkpoint`, every 5 steps) and each formation restores the newest
/// step committed (`g.restore()`): no committed step is lost across the kill or the resize.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_further_all_reduce_group_forms_restarts_whole_and_is_resized_alone() {
    let Some((python, sdk)) = torch_with_sdk() else {
        eprintln!("SKIPPED: no Python with torch and the SDK's build requirements");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("critic.jsonl");
    let hold = dir.path().join("hold-checkpoints");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/collective_group.py");
    let yaml = builtin_yaml(dir.path(), "rl-critic", "allreduce", 0, 1, N, 1, 1000, 10).replace(
        "workload:",
        &format!(
            "  critic: {{ topology: allreduce, replicas: 2, min: 1, max: 3, max_restarts: 4, \
             command: [{python:?}, {:?}, --out, {:?}, --hold, {:?}], env: {{ PYTHONPATH: {:?}, \
             OMP_NUM_THREADS: \"1\" }} }}\nworkload:",
            script.display().to_string(),
            out.display().to_string(),
            hold.display().to_string(),
            sdk.display().to_string(),
        ),
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    spec.validate().unwrap();
    let mut run = start(spec, dir.path()).await;
    let addr = run.addr;

    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    // Waits until every index below `world` all-reduced at that world size, at `incarnation`
    // or later, and returns their lines there.
    let formed = async |world: u64, incarnation: u64, why: &str| -> Vec<serde_json::Value> {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let at: Vec<serde_json::Value> = (0..world)
                .filter_map(|i| {
                    lines().into_iter().find(|l| {
                        l["index"] == i
                            && l["world"] == world
                            && l["incarnation"].as_u64() >= Some(incarnation)
                    })
                })
                .collect();
            if at.len() as u64 == world {
                return at;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{why}: {:?}\n{}",
                lines().last(),
                context(&run.run_dir)["events"]
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let first = formed(2, 1, "the critic group of 2 did not form").await;
    for (rank, l) in first.iter().enumerate() {
        assert_eq!(
            (l["rank"].as_u64(), l["sum"].as_f64()),
            (Some(rank as u64), Some(3.0))
        );
        assert_eq!(
            l["restored"],
            serde_json::Value::Null,
            "nothing to restore yet: {l}"
        );
    }
    // The committed step rank 0 has passed (a line is written after its step's checkpoint),
    // and the newest step any member reached, at `incarnation` of critic-0.
    let steps_at = |incarnation: u64| {
        let all = lines();
        let of_rank0 = all
            .iter()
            .filter(|l| l["rank"] == 0 && l["incarnation"] == incarnation);
        let committed = of_rank0
            .filter_map(|l| l["step"].as_u64())
            .filter(|s| s % 5 == 0)
            .max();
        let reached = all
            .iter()
            .filter(|l| l["incarnation"] == incarnation)
            .filter_map(|l| l["step"].as_u64())
            .max();
        (committed, reached)
    };
    // Restored as one: each member's first line after `incarnation` formed says the same step,
    // one past it; the step is returned.
    let restored_by = |at: &[serde_json::Value]| -> u64 {
        let s = at[0]["restored"]
            .as_u64()
            .unwrap_or_else(|| panic!("nothing restored: {at:?}"));
        for l in at {
            assert_eq!(
                (l["restored"].as_u64(), l["step"].as_u64()),
                (Some(s), Some(s + 1)),
                "{l}"
            );
        }
        s
    };
    // Waits until rank 0 at `incarnation` has passed a committed step of at least `step`: the
    // group has committed more than once by then, so a restore must find the newest.
    let committed_past = async |incarnation: u64, step: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while steps_at(incarnation).0 < Some(step) {
            assert!(
                std::time::Instant::now() < deadline,
                "no critic checkpoint of step {step}: {:?}",
                lines().last()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    committed_past(1, 10).await;
    // Its members serve calls as well: rank 1 reached rank 0.
    let called = lines()
        .into_iter()
        .find_map(|l| l.get("called").cloned())
        .expect("rank 1's call to rank 0");
    assert_eq!(called, serde_json::json!([0, 1, 42]));
    let workers = of_role(&seen(&status(addr).await.unwrap()), "worker");
    assert_eq!(workers.len(), 1);

    // kill -9 one member: the group restarts whole (failover role) and forms again, from the
    // newest step it committed.
    let c = &context(&run.run_dir)["roles"]["critic"]["checkpoint"];
    assert!(
        c["step"].as_u64() >= Some(10),
        "the committed step is kept: {c}"
    );
    // `job-master status` shows it.
    let shown = status(addr).await.unwrap().role_checkpoints;
    assert_eq!(
        shown
            .iter()
            .map(|c| (c.role.as_str(), c.index))
            .collect::<Vec<_>>(),
        [("critic", 0)]
    );
    assert!(
        shown[0].step >= 10 && shown[0].path.contains("roles/critic/step-"),
        "{shown:?}"
    );
    kill9(first[1]["pid"].as_u64().unwrap() as u32);
    let again = formed(2, 2, "the critic group did not form again").await;
    let (committed, reached) = steps_at(1);
    let s = restored_by(&again);
    assert!(
        Some(s) >= committed && Some(s) <= reached,
        "restored {s}: {committed:?} {reached:?}"
    );
    for l in &again {
        assert_eq!(l["incarnation"], 2, "{l}");
        assert_ne!(
            l["pid"],
            first[l["index"].as_u64().unwrap() as usize]["pid"]
        );
    }
    assert_eq!(
        of_role(&seen(&status(addr).await.unwrap()), "worker"),
        workers
    );

    // The group keeps its two newest commits, and their files only. Checkpoints held, the
    // newest file is damaged: the resize below restores the one before it.
    committed_past(2, s + 10).await;
    std::fs::write(&hold, b"").unwrap();
    let kept = async || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let g = &context(&run.run_dir)["roles"]["critic"];
            let (c, p) = (g["checkpoint"].clone(), g["previous_checkpoint"].clone());
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let again = &context(&run.run_dir)["roles"]["critic"];
            if again["checkpoint"] == c && again["previous_checkpoint"] == p && !p.is_null() {
                return (c, p);
            }
            assert!(std::time::Instant::now() < deadline, "commits go on: {g}");
        }
    };
    let (newest, previous) = kept().await;
    let file = |c: &serde_json::Value| Path::new(c["path"].as_str().unwrap()).to_path_buf();
    let mut files: Vec<_> = std::fs::read_dir(file(&newest).parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [file(&previous), file(&newest)],
        "only the kept files stay"
    );
    let (n, m) = (
        newest["step"].as_u64().unwrap(),
        previous["step"].as_u64().unwrap(),
    );
    assert!(m < n, "{previous} {newest}");
    let mut bytes = std::fs::read(file(&newest)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(file(&newest), bytes).unwrap();

    // 2 -> 3 by the CLI: the staying two restart, and the three form a group of 3.
    let scaled = scale_cli(addr, &run.run_dir, &["--role", "critic=3"]).await;
    assert!(
        scaled.status.success(),
        "{}",
        String::from_utf8_lossy(&scaled.stderr)
    );
    let three = formed(3, 1, "the critic group of 3 did not form").await;
    let s3 = restored_by(&three);
    assert_eq!(s3, m, "the step before the damaged {n}");
    // Its next commit goes back before the damaged step, as the re-formed group's line.
    std::fs::remove_file(&hold).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let c = context(&run.run_dir)["roles"]["critic"]["checkpoint"].clone();
        if c["incarnation"].as_u64() >= Some(3) {
            assert!(c["step"].as_u64() <= Some(n), "{c}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no commit after the resize: {c}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sums: Vec<f64> = three.iter().map(|l| l["sum"].as_f64().unwrap()).collect();
    assert_eq!(sums, [6.0, 6.0, 6.0]);
    assert_eq!(
        three[0]["incarnation"], 3,
        "critic-0 restarted for the resize"
    );
    assert_eq!(
        of_role(&seen(&status(addr).await.unwrap()), "worker"),
        workers
    );

    let report = run.report().await;
    assert!(report.succeeded(), "{:?}", report.reason);
    assert_eq!(report.restarts.get(&Role::WORKER), None);
    assert_no_process_left(addr).await;
}

/// `brain_sdk.JobBuilder` writes the spec the YAML writes, has the job master validate it, and
/// runs it to its end with a local job master.
#[test]
fn the_python_builder_writes_the_yaml_spec_and_runs_it() {
    let Some((python, sdk)) = torch_with_sdk() else {
        eprintln!("SKIPPED: no Python with the SDK's build requirements");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (out, run_dir, ckpt) = (
        dir.path().join("built.yaml"),
        dir.path().join("run"),
        dir.path().join("ckpt"),
    );
    let script = format!(
        r#"
from brain_sdk import JobBuilder
b = (
    JobBuilder("built", kind="allreduce")
    .builtin(seed=3, batch_size=64)
    .role("worker").total(1).max(2)
    .role("rollout").run(["/bin/sh", "-c", "exec sleep 600"]).total(2).min(1).max(3)
    .env(MODE="fast")
    .role("driver").topology("single").run("/bin/sh -c 'exec sleep 600'").failover("role")
    .data(num_samples=2000, shard_size=500, eval_samples=500)
    .checkpoint({ckpt:?}, every_shards=2)
)
open({out:?}, "w").write(b.to_yaml())
print(b.validate(job_master={bin:?}))
b.run(job_master={bin:?}, args=["--run-dir", {run:?}])
"#,
        ckpt = ckpt.display().to_string(),
        out = out.display().to_string(),
        bin = job_master_bin().display().to_string(),
        run = run_dir.display().to_string(),
    );
    let done = std::process::Command::new(&python)
        .args(["-c", &script])
        .env("PYTHONPATH", &sdk)
        .output()
        .unwrap();
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(done.status.success(), "{said}");
    let yaml = format!(
        r#"
name: built
kind: allreduce
roles:
  worker: {{ replicas: 1, max: 2 }}
  rollout: {{ replicas: 2, min: 1, max: 3, command: [/bin/sh, -c, exec sleep 600], env: {{ MODE: fast }} }}
  driver: {{ topology: single, failover: role, command: [/bin/sh, -c, exec sleep 600] }}
workload:
  builtin: {{ seed: 3, batch_size: 64 }}
data: {{ num_samples: 2000, shard_size: 500, eval_samples: 500 }}
checkpoint: {{ dir: {ckpt:?}, every_shards: 2 }}
"#,
        ckpt = ckpt.display().to_string()
    );
    let built = JobSpec::from_yaml(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(built, JobSpec::from_yaml(&yaml).unwrap());
    // The RL example's `build_job.py` writes its `job.yaml` (the actor named by its topology),
    // a role's `module:Class` run by the builder's own Python.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/rl-ppo");
    let printed = std::process::Command::new(&python)
        .arg(example.join("build_job.py"))
        .arg("--dry-run")
        .env("PYTHONPATH", &sdk)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&printed.stdout);
    assert!(
        printed.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let mut from_builder = JobSpec::from_yaml(&text).unwrap();
    for r in from_builder.roles.values_mut() {
        if let Some(argv) = r.command.as_mut()
            && argv[1..3] == ["-m", "brain_sdk.roles"]
        {
            argv[0] = "python3".into();
        }
    }
    let yaml = std::fs::read_to_string(example.join("job.yaml")).unwrap();
    assert_eq!(from_builder, JobSpec::from_yaml(&yaml).unwrap());
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["phase"], "succeeded", "{report}");
}

/// kill -9 of the job master of a job with service roles: its agents, training and service
/// processes go with it; `job-master run --resume` starts the training group from its latest
/// checkpoint and every service process anew (the size a plan gave the role is kept), and the
/// job trains every sample once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_job_master_resumes_its_service_roles_at_their_planned_size() {
    let dir = tempfile::tempdir().unwrap();
    let spec_file = dir.path().join("job.yaml");
    let yaml = serde_norway::to_string(&spec(dir.path(), "")).unwrap();
    std::fs::write(&spec_file, yaml).unwrap();
    let run_dir = dir.path().join("run");
    let args = |resume: bool| {
        let mut a: Vec<std::ffi::OsString> = vec![
            "--run-dir".into(),
            run_dir.clone().into(),
            "--heartbeat-interval-ms".into(),
            "200".into(),
        ];
        if resume {
            a.push("--resume".into());
        }
        a
    };
    let first_args = args(false);
    let (mut first, addr) = spawn_run(
        &spec_file,
        &first_args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>(),
    );
    shards_at_least(addr, 12).await;
    all_running(addr, 5, "every process").await;
    let mut p = plan(1, None, None);
    p.roles.push(pb::RoleTarget {
        nodes: Vec::new(),
        role: "rollout".into(),
        count: 3,
        resources: None,
    });
    send(addr, p).await;
    all_running(addr, 6, "3 rollouts").await;
    kill9(first.pid());
    first.wait(Duration::from_secs(30));
    assert_no_process_left(addr).await;

    let second_args = args(true);
    let (second, addr) = spawn_run(
        &spec_file,
        &second_args
            .iter()
            .map(|a| a.as_os_str())
            .collect::<Vec<_>>(),
    );
    let s = all_running(addr, 6, "every process back, 3 rollouts").await;
    assert!(
        seen(&s)
            .iter()
            .filter(|((r, _), _)| r == "rollout")
            .all(|(_, (inc, _))| *inc >= 2),
        "{s:?}"
    );
    let report = finished_run(second, &run_dir).await;
    assert_each_sample_once(&report, N, 1);
    assert_no_process_left(addr).await;
}
