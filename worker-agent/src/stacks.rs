//! Capturing the stacks of a training process the job master thinks is hung.
//!
//! Two sources, both read by the agent from outside the process:
//! * every thread's scheduler state and kernel wait channel (`/proc/PID/task/*`): always there,
//!   and the only thing a stopped (`T`) process can give;
//! * the process's own Python stacks: the SDK installs Python's `faulthandler` on SIGUSR1,
//!   writing to [`STACKS_FILE_ENV`]. The agent sends SIGUSR1 only to a process that catches it
//!   (`SigCgt` in `/proc/PID/status`), since its default action ends the process, and reads
//!   what the process appended to the file.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use vocab::beneath::Beneath;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Where a training process writes its stacks on SIGUSR1 (set by the agent).
pub const STACKS_FILE_ENV: &str = "BRAIN_STACKS_FILE";

/// The most text of one capture sent to the job master.
pub const MAX_STACKS_BYTES: usize = 64 * 1024;

/// The stacks file of slot `role`-`index`: beside the job's checkpoints (a directory the
/// process may write, also in a sandbox), one file per slot, appended to by each incarnation.
pub fn stacks_file(checkpoint_dir: &str, role: &str, index: u32) -> PathBuf {
    Path::new(checkpoint_dir)
        .join("stacks")
        .join(format!("{role}-{index}.txt"))
}

/// What `pid`'s threads are doing, and its Python stacks when it writes them on SIGUSR1.
pub async fn capture(pid: u32, file: &Path) -> String {
    let mut out = threads(pid);
    if catches_sigusr1(pid) && state(pid) != Some('T') {
        let before = stacks_len(file);
        if kill(Pid::from_raw(pid as i32), Signal::SIGUSR1).is_ok() {
            match appended(file, before).await {
                Some(text) => {
                    out.push_str("\nits own stacks (faulthandler):\n");
                    out.push_str(&text);
                }
                None => out.push_str("\nit wrote no stacks within 2 s of SIGUSR1\n"),
            }
        }
    }
    truncate(out)
}

/// The text appended to `file` past `from`, once it stops growing (at most 2 s).
async fn appended(file: &Path, from: u64) -> Option<String> {
    let mut last = from;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let len = stacks_len(file);
        if len > from && len == last {
            break;
        }
        last = len;
    }
    let mut f = open_stacks(file).ok()?;
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut new = Vec::new();
    f.take(MAX_STACKS_BYTES as u64 + 1)
        .read_to_end(&mut new)
        .ok()?;
    (!new.is_empty()).then(|| String::from_utf8_lossy(&new).into_owned())
}

/// The stacks file `file` (`CHECKPOINT_DIR/stacks/NAME`), opened for reading by the agent: the
/// checkpoint directory with a link at its own name refused, `stacks` and the file reached by
/// name through it, a link, FIFO or second name of another's file refused. The process writes
/// there and may have swapped the file for a link to one of root's.
fn open_stacks(file: &Path) -> std::io::Result<std::fs::File> {
    let bad = || std::io::Error::other(format!("{}: not a stacks file", file.display()));
    let name = file.file_name().and_then(|n| n.to_str()).ok_or_else(bad)?;
    let dir = file.parent().ok_or_else(bad)?;
    let ckpt = dir.parent().ok_or_else(bad)?;
    let dir_name = dir.file_name().and_then(|n| n.to_str()).ok_or_else(bad)?;
    Beneath::open(ckpt)?.dir(dir_name)?.open_read(name)
}

/// How long the stacks file is (0 when it is missing or refused).
fn stacks_len(file: &Path) -> u64 {
    open_stacks(file)
        .and_then(|f| f.metadata())
        .map_or(0, |m| m.len())
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_STACKS_BYTES {
        let mut cut = MAX_STACKS_BYTES;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("\n[cut at 64 KiB]\n");
    }
    s
}

/// The process's state letter (`R`, `S`, `D`, `T`, ...).
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    state_of_stat(&stat)
}

/// The state field of a `/proc/*/stat` line (after the command, which may hold spaces and
/// parentheses).
fn state_of_stat(stat: &str) -> Option<char> {
    stat.rsplit_once(") ")?.1.chars().next()
}

fn describe_state(c: char) -> &'static str {
    match c {
        'R' => "running",
        'S' => "sleeping",
        'D' => "in uninterruptible I/O",
        'T' => "stopped (SIGSTOP)",
        't' => "stopped by a debugger",
        'Z' => "a zombie",
        _ => "in another state",
    }
}

