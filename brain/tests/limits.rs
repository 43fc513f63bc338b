//! The limits a real brain process keeps (`[limits]` in its config): a message above
//! `max_message_bytes` is not decoded, a spec above `max_spec_bytes` and a batch of more than
//! `proto::MAX_REPORTS_PER_BATCH` reports are refused with the figures, and submissions beyond
//! `max_active_jobs` queued or running jobs wait for one to end; nothing refused is stored.

mod common;

use std::process::Stdio;

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

#[tokio::test]
async fn messages_specs_batches_and_jobs_beyond_the_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("brain.toml"),
        format!(
            "database = \"{}\"\nruns_dir = \"{}\"\n[cluster]\ncpus = 1\n\
             [limits]\nmax_message_bytes = 65536\nmax_spec_bytes = 2048\nmax_active_jobs = 2\n",
            d.join("brain.db").display(),
            d.join("runs").display()
        ),
    )
    .unwrap();
    let (mut brain, addr) = common::spawn_brain(|cmd| {
        cmd.args(["--listen", "127.0.0.1:0", "--config"])
            .arg(d.join("brain.toml"))
            // Where the registry of the test's brains looks for the operator token.
            .arg("--database")
            .arg(d.join("brain.db"))
            .stderr(Stdio::null());
    });
    let url = format!("http://{addr}");
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
    let report = |i: u64| pb::MetricReport {
        at_unix_ms: 1_700_000_000_000 + i as i64,
        global_step: i,
        samples_per_second: 10.0,
        workers: 1,
        ..Default::default()
    };
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
