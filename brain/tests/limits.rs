//! The limits a real brain process keeps (`[limits]` in its config): a message above
//! `max_message_bytes` is not decoded, a spec above `max_spec_bytes` and a batch of more than
//! `proto::MAX_REPORTS_PER_BATCH` reports are refused with the figures, and submissions beyond
//! `max_active_jobs` queued or running jobs wait for one to end; nothing refused is stored.
//! A job flooding the brain with reports is refused beyond `calls_per_second` and
//! `reports_per_second` while another job's reports all land; submissions beyond
//! `submissions_per_minute` are refused.

mod common;

use common::{client_with, operator_client};
use proto::service::v1 as pb;
use tonic::Code;

fn spec(name: &str, padding: usize) -> String {
    format!(
        "name: {name}\nkind: allreduce\nroles:\n  worker: {{ min: 2, max: 2 }}\n\
         workload:\n  builtin: {{}}\ndata: {{ num_samples: 1000, shard_size: 100 }}\n\
         checkpoint: {{ dir: checkpoints }}\n\
         # {}\n",
        "x".repeat(padding)
    )
}

/// A job's `i`-th metric report.
fn report(i: u64) -> pb::MetricReport {
    pb::MetricReport {
        at_unix_ms: 1_700_000_000_000 + i as i64,
        global_step: i,
        samples_per_second: 10.0,
        roles: common::counts(1, 0),
        ..Default::default()
    }
}

/// A brain with one CPU (submitted jobs of two workers wait) and `limits` as its `[limits]`;
/// returns it and its URL.
fn limited_brain(d: &std::path::Path, limits: &str) -> (common::Brain, String) {
    common::configured_brain(
        d,
        &format!("[cluster]\ncpus = 1\n[limits]\n{limits}"),
        |_| {},
    )
}

