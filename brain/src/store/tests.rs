//! Unit tests of the store on a real SQLite file.

use super::*;
use vocab::spec::Topology;

fn metric(step: u64, sps: f64) -> Metric {
    Metric {
        at_unix_ms: 1_700_000_000_000 + step as i64,
        global_step: step,
        samples_per_second: sps,
        workers: 2,
        ps: 1,
        cpu_millicores: 4000,
        memory_bytes: 1 << 30,
        gpu_utilisation_pct: 50.0,
        samples_done: step * 10,
        processes: Vec::new(),
        role_rates: Vec::new(),
        ..Default::default()
    }
}

#[test]
fn jobs_plans_and_summaries_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brain.db");
    let mut s = Store::open(&path).unwrap();
    let (a, v) = s.register("a", "127.0.0.1:1", None, 10).unwrap();
    assert_eq!(v, 0);
    assert_eq!(s.register("a", "127.0.0.1:2", None, 20).unwrap(), (a, 0));
    assert_eq!(
        s.add_metrics(a, &[metric(10, 100.0), metric(20, 300.0)])
            .unwrap(),
        2
    );
    let v1 = s
        .propose_plan(
            a,
            &|v| vec![v as u8],
            "grow",
            PlanCounts::default().with(vocab::Role::WORKER, 4),
            &[],
            30,
        )
        .unwrap();
    let v2 = s
        .propose_plan(
            a,
            &|v| vec![v as u8],
            "grow more",
            PlanCounts::default(),
            &[],
            40,
        )
        .unwrap();
    assert_eq!((v1, v2), (1, 2));
    assert_eq!(
        s.plan_after(a, 0).unwrap(),
        Some(StoredPlan {
            version: 2,
            body: vec![2]
        })
    );
    assert_eq!(s.plan_after(a, 2).unwrap(), None);
    s.ack_plan(a, 2, true, "", 1).unwrap();
    drop(s);
    let s = Store::open(&path).unwrap();
    let row = s.job(a).unwrap();
    assert_eq!(row.master_address, "127.0.0.1:2");
    assert_eq!(row.registered_unix_ms, 10);
    assert_eq!((row.reports, row.last_global_step), (2, 20));
    assert_eq!(row.mean_samples_per_second, 200.0);
    assert_eq!(
        (row.plan_version, row.acked_version, row.reached_version),
        (2, 2, 1)
    );
    assert_eq!(s.jobs().unwrap().len(), 1);
    // The plans with their reasons and answers, newest first (brainctl status).
    let history = s.plan_history(a, 10).unwrap();
    let seen: Vec<(u64, &str, i64, Option<bool>)> = history
        .iter()
        .map(|p| (p.version, p.reason.as_str(), p.created_unix_ms, p.accepted))
        .collect();
    assert_eq!(
        seen,
        vec![(2, "grow more", 40, Some(true)), (1, "grow", 30, None)]
    );
    assert_eq!(s.plan_history(a, 1).unwrap().len(), 1);
}

