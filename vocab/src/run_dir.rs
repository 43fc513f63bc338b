//! The files a job master keeps in its run directory, as the brain and tests read them.

use std::path::Path;

use serde::Deserialize;

use crate::report::JobPhase;

/// The job context, rewritten atomically after every change.
pub const CONTEXT_FILE: &str = "job-context.json";
/// The final report ([`crate::report::JobReport`]), written when the job has ended.
pub const REPORT_FILE: &str = "report.json";

/// The processes' output, one file per process and incarnation: `logs/worker-0.1.log`.
pub const LOGS_DIR: &str = "logs";

/// One process's output file in a master's run directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessLog {
    /// The process, as its role and index name it (`worker-0`).
    pub process: String,
    /// Its incarnation (1 for the first launch, one more per relaunch).
    pub incarnation: u64,
    pub path: std::path::PathBuf,
}

/// Every process's output files in `master_dir`, by process then incarnation.
pub fn process_logs(master_dir: &Path) -> Vec<ProcessLog> {
    let mut logs: Vec<ProcessLog> = std::fs::read_dir(master_dir.join(LOGS_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (process, incarnation) = name.strip_suffix(".log")?.rsplit_once('.')?;
            let (role, index) = process.rsplit_once('-')?;
            (!role.is_empty() && index.parse::<u32>().is_ok()).then_some(())?;
            Some(ProcessLog {
                process: process.to_string(),
                incarnation: incarnation.parse().ok()?,
                path: e.path(),
            })
        })
        .collect();
    logs.sort_by(|a, b| (&a.process, a.incarnation).cmp(&(&b.process, b.incarnation)));
    logs
}

/// The output of `process`'s newest incarnation, or why there is none (naming those there are).
pub fn newest_log(master_dir: &Path, process: &str) -> Result<ProcessLog, String> {
    let logs = process_logs(master_dir);
    if let Some(log) = logs.iter().rev().find(|l| l.process == process) {
        return Ok(log.clone());
    }
    let mut there: Vec<&str> = logs.iter().map(|l| l.process.as_str()).collect();
    there.dedup();
    Err(if there.is_empty() {
        format!(
            "no process output in {} yet",
            master_dir.join(LOGS_DIR).display()
        )
    } else {
        format!(
            "no output of {process}; there is output of {}",
            there.join(", ")
        )
    })
}

/// At most `max` bytes of `path` from byte `offset` on, as text (invalid UTF-8 replaced, colour
/// escapes of older logs removed), and the offset after them. An offset past the end (the file
/// was replaced) starts again at 0.
pub fn read_log(path: &Path, offset: u64, max: u64) -> std::io::Result<(String, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let from = if offset > len { 0 } else { offset };
    f.seek(SeekFrom::Start(from))?;
    let mut bytes = Vec::new();
    f.take(max).read_to_end(&mut bytes)?;
    let next = from + bytes.len() as u64;
    Ok((strip_ansi(&String::from_utf8_lossy(&bytes)), next))
}

