//! `brainctl submit SPEC [--wait]`: a job spec that may name no resources, what the brain
//! predicted for it and why, and (with --wait) the job followed to its end.

use std::path::Path;

use anyhow::{Context, bail};
use proto::service::v1 as pb;

use crate::jobs_cmd::print_shape;
use crate::link::ask_brain;

pub fn submit(spec: &Path, brain: &str, wait: bool) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(spec).with_context(|| format!("reading {}", spec.display()))?;
    let origin = spec.display().to_string();
    let answer = ask_brain(brain, async |mut c| {
        Ok(c.submit_job(pb::SubmitJobRequest {
            spec_yaml: text,
            origin,
        })
        .await?
        .into_inner())
    })?;
    say!("job {} {}", answer.job_id, answer.state);
    if let Some(shape) = &answer.shape {
        print_shape(shape);
    }
    for r in &answer.reasons {
        say!("  - {r}");
    }
    if !wait {
        return Ok(());
    }
    let id = answer.job_id;
    let mut last = String::new();
    loop {
        let record = ask_brain(brain, async |mut c| {
            Ok(c.get_job(pb::GetJobRequest { job_id: id })
                .await?
                .into_inner())
        })?;
        let line = format!(
            "{} workers {} samples {}/{}",
            record.state,
            record.shape.as_ref().map_or(0, |s| {
                brain::console::pages::training(s).map_or(0, |t| t.count)
            }),
            record.samples_done,
            record.shape.as_ref().map_or(0, |s| s.total_samples)
        );
        if line != last {
            say!("{line}");
            last = line;
        }
        match record.state.as_str() {
            "succeeded" => {
                say!("{}", record.outcome);
                return Ok(());
            }
            "failed" => bail!("job {id} failed: {}", record.outcome),
            _ => std::thread::sleep(std::time::Duration::from_secs(1)),
        }
    }
}