/// A plan that adds a PS changes the count the brain plans with; what each process reported
/// and the corrections sent are kept for the heuristics until the job ends.
#[test]
fn ps_counts_processes_and_corrections_follow_the_plans_and_reports() {
    use optimizer::heuristics::{Change, ChangeKind};
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(&dir.path().join("brain.db")).unwrap();
    let shape = Shape::new(
        vocab::JobKind::Ps,
        vocab::Role::WORKER,
        RoleShape::sized(Topology::Ps, 2, (1, 4), 1000),
        100,
    )
    .with(
        vocab::Role::PS,
        RoleShape::sized(Topology::Ps, 1, (0, 0), 1000),
    );
    let a = s.submit("p", "name: p", &shape, &[], 10).unwrap();
    s.started(a, 2, None, "/tmp/p", 20).unwrap();
    let mut m = metric(1, 10.0);
    m.processes = vec![ProcessSample {
        role: vocab::Role::PS,
        index: 0,
        cpu_limit: 1000,
        memory_limit: 0,
        gpus: vocab::Gpus::ZERO,
        cpu_millicores: 990,
        memory_bytes: 5,
        memory_peak_bytes: 7,
        oom_kills: 0,
        pending_ms: 0,
        pending_reason: String::new(),
        gpu_utilisation_pct: 0.0,
        gpu_memory_bytes: 0,
        host: "10.0.0.2".into(),
        devices: String::new(),
    }];
    s.add_metrics(a, &[m]).unwrap();
    let (ps, workers) = s.processes(a, vocab::Role::WORKER);
    assert_eq!((ps.len(), workers.len()), (1, 0));
    assert_eq!(ps[0].node, "10.0.0.2", "the node it runs on");
    // Speeds by (workers, PS), for the job's PS speed model.
    assert_eq!(s.ps_speeds(a).unwrap(), vec![(2, 1, 10.0)]);
    s.add_metrics(a, &[metric(2, 30.0)]).unwrap();
    assert_eq!(s.ps_speeds(a).unwrap(), vec![(2, 1, 20.0)]);
    // The PS's peak CPU, kept for sizing the PS of jobs like it.
    assert_eq!(s.job(a).unwrap().peak_ps_millicores, 990);
    let all = s.all_ps_speeds().unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[&a], vec![(2, 1, 20.0)]);
    // What a round reads, for the queued and running jobs only.
    let (speeds, ps_speeds) = s.active_speeds().unwrap();
    assert_eq!(
        (speeds[&a].clone(), ps_speeds[&a].clone()),
        (vec![(2, 20.0)], vec![(2, 1, 20.0)])
    );
    let b = s.submit("q", "name: q", &shape, &[], 11).unwrap();
    s.started(b, 1, None, "/tmp/q", 21).unwrap();
    s.add_metrics(b, &[metric(1, 5.0)]).unwrap();
    s.finish(b, JobState::Succeeded, "", 100, 40).unwrap();
    let (speeds, _) = s.active_speeds().unwrap();
    assert!(!speeds.contains_key(&b) && speeds.contains_key(&a));
    assert_eq!(
        s.active().unwrap().iter().map(|r| r.id).collect::<Vec<_>>(),
        [a]
    );
    assert_eq!(ps[0].cpu_samples, vec![vocab::Millicores(990)]);
    let added = Change {
        at_s: 30.0,
        kind: ChangeKind::PsCount,
        process: None,
    };
    s.propose_plan(
        a,
        &|v| vec![v as u8],
        "one more ps",
        PlanCounts::default().with(vocab::Role::PS, 2),
        std::slice::from_ref(&added),
        30,
    )
    .unwrap();
    let row = s.job(a).unwrap();
    assert_eq!(row.shape.unwrap().ps(), 2);
    assert_eq!(row.workers, 2, "the worker count and its cool-down stay");
    assert_eq!(s.corrections(a), vec![added]);
    s.finish(a, JobState::Succeeded, "done", 100, 40).unwrap();
    assert!(s.processes(a, vocab::Role::WORKER).0.is_empty() && s.corrections(a).is_empty());
}

#[test]
fn bad_reports_change_nothing_and_say_what_was_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(&dir.path().join("brain.db")).unwrap();
    let (a, _) = s.register("a", "x", None, 1).unwrap();
    let huge = Metric {
        memory_bytes: u64::MAX,
        ..metric(1, 1.0)
    };
    for (bad, says) in [
        (metric(1, f64::NAN), "samples_per_second is NaN"),
        (metric(1, -5.0), "samples_per_second is -5"),
        (metric(1, f64::INFINITY), "samples_per_second is inf"),
        (huge, "memory_bytes is 18446744073709551615"),
    ] {
        let e = s.add_metrics(a, &[metric(1, 1.0), bad]).unwrap_err();
        assert!(
            matches!(&e, BrainError::InvalidArgument(m) if m.contains("report 1 of job 1") && m.contains(says)),
            "{e}"
        );
    }
    assert_eq!(s.job(a).unwrap().reports, 0);
    assert!(matches!(
        s.add_metrics(JobId(99), &[metric(1, 1.0)]),
        Err(BrainError::UnknownJob(99))
    ));
    assert!(matches!(
        s.ack_plan(a, 1, true, "", 0),
        Err(BrainError::InvalidArgument(_))
    ));
    assert!(s.register("", "x", None, 1).is_err());
}

