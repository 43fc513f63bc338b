//! A local job master known beyond the brain that started it. The brain writes each local
//! master's pid and start time into its run directory ([`PID_FILE`]); a brain started again
//! after a kill reads it back and follows the master, which is no longer its child, to its end
//! (see `Launcher::follow_again`): a master killed while no brain watched, or after the brain
//! came back, is then resumed like any other. The start time tells a reused pid apart.

use std::path::Path;
use std::time::Duration;

/// In a job's run directory: `PID START_TICKS` of its local master.
pub const PID_FILE: &str = "job-master.pid";

/// A process by its pid and its start time (clock ticks after boot, from `/proc/PID/stat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MasterProcess {
    pub pid: u32,
    pub start_ticks: u64,
}

impl MasterProcess {
    /// The live process `pid`, if there is one.
    pub fn of(pid: u32) -> Option<MasterProcess> {
        let stat = procfs::process::Process::new(i32::try_from(pid).ok()?)
            .ok()?
            .stat()
            .ok()?;
        (stat.state != 'Z').then_some(MasterProcess {
            pid,
            start_ticks: stat.starttime,
        })
    }

    /// Records it in `run_dir`.
    pub fn write(self, run_dir: &Path) -> std::io::Result<()> {
        std::fs::write(
            run_dir.join(PID_FILE),
            format!("{} {}\n", self.pid, self.start_ticks),
        )
    }

    /// The master recorded in `run_dir`, if a readable record is there.
    pub fn read(run_dir: &Path) -> Option<MasterProcess> {
        let text = std::fs::read_to_string(run_dir.join(PID_FILE)).ok()?;
        let mut parts = text.split_whitespace();
        Some(MasterProcess {
            pid: parts.next()?.parse().ok()?,
            start_ticks: parts.next()?.parse().ok()?,
        })
    }

    /// Whether it still runs: a live process with its pid and its start time.
    pub fn running(self) -> bool {
        MasterProcess::of(self.pid) == Some(self)
    }

    /// Returns once it has ended, looking every `every`.
    pub async fn ended(self, every: Duration) {
        while self.running() {
            tokio::time::sleep(every).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_recorded_master_is_followed_to_its_end_and_a_reused_pid_is_not_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = MasterProcess::of(child.id()).unwrap();
        me.write(dir.path()).unwrap();
        let read = MasterProcess::read(dir.path()).unwrap();
        assert_eq!(read, me);
        assert!(read.running());
        // The same pid started at another time is another process.
        let other = MasterProcess {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(!other.running());
        child.kill().unwrap();
        // Not reaped yet: a zombie has ended too.
        tokio::time::timeout(
            Duration::from_secs(5),
            read.ended(Duration::from_millis(20)),
        )
        .await
        .unwrap();
        child.wait().unwrap();
        assert!(!read.running());
        std::fs::write(dir.path().join(PID_FILE), "garbage").unwrap();
        assert_eq!(MasterProcess::read(dir.path()), None);
    }
}
