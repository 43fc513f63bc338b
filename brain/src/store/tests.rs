//! Unit tests of the store on a real SQLite file.

use super::*;

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
        .propose_plan(a, &|v| vec![v as u8], "grow", Some(4), 30)
        .unwrap();
    let v2 = s
        .propose_plan(a, &|v| vec![v as u8], "grow more", None, 40)
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
    let shape = Shape {
        kind: vocab::JobKind::Allreduce,
        workers: 2,
        min_workers: 2,
        max_workers: 8,
        node_unit: 2,
        worker_millicores: 1000,
        ..Default::default()
    };
    assert!(shape.check_plan(Some(4), None).is_ok());
    assert_eq!(
        shape.check_plan(Some(10), None).unwrap_err(),
        "10 workers is outside the job's bounds [2, 8]"
    );
    assert_eq!(
        shape.check_plan(Some(3), None).unwrap_err(),
        "3 workers is not a multiple of the job's node_unit 2"
    );
    assert!(shape.check_plan(None, Some(1)).is_err());
    let ps = Shape {
        kind: vocab::JobKind::Ps,
        ps: 1,
        ps_millicores: 1000,
        ..shape
    };
    assert!(ps.check_plan(Some(2), Some(3)).is_ok());
    assert_eq!(
        ps.check_plan(None, Some(0)).unwrap_err(),
        "a ps job needs at least 1 parameter server"
    );
}