#[test]
fn an_unknown_stored_value_is_an_error_not_a_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brain.db");
    let mut s = Store::open(&path).unwrap();
    let (a, _) = s.register("a", "127.0.0.1:1", None, 10).unwrap();
    assert_eq!(s.job(a).unwrap().state, JobState::Running);
    let raw = Connection::open(&path).unwrap();
    raw.execute(
        "UPDATE jobs SET state = 'paused' WHERE id = ?1",
        [a.0 as i64],
    )
    .unwrap();
    let e = s.job(a).unwrap_err().to_string();
    assert!(e.contains("unknown job state \"paused\""), "{e}");
    raw.execute(
        "UPDATE jobs SET state = 'running', reasons = 'not json' WHERE id = ?1",
        [a.0 as i64],
    )
    .unwrap();
    let e = s.jobs().unwrap_err().to_string();
    assert!(e.contains("column reasons"), "{e}");
    raw.execute(
        "UPDATE jobs SET reasons = '[]', shape = '{' WHERE id = ?1",
        [a.0 as i64],
    )
    .unwrap();
    assert!(s.job(a).unwrap_err().to_string().contains("column shape"));
}

#[test]
fn an_operator_plan_must_fit_the_job_s_bounds_node_unit_and_kind() {
    let mut shape = Shape::new(
        vocab::JobKind::Allreduce,
        vocab::Role::WORKER,
        RoleShape::sized(Topology::Allreduce, 2, (2, 8), 1000),
        1,
    );
    shape.training_group_mut().node_unit = 2;
    assert!(shape.check_counts(Some(4), None).is_ok());
    assert_eq!(
        shape.check_counts(Some(10), None).unwrap_err(),
        "10 workers is outside the job's bounds [2, 8]"
    );
    assert_eq!(
        shape.check_counts(Some(3), None).unwrap_err(),
        "3 workers is not a multiple of the job's node_unit 2"
    );
    assert!(shape.check_counts(None, Some(1)).is_err());
    let mut ps = Shape {
        kind: vocab::JobKind::Ps,
        ..shape.clone()
    }
    .with(
        vocab::Role::PS,
        RoleShape::sized(Topology::Ps, 1, (0, 3), 1000),
    );
    ps.training_group_mut().topology = Topology::Ps;
    assert!(ps.check_counts(Some(2), Some(3)).is_ok());
    assert_eq!(
        ps.check_counts(None, Some(4)).unwrap_err(),
        "4 parameter servers is outside the job's bounds [1, 3]"
    );
    // A row stored before the bounds were kept: the PS count it has, no other.
    let mut old = ps.clone();
    old.roles.get_mut(&vocab::Role::PS).unwrap().max = 0;
    assert!(old.check_counts(None, Some(2)).is_err());
    assert_eq!(
        ps.check_counts(None, Some(0)).unwrap_err(),
        "a ps job needs at least 1 parameter server"
    );
    // Service roles: by name, within their own bounds.
    let rollout = vocab::Role::new("rollout").unwrap();
    let rl = shape
        .clone()
        .with(rollout, RoleShape::sized(Topology::Service, 2, (1, 4), 0));
    let plan = |role, n| vocab::ScalePlan::count(0, role, n);
    assert!(rl.check_plan(&plan(rollout, 4)).is_ok());
    assert_eq!(
        rl.check_plan(&plan(rollout, 5)).unwrap_err(),
        "5 rollout is outside the role's bounds [1, 4]"
    );
    assert_eq!(
        rl.check_plan(&plan(vocab::Role::new("critic").unwrap(), 1))
            .unwrap_err(),
        "the job has no critic role"
    );
    assert!(rl.check_plan(&plan(vocab::Role::WORKER, 10)).is_err());
    let text = serde_json::to_string(&rl).unwrap();
    assert_eq!(serde_json::from_str::<Shape>(&text).unwrap(), rl);
}