/// The last `lines` lines the training process wrote to `path`, without its agent's own log
/// lines (`2026-...Z  INFO worker_agent...`): what a user needs to see why it failed. Reads at
/// most the file's last 64 KiB.
pub fn last_output(path: &Path, lines: usize) -> std::io::Result<Vec<String>> {
    const TAIL: u64 = 64 << 10;
    let len = std::fs::metadata(path)?.len();
    let (text, _) = read_log(path, len.saturating_sub(TAIL), TAIL)?;
    let mut kept: Vec<String> = text
        .lines()
        // A cut first line is not shown half.
        .skip(usize::from(len > TAIL))
        .filter(|l| !is_agent_line(l) && !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    kept.drain(..kept.len().saturating_sub(lines));
    Ok(kept)
}

/// Whether `line` is one of the worker agent's own log lines (its tracing format: an RFC 3339
/// time, a level, then the `worker_agent` target).
fn is_agent_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let (Some(at), Some(level), Some(target)) = (words.next(), words.next(), words.next()) else {
        return false;
    };
    at.len() > 20
        && at.as_bytes()[4] == b'-'
        && at.ends_with('Z')
        && ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level)
        && target.starts_with("worker_agent")
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Whether the master of the job in `master_dir` left it unfinished: its persisted context
/// says it still runs and there is no report. A missing or unreadable context is not
/// unfinished work (nothing can be resumed from it).
pub fn left_unfinished(master_dir: &Path) -> bool {
    #[derive(Deserialize)]
    struct Context {
        phase: JobPhase,
    }
    !master_dir.join(REPORT_FILE).exists()
        && std::fs::read(master_dir.join(CONTEXT_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<Context>(&b).ok())
            .is_some_and(|c| !c.phase.is_terminal())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_output_keeps_the_process_lines_not_the_agents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-1.2.log");
        std::fs::write(
            &path,
            "2026-11-27T03:06:39.826543Z  INFO worker_agent::agent: registered role=\"worker\"\n\
             Traceback (most recent call last):\n  File \"train.py\", line 3\n\n\
             ModuleNotFoundError: No module named 'torch'\n\
             \u{1b}[2m2026-11-27T03:07:09.064151Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \
             \u{1b}[2mworker_agent::agent\u{1b}[0m: training process exited exit_code=1\n",
        )
        .unwrap();
        assert_eq!(
            last_output(&path, 2).unwrap(),
            [
                "  File \"train.py\", line 3",
                "ModuleNotFoundError: No module named 'torch'"
            ]
        );
        assert_eq!(last_output(&path, 10).unwrap().len(), 3);
        assert!(last_output(&dir.path().join("none.log"), 3).is_err());
    }

    #[test]
    fn process_logs_are_found_by_process_and_incarnation_and_read_from_an_offset() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join(LOGS_DIR);
        std::fs::create_dir(&logs).unwrap();
        for f in [
            "worker-0.1.log",
            "worker-0.2.log",
            "worker-10.1.log",
            "ps-0.1.log",
            "x.log",
        ] {
            std::fs::write(logs.join(f), "").unwrap();
        }
        let found: Vec<(String, u64)> = process_logs(dir.path())
            .into_iter()
            .map(|l| (l.process, l.incarnation))
            .collect();
        assert_eq!(
            found,
            [
                ("ps-0", 1),
                ("worker-0", 1),
                ("worker-0", 2),
                ("worker-10", 1)
            ]
            .map(|(p, i)| (p.to_string(), i))
        );
        assert_eq!(newest_log(dir.path(), "worker-0").unwrap().incarnation, 2);
        let e = newest_log(dir.path(), "worker-3").unwrap_err();
        assert!(e.contains("ps-0, worker-0, worker-10"), "{e}");
        let path = logs.join("worker-0.2.log");
        std::fs::write(
            &path,
            "\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m started\nmore\n",
        )
        .unwrap();
        let (text, next) = read_log(&path, 0, 1 << 20).unwrap();
        assert_eq!(text, "2026  INFO started\nmore\n");
        let (rest, end) = read_log(&path, next - 5, 1 << 20).unwrap();
        assert_eq!((rest.as_str(), end), ("more\n", next));
        assert_eq!(read_log(&path, next, 10).unwrap(), (String::new(), next));
        // A replaced, shorter file is read from its start.
        std::fs::write(&path, "new\n").unwrap();
        assert_eq!(read_log(&path, next, 10).unwrap(), ("new\n".to_string(), 4));
    }

    #[test]
    fn only_a_running_context_without_a_report_is_unfinished() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(!left_unfinished(d), "no context at all");
        std::fs::write(d.join(CONTEXT_FILE), r#"{"phase":"Running","other":1}"#).unwrap();
        assert!(left_unfinished(d));
        std::fs::write(
            d.join(CONTEXT_FILE),
            r#"{"phase":{"Failed":{"reason":"x"}}}"#,
        )
        .unwrap();
        assert!(!left_unfinished(d));
        std::fs::write(d.join(CONTEXT_FILE), r#"{"phase":"Finishing"}"#).unwrap();
        assert!(left_unfinished(d));
        std::fs::write(d.join(REPORT_FILE), "{}").unwrap();
        assert!(!left_unfinished(d), "a report means the job ended");
    }
}