#[tokio::test]
async fn messages_specs_batches_and_jobs_beyond_the_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut brain, url) = limited_brain(
        dir.path(),
        "max_message_bytes = 65536\nmax_spec_bytes = 2048\nmax_active_jobs = 2\n",
    );
    let mut op = operator_client(&url).await;
    let mut submit = async |text: String| {
        op.submit_job(pb::SubmitJobRequest {
            spec_yaml: text,
            origin: "test".into(),
        })
        .await
    };

    let e = submit(spec("big", 3000)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("more than the 2048"), "{e:?}");
    let e = submit(spec("huge", 100_000)).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    // Two jobs wait for room (one CPU, two workers each); a third is refused until one ends.
    submit(spec("first", 10)).await.unwrap();
    submit(spec("second", 10)).await.unwrap();
    let e = submit(spec("third", 10)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("2 jobs are queued or running"),
        "{e:?}"
    );

    let mut op = operator_client(&url).await;
    let r = op
        .register_job(pb::RegisterJobRequest {
            job_name: "reporter".into(),
            master_address: "127.0.0.1:1".into(),
            shape: None,
        })
        .await
        .unwrap()
        .into_inner();
    let mut job = client_with(&url, auth::Token::parse(&r.job_token)).await;
    let e = job
        .report_metrics(pb::MetricsBatch {
            job_id: r.job_id,
            reports: (0..=proto::MAX_REPORTS_PER_BATCH as u64)
                .map(report)
                .collect(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("at most 1000 reports"), "{e:?}");
    let stored = job
        .report_metrics(pb::MetricsBatch {
            job_id: r.job_id,
            reports: (0..proto::MAX_REPORTS_PER_BATCH as u64)
                .map(report)
                .collect(),
        })
        .await
        .unwrap()
        .into_inner()
        .stored;
    assert_eq!(stored as usize, proto::MAX_REPORTS_PER_BATCH);

    let jobs = op
        .list_jobs(pb::ListJobsRequest {})
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let names: Vec<&str> = jobs.iter().map(|j| j.job_name.as_str()).collect();
    assert_eq!(names, ["first", "second", "reporter"]);
    let reporter = &jobs[2];
    assert_eq!(reporter.reports as usize, proto::MAX_REPORTS_PER_BATCH);
    brain.kill();
}

/// Two jobs report to one brain: one floods it from four connections, the other reports ten
/// times a second as a job master does. The flooder is refused (RESOURCE_EXHAUSTED, naming
/// the limit) beyond its rates and the store holds no more of its reports than they allow;
/// every one of the other job's reports is taken and stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flooding_job_is_refused_beyond_its_rate_and_another_job_s_reports_all_land() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    const CALLS: u64 = 50;
    const REPORTS: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let (mut brain, url) = limited_brain(
        dir.path(),
        &format!(
            "calls_per_second = {CALLS}\nreports_per_second = {REPORTS}\n\
             submissions_per_minute = 2\n"
        ),
    );
    let mut op = operator_client(&url).await;
    let mut register = async |name: &str| {
        let r = op
            .register_job(pb::RegisterJobRequest {
                job_name: name.into(),
                master_address: "127.0.0.1:1".into(),
                shape: None,
            })
            .await
            .unwrap()
            .into_inner();
        (r.job_id, auth::Token::parse(&r.job_token).unwrap())
    };
    let (flooder, flooder_token) = register("flooder").await;
    let (honest, honest_token) = register("honest").await;

    let run_for = Duration::from_secs(3);
    let start = Instant::now();
    let step = Arc::new(AtomicU64::new(0));
    let (stored, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut floods = Vec::new();
    for _ in 0..4 {
        let mut c = client_with(&url, Some(flooder_token.clone())).await;
        let (step, stored, refused) = (step.clone(), stored.clone(), refused.clone());
        floods.push(tokio::spawn(async move {
            while start.elapsed() < run_for {
                let first = step.fetch_add(100, Ordering::Relaxed);
                let batch = pb::MetricsBatch {
                    job_id: flooder,
                    reports: (first..first + 100).map(report).collect(),
                };
                match c.report_metrics(batch).await {
                    Ok(r) => {
                        stored.fetch_add(r.into_inner().stored.into(), Ordering::Relaxed);
                    }
                    Err(e) => {
                        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                        assert!(
                            e.message()
                                .contains(&format!("job {flooder} is over limits."))
                                && e.message().contains("try again in"),
                            "{e:?}"
                        );
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let mut c = client_with(&url, Some(honest_token)).await;
    let mut sent = 0u64;
    while start.elapsed() < run_for {
        let r = c
            .report_metrics(pb::MetricsBatch {
                job_id: honest,
                reports: vec![report(sent)],
            })
            .await
            .unwrap_or_else(|e| panic!("the honest job's report {sent} was refused: {e:?}"));
        assert_eq!(r.into_inner().stored, 1);
        sent += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for f in floods {
        f.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (stored, refused) = (
        stored.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    assert!(refused > 0, "the flooder was never refused");
    // A whole batch's burst, then the rate.
    let allowed = proto::MAX_REPORTS_PER_BATCH as f64 + REPORTS as f64 * elapsed;
    assert!(
        stored as f64 <= allowed,
        "the flooder stored {stored} reports in {elapsed:.1} s, more than {allowed}"
    );
    let jobs = common::jobs(&url).await.unwrap();
    let reports_of = |name: &str| jobs.iter().find(|j| j.job_name == name).unwrap().reports;
    assert_eq!(reports_of("honest"), sent);
    assert_eq!(reports_of("flooder"), stored);
    assert!(sent >= 10, "{sent}");

    // Two submissions a minute: the third is refused and not stored.
    let mut submit = async |name: &str| {
        op.submit_job(pb::SubmitJobRequest {
            spec_yaml: spec(name, 10),
            origin: "test".into(),
        })
        .await
    };
    submit("one").await.unwrap();
    submit("two").await.unwrap();
    let e = submit("three").await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message()
            .contains("the operator is over limits.submissions_per_minute (2 per minute)"),
        "{e:?}"
    );
    let jobs = common::jobs(&url).await.unwrap();
    assert!(jobs.iter().all(|j| j.job_name != "three"));
    assert_eq!(jobs.len(), 4);
    brain.kill();
}