#[test]
fn a_plan_sets_the_counts_of_the_role_groups_it_names_as_the_job_names_them_and_the_rates_stay() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(&dir.path().join("brain.db")).unwrap();
    let rollout = vocab::Role::new("roll-out").unwrap();
    let actor = vocab::Role::new("actor").unwrap();
    let shape = Shape::new(
        vocab::JobKind::Allreduce,
        actor,
        RoleShape::sized(Topology::Allreduce, 2, (1, 2), 1000),
        1000,
    )
    .with(rollout, RoleShape::sized(Topology::Service, 1, (1, 4), 500));
    let (a, _) = s.register("rl", "127.0.0.1:1", Some(&shape), 10).unwrap();
    let rate = optimizer::live::RoleRate {
        served_per_s: 4.0,
        busy_share: 0.9,
        callers_wait_share: 0.7,
        training_wait_share: 0.6,
    };
    let mut m = metric(10, 100.0);
    m.role_rates = vec![(rollout, rate)];
    (m.rates_cover_ms, m.rates_window_ms) = (12_000, 30_000);
    s.add_metrics(a, &[m]).unwrap();
    assert_eq!(s.role_rates(a), vec![(rollout, rate)]);
    assert_eq!(s.rates_unmeasured_s(a), 18.0);
    // A cover past its window is refused.
    let mut bad = metric(15, 100.0);
    (bad.rates_cover_ms, bad.rates_window_ms) = (31_000, 30_000);
    let e = s.add_metrics(a, &[bad]).unwrap_err().to_string();
    assert!(
        e.contains("role rates cover 31000 ms of a window of 30000 ms"),
        "{e}"
    );
    assert_eq!(s.rates_unmeasured_s(a), 18.0);
    // A rate outside its range is refused, and nothing of the batch is kept.
    let mut bad = metric(20, 100.0);
    bad.role_rates = vec![(
        rollout,
        optimizer::live::RoleRate {
            busy_share: 1.5,
            ..rate
        },
    )];
    assert!(s.add_metrics(a, &[bad]).is_err());
    assert_eq!(s.role_rates(a), vec![(rollout, rate)]);

    // A plan that names the training group as the job does, and a role group beside it.
    let mut plan = vocab::ScalePlan::count(0, actor, 1);
    plan.set_count(rollout, 3);
    s.propose_plan(
        a,
        &|v| vec![v as u8],
        "more engines",
        PlanCounts::of(&plan, actor),
        &[],
        50,
    )
    .unwrap();
    let row = s.job(a).unwrap();
    assert_eq!(row.workers, 1);
    assert_eq!(row.shape.unwrap().roles[&rollout].count, 3);
    assert_eq!(row.last_change_unix_ms, Some(50));
}

#[test]
fn cordons_hold_until_lifted_or_expired_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brain.db");
    let mut s = Store::open(&path).unwrap();
    let c = |node: &str, until| Cordon {
        node: node.into(),
        reason: format!("{node} is slow"),
        since_unix_ms: 100,
        until_unix_ms: until,
    };
    s.cordon(&c("10.0.0.2", None)).unwrap();
    s.cordon(&c("10.0.0.3", Some(1_000))).unwrap();
    drop(s);
    let mut s = Store::open(&path).unwrap();
    assert_eq!(
        s.cordons(500).unwrap(),
        vec![c("10.0.0.2", None), c("10.0.0.3", Some(1_000))]
    );
    // Expired: gone (left out, then dropped); cordoned again: the new reason.
    assert_eq!(s.cordons(1_000).unwrap(), vec![c("10.0.0.2", None)]);
    s.prune_cordons(1_000).unwrap();
    assert_eq!(s.cordons(0).unwrap(), vec![c("10.0.0.2", None)]);
    let mut again = c("10.0.0.2", Some(5_000));
    again.reason = "ECC errors".into();
    s.cordon(&again).unwrap();
    assert_eq!(s.cordons(1_000).unwrap(), vec![again]);
    assert!(s.uncordon("10.0.0.2").unwrap());
    assert!(!s.uncordon("10.0.0.2").unwrap());
    assert!(s.cordons(1_000).unwrap().is_empty());
}

