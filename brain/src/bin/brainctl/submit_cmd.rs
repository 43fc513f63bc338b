//! `brainctl submit SPEC [--wait]`: a job spec that may name no resources, what the brain
//! predicted for it and why, the job owner's token kept, and (with --wait) the job followed
//! to its end.

use std::path::Path;

use anyhow::{Context, bail};
use proto::service::v1 as pb;

use crate::jobs_cmd::print_shape;
use crate::link::ask_brain;

pub fn submit(
    spec: &Path,
    brain: &str,
    wait: bool,
    owner_token_file: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
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
    if !answer.owner_token.is_empty() {
        let path = owner_token_file.unwrap_or_else(|| {
            crate::link::owners_dir().join(format!("job-{}.owner.token", answer.job_id))
        });
        keep_owner_token(&path, &answer.owner_token).with_context(|| {
            format!(
                "job {} is submitted, but its owner's token could not be kept in {} (the \
                 operator token still steers it)",
                answer.job_id,
                path.display()
            )
        })?;
        say!(
            "  the owner's token for this job alone: {} (the console, and brainctl \
             --token-file {} jobs/events/logs/diagnose/scale/cancel)",
            path.display(),
            path.display()
        );
    }
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

/// Writes the owner's token to a new file only its user reads; an existing file (another job's
/// token, say) is never replaced, and a link is never followed.
fn keep_owner_token(path: &Path, token: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(format!("{token}\n").as_bytes())?;
    f.sync_all()?;
    Ok(())
}
