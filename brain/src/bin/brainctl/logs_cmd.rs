//! `brainctl logs JOB [--role R --index I] [--follow]`: one process's output (its newest
//! incarnation) through the brain, which reads the job's run directory; with --follow, asked
//! again from where the last answer ended until the job has ended.

use std::io::Write;
use std::time::Duration;

use proto::service::v1 as pb;

use crate::link::{ask_brain, job_id};

/// How often --follow asks for more.
const POLL: Duration = Duration::from_millis(1000);

/// `role` left out: the job's training group (`worker`, or its all-reduce group's own name).
pub fn logs(
    job: &str,
    role: Option<&str>,
    index: u32,
    follow: bool,
    brain: &str,
) -> anyhow::Result<()> {
    let (id, trainer) = ask_brain(brain, async |mut c| {
        let id = job_id(&mut c, job).await?;
        let record = c
            .get_job(pb::GetJobRequest { job_id: id })
            .await?
            .into_inner();
        let trainer = record
            .shape
            .as_ref()
            .map_or("worker", brain::console::pages::trainer)
            .to_string();
        Ok((id, trainer))
    })?;
    let process = format!("{}-{index}", role.unwrap_or(&trainer));
    let (mut incarnation, mut offset) = (0, 0);
    loop {
        let piece = ask_brain(brain, async |mut c| {
            Ok(c.job_logs(pb::JobLogsRequest {
                job_id: id,
                process: process.clone(),
                offset,
                incarnation,
                tail: 0,
            })
            .await?
            .into_inner())
        })?;
        if piece.incarnation != incarnation {
            say_err!("== {} (incarnation {})", piece.path, piece.incarnation);
            incarnation = piece.incarnation;
        }
        print!("{}", vocab::text::printable_output(&piece.text));
        std::io::stdout().flush()?;
        offset = piece.next_offset;
        if !piece.text.is_empty() {
            continue; // more may be there already
        }
        if !follow || piece.ended {
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
}