#[test]
fn the_timeline_keeps_a_point_per_step_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brain.db");
    let mut s = Store::open(&path).unwrap();
    let (a, _) = s.register("a", "127.0.0.1:1", None, 10).unwrap();
    let at = |ms: i64, workers: u32, sps: f64| Metric {
        at_unix_ms: 1_700_000_000_000 + ms,
        workers,
        ..metric(ms as u64, sps)
    };
    // A batch makes one point: its newest size, its mean speed.
    s.add_metrics(a, &[at(0, 2, 100.0), at(1_000, 2, 300.0)])
        .unwrap();
    // Within the step of the last point: none.
    s.add_metrics(a, &[at(4_000, 3, 50.0)]).unwrap();
    s.add_metrics(a, &[at(7_000, 4, 400.0)]).unwrap();
    drop(s);
    let s = Store::open(&path).unwrap();
    let points = s.timeline(a, 100).unwrap();
    let got: Vec<(i64, u32, f64)> = points
        .iter()
        .map(|p| {
            (
                p.at_unix_ms - 1_700_000_000_000,
                p.workers,
                p.samples_per_second,
            )
        })
        .collect();
    assert_eq!(got, [(1_000, 2, 200.0), (7_000, 4, 400.0)]);
    // The newest ones when there are more than asked.
    assert_eq!(s.timeline(a, 1).unwrap()[0].workers, 4);
    assert!(s.timeline(JobId(99), 10).is_err());
}

#[test]
fn the_training_groups_named_by_their_jobs_are_read_in_one_query_while_the_jobs_are_active() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(&dir.path().join("brain.db")).unwrap();
    let shape = |training: Option<&str>| {
        Shape::new(
            vocab::JobKind::Allreduce,
            training.map_or(vocab::Role::WORKER, |r| vocab::Role::new(r).unwrap()),
            RoleShape::sized(Topology::Allreduce, 2, (1, 4), 1000),
            1000,
        )
    };
    let (actor, _) = s
        .register("rl", "127.0.0.1:1", Some(&shape(Some("actor"))), 10)
        .unwrap();
    s.register("plain", "127.0.0.1:2", Some(&shape(None)), 11)
        .unwrap();
    s.register("unsized", "127.0.0.1:3", None, 12).unwrap();
    let actor_role = vocab::Role::new("actor").unwrap();
    assert_eq!(s.trainers().unwrap(), [(actor, actor_role)].into());
    // Ended, it is no longer a round's.
    s.finish(actor, JobState::Succeeded, "done", 100, 20)
        .unwrap();
    assert!(s.trainers().unwrap().is_empty());
}

