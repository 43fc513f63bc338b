//! `job-master logs RUN_DIR [--role R --index I] [--follow]`: one process's output, read from
//! the job's run directory alone (the job running or ended, its master reachable or not).

use std::path::PathBuf;
use std::time::Duration;

use vocab::run_dir::{REPORT_FILE, newest_log, read_log};

#[derive(clap::Args)]
pub struct LogsArgs {
    /// The job's run directory (`job-master run`'s --run-dir, runs/<job name> by default).
    run_dir: PathBuf,
    /// The process's role [default: the job's training group: `worker`, or its all-reduce
    /// group's own name].
    #[arg(long)]
    role: Option<String>,
    /// The process's index in its role.
    #[arg(long, default_value_t = 0)]
    index: u32,
    /// Go on printing what it writes, until the job has ended and its output is all printed.
    #[arg(long)]
    follow: bool,
}

/// The training group's role name, from the job's spec in the run directory's context
/// (`worker` when it cannot be read).
fn training_role(run_dir: &std::path::Path) -> String {
    std::fs::read(run_dir.join(vocab::run_dir::CONTEXT_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| serde_json::from_value::<vocab::JobSpec>(v["spec"].clone()).ok())
        .map_or_else(|| "worker".into(), |s| s.training_role().to_string())
}

/// How often --follow looks for more.
const POLL: Duration = Duration::from_millis(500);

pub async fn logs(args: &LogsArgs) -> anyhow::Result<std::process::ExitCode> {
    use std::io::Write;
    let role = args
        .role
        .clone()
        .unwrap_or_else(|| training_role(&args.run_dir));
    let process = format!("{role}-{}", args.index);
    let mut log = newest_log(&args.run_dir, &process).map_err(anyhow::Error::msg)?;
    say_err!(
        "== {} (incarnation {})",
        log.path.display(),
        log.incarnation
    );
    let mut offset = 0;
    loop {
        let (text, next) = read_log(&log.path, offset, 1 << 20)?;
        print!("{}", vocab::text::printable_output(&text));
        std::io::stdout().flush()?;
        offset = next;
        if !text.is_empty() {
            continue; // more may be there already
        }
        if !args.follow || args.run_dir.join(REPORT_FILE).exists() {
            return Ok(std::process::ExitCode::SUCCESS);
        }
        tokio::time::sleep(POLL).await;
        // A relaunch writes a new incarnation's file: follow it.
        if let Ok(newer) = newest_log(&args.run_dir, &process)
            && newer.incarnation > log.incarnation
        {
            say_err!(
                "== {} (incarnation {})",
                newer.path.display(),
                newer.incarnation
            );
            log = newer;
            offset = 0;
        }
    }
}