/// Whether `pid` has a handler for SIGUSR1 (bit 9 of `SigCgt`).
fn catches_sigusr1(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| sigcgt(&s))
        .is_some_and(|mask| mask & (1 << (Signal::SIGUSR1 as u64 - 1)) != 0)
}

fn sigcgt(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// One line per thread: id, name, state and kernel wait channel.
fn threads(pid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let mut out = match state(pid) {
        Some(c) => format!("process {pid} ({}) is {}\n", comm.trim(), describe_state(c)),
        None => return format!("process {pid} is gone\n"),
    };
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    for tid in tids {
        let base = format!("/proc/{pid}/task/{tid}");
        let name = std::fs::read_to_string(format!("{base}/comm")).unwrap_or_default();
        let st = std::fs::read_to_string(format!("{base}/stat"))
            .ok()
            .and_then(|s| state_of_stat(&s))
            .unwrap_or('?');
        let wchan = std::fs::read_to_string(format!("{base}/wchan")).unwrap_or_default();
        let wchan = match wchan.trim() {
            "" | "0" => "-".to_string(),
            w => w.to_string(),
        };
        out.push_str(&format!(
            "  thread {tid} {:<16} {st} waiting in {wchan}\n",
            name.trim()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_past_a_command_with_parentheses() {
        assert_eq!(state_of_stat("42 (a (b) c) T 1 42 42"), Some('T'));
        assert_eq!(state_of_stat("garbage"), None);
        assert_eq!(sigcgt("Name:\tx\nSigCgt:\t0000000000000200\n"), Some(0x200));
    }

    #[tokio::test]
    async fn a_stopped_process_is_said_stopped_and_is_not_signalled() {
        let mut child = tokio::process::Command::new("sleep")
            .arg("30")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
        // The stop takes effect asynchronously.
        for _ in 0..50 {
            if state(pid) == Some('T') {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let dir = tempfile::tempdir().unwrap();
        let text = capture(pid, &dir.path().join("s.txt")).await;
        assert!(text.contains("(sleep) is stopped (SIGSTOP)"), "{text}");
        assert!(text.contains("thread"), "{text}");
        // sleep does not catch SIGUSR1: it was not sent (it would have ended the process).
        kill(Pid::from_raw(pid as i32), Signal::SIGCONT).unwrap();
        assert!(child.try_wait().unwrap().is_none());
        child.kill().await.unwrap();
    }

    /// A process that swapped its stacks file for a link to a file of root's (the operator's
    /// token) gets nothing read through it; its own file is read from where it was.
    #[tokio::test]
    async fn a_stacks_file_swapped_for_a_link_is_not_read() {
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("operator.token");
        std::fs::write(&secret, "the operator's token").unwrap();
        let ckpt = d.path().join("ckpt");
        std::fs::create_dir_all(ckpt.join("stacks")).unwrap();
        let file = stacks_file(ckpt.to_str().unwrap(), "worker", 0);
        std::os::unix::fs::symlink(&secret, &file).unwrap();
        assert_eq!(stacks_len(&file), 0);
        assert_eq!(appended(&file, 0).await, None);
        // The stacks directory itself a link: refused too.
        std::fs::remove_file(&file).unwrap();
        std::fs::rename(ckpt.join("stacks"), d.path().join("elsewhere")).unwrap();
        std::fs::write(d.path().join("elsewhere/worker-0.txt"), "secret too").unwrap();
        std::os::unix::fs::symlink(d.path().join("elsewhere"), ckpt.join("stacks")).unwrap();
        assert_eq!(appended(&file, 0).await, None);
        // The process's own file, past what it held before.
        std::fs::remove_file(ckpt.join("stacks")).unwrap();
        std::fs::create_dir(ckpt.join("stacks")).unwrap();
        std::fs::write(&file, "old\nThread 0x1 (most recent call first):\n").unwrap();
        assert_eq!(
            appended(&file, 4).await.as_deref(),
            Some("Thread 0x1 (most recent call first):\n")
        );
    }

    #[test]
    fn a_long_capture_is_cut_on_a_character_boundary() {
        let s = truncate("é".repeat(MAX_STACKS_BYTES));
        assert!(s.len() <= MAX_STACKS_BYTES + 20);
        assert!(s.ends_with("[cut at 64 KiB]\n"));
    }
}