/// A database whose shapes were stored with the worker and PS fields (before 2026-12-06) is
/// rewritten by role group when it opens, once; a row that reads as neither form stops the
/// opening, naming the job, and rewrites nothing.
#[test]
fn shapes_stored_with_worker_and_ps_fields_are_rewritten_by_role_group_when_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brain.db");
    let legacy_ps = r#"{"kind":"ps","workers":3,"min_workers":1,"max_workers":6,"node_unit":1,
        "ps":2,"min_ps":1,"max_ps":4,"worker_millicores":2000,"worker_memory_bytes":1024,
        "worker_gpus":0,"ps_millicores":1500,"ps_memory_bytes":2048,"total_samples":500}"#;
    let legacy_rl = r#"{"kind":"allreduce","workers":2,"min_workers":2,"max_workers":2,
        "node_unit":2,"ps":0,"worker_millicores":1000,"worker_memory_bytes":0,
        "worker_gpus":0.5,"gpu_type":"V100","ps_millicores":0,"ps_memory_bytes":0,
        "total_samples":10,"worker_bundle_gpus":1,"training_role":"actor",
        "services":{"rollout":{"topology":"service","count":3,"min":1,"max":4,
        "millicores":500,"memory_bytes":0,"gpus":0.5,"shares_worker_devices":true},
        "critic":{"topology":"allreduce","count":2,"min":1,"max":3,"millicores":700,
        "memory_bytes":0,"gpus":0,"gpu_type":"A100"}},
        "placement":[{"roles":["actor","rollout"],"strategy":"pack","share_devices":true}]}"#;
    let (ps, rl, bad) = {
        let mut s = Store::open(&path).unwrap();
        let ps = s.register("ps", "127.0.0.1:1", None, 10).unwrap().0;
        let rl = s.register("rl", "127.0.0.1:2", None, 11).unwrap().0;
        let bad = s.register("bad", "127.0.0.1:3", None, 12).unwrap().0;
        s.conn
            .execute_batch(&format!(
                "UPDATE jobs SET shape = '{legacy_ps}' WHERE id = {};
                 UPDATE jobs SET shape = '{legacy_rl}' WHERE id = {};
                 ALTER TABLE job_tokens DROP COLUMN holder;
                 PRAGMA user_version = {};",
                ps.0,
                rl.0,
                // The store as it was before the shapes' rewrite (and what came after it).
                MIGRATIONS
                    .iter()
                    .position(|m| matches!(m, Migration::Rows(_)))
                    .unwrap()
            ))
            .unwrap();
        (ps, rl, bad)
    };
    // A row of neither form: the store does not open, and nothing is rewritten.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE jobs SET shape = '{\"kind\":\"ps\"}' WHERE id = ?1",
            [bad.0 as i64],
        )
        .unwrap();
    }
    let e = Store::open(&path)
        .err()
        .expect("an unreadable shape stops the migration");
    assert!(
        e.to_string()
            .contains(&format!("job {}'s stored shape", bad.0)),
        "{e}"
    );
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let kept: String = conn
            .query_row("SELECT shape FROM jobs WHERE id = ?1", [ps.0 as i64], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(kept, legacy_ps, "nothing rewritten");
        conn.execute("UPDATE jobs SET shape = NULL WHERE id = ?1", [bad.0 as i64])
            .unwrap();
    }
    let s = Store::open(&path).unwrap();
    let ps_shape = s.job(ps).unwrap().shape.unwrap();
    let mut workers = RoleShape::sized(Topology::Ps, 3, (1, 6), 2000);
    workers.memory_bytes = 1024;
    let mut servers = RoleShape::sized(Topology::Ps, 2, (1, 4), 1500);
    servers.memory_bytes = 2048;
    assert_eq!(
        ps_shape,
        Shape::new(vocab::JobKind::Ps, vocab::Role::WORKER, workers, 500)
            .with(vocab::Role::PS, servers)
    );
    ps_shape.validate().unwrap();
    let rl_shape = s.job(rl).unwrap().shape.unwrap();
    let [actor, rollout, critic] =
        ["actor", "rollout", "critic"].map(|r| vocab::Role::new(r).unwrap());
    assert_eq!(rl_shape.training, actor);
    let t = rl_shape.training_group();
    assert_eq!(
        (
            t.topology,
            t.count,
            t.node_unit,
            t.gpus.milli(),
            t.device_gpus().milli()
        ),
        (Topology::Allreduce, 2, 2, 500, 1000)
    );
    assert_eq!(rl_shape.gpu_type(), Some("V100"));
    assert!(rl_shape.roles[&rollout].shares_worker_devices);
    let c = &rl_shape.roles[&critic];
    assert_eq!(
        (
            c.topology,
            c.count,
            c.min,
            c.max,
            c.millicores,
            c.gpu_type.as_deref()
        ),
        (Topology::Allreduce, 2, 1, 3, 700, Some("A100"))
    );
    assert_eq!(rl_shape.placement[0].roles, vec![actor, rollout]);
    rl_shape.validate().unwrap();
    assert_eq!(s.trainers().unwrap(), [(rl, actor)].into());
    // Opened again, nothing changes.
    drop(s);
    let s = Store::open(&path).unwrap();
    assert_eq!(s.job(rl).unwrap().shape.unwrap(), rl_shape);
}
