//! Flash copies nobody will use again, found and removed on the node. An agent holds an
//! exclusive `flock` on its process's `agent.lock` (in the process's directory under the flash
//! root) for as long as it runs; the kernel lets go of it when the agent dies, kill -9 included.
//! When an agent with flash checkpoints starts, it sweeps the root: a process directory that no
//! agent holds and that nothing has written to for [`LEFTOVER_AFTER`] is what an agent killed
//! -9 left on a node its process never came back to (the job master removes its run's copies
//! only on its own node, and the agents theirs when the job ends), and goes.
//!
//! Removing one is always safe: a copy is only a faster way to restore (a restart restores from
//! disk when its copy is gone), and a copy being written out is held by its agent. The grace
//! leaves a copy to a process that the job master relaunches on the same node in the meantime.
//!
//! A sweep and a new agent of the same process never lose each other's work: the sweeper moves
//! the directory away while it holds the lock, and an agent that took the lock checks that its
//! file is still the one at the path (otherwise it starts over on a fresh directory). Nor do
//! they lose the run's directory: a sweep removes it once empty, and an agent that opened it
//! just before makes it again ([`make_and_hold`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use vocab::beneath::Beneath;

/// How long a directory no agent holds is left untouched before a sweep removes it.
pub const LEFTOVER_AFTER: Duration = Duration::from_secs(600);
/// The file an agent holds its process's directory by.
const LOCK: &str = "agent.lock";
/// What a sweep renames a directory to while it removes it (under the root).
const SWEPT: &str = ".swept-";

/// An agent's hold on its process's directory, released when dropped (or the agent dies).
pub struct Held(#[allow(dead_code)] Flock<File>);

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Held")
    }
}

/// The lock file of process directory `name` in `run` (a run's directory under the root, the
/// agent's), locked without waiting, when the directory is still the one at its name.
/// `Ok(None)`: another holds it. `Err`: the directory or file cannot be made or opened (a link
/// the job planted at the lock's name among them: it is never followed).
fn try_lock(run: &Beneath, name: &str, create: bool) -> std::io::Result<Option<Flock<File>>> {
    let dir = match create {
        true => run.make_dir(name, 0o700, None)?.0,
        false => run.dir(name)?,
    };
    if create {
        match dir.create_new(LOCK, 0o600, None) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    let file = dir.open_read(LOCK)?;
    let held = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(f) => f,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
        Err((_, e)) => return Err(e.into()),
    };
    // A sweep may have moved the directory away between the open and the lock.
    let same = match (run.entry(name), dir.stat()) {
        (Ok(Some(at)), Ok(open)) => (at.st_dev, at.st_ino) == (open.st_dev, open.st_ino),
        _ => false,
    };
    Ok(same.then_some(held))
}

/// Makes run directory `run` under the flash root `root` (mode 0711, when missing) and holds
/// process directory `name` in it ([`hold`]). A sweep removes a run's directory once it is
/// empty: one it removed between its making and the hold is made again.
pub fn make_and_hold(
    root: &Beneath,
    run: &str,
    name: &str,
) -> std::io::Result<(Beneath, Option<Held>)> {
    let mut tries = 0;
    loop {
        let (run_dir, _) = root.make_dir(run, 0o711, None)?;
        let held = hold(&run_dir, name);
        tries += 1;
        if held.is_some() || still_there(&run_dir) || tries >= 10 {
            return Ok((run_dir, held));
        }
    }
}

/// Whether directory `dir` is still linked where it was opened (a removed one has no link).
fn still_there(dir: &Beneath) -> bool {
    dir.stat().is_ok_and(|st| st.st_nlink > 0)
}

/// Holds process directory `name` in the run's directory `run` (made if missing) for this
/// agent. A sweep holds
/// it for a moment: tried again for a second. `None` when another agent of the same process
/// still holds it (one stopped but not yet dead): this one goes on without (it is not swept
/// while the other lives).
pub fn hold(run: &Beneath, name: &str) -> Option<Held> {
    for _ in 0..20 {
        match try_lock(run, name, true) {
            Ok(Some(f)) => return Some(Held(f)),
            Ok(None) => {}
            // The run's directory itself was swept away: the caller makes it again.
            Err(_) if !still_there(run) => return None,
            Err(e) => tracing::debug!("holding {}: {e}", run.join(name).display()),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::warn!(
        "{} is held by another agent: its flash copies are not this agent's to sweep",
        run.join(name).display()
    );
    None
}

/// The newest modification time in `dir` (itself and its entries, links not followed).
fn last_written(dir: &Beneath) -> Option<SystemTime> {
    let time = |st: &nix::sys::stat::FileStat| {
        SystemTime::UNIX_EPOCH
            + Duration::new(
                st.st_mtime.max(0) as u64,
                st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
            )
    };
    let mut newest = time(&dir.stat().ok()?);
    for name in dir.names().ok()? {
        if let Ok(Some(st)) = dir.entry(&name) {
            newest = newest.max(time(&st));
        }
    }
    Some(newest)
}

/// Removes under the flash root `root` every process directory no agent holds and nothing
/// wrote to for `after`, then the run directories left empty, and what an earlier sweep killed
/// mid-way left. Returns the process directories removed. Run and process directories are
/// reached by name through the open root, a link refused; removals never follow a link.
pub fn sweep(root: &Beneath, after: Duration) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(runs) = root.names() else {
        return removed;
    };
    let now = SystemTime::now();
    for name in runs {
        let path = root.join(&name);
        if let Some(pid) = name.strip_prefix(SWEPT).and_then(|s| s.split('-').next()) {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(&path);
            }
            continue;
        }
        let Ok(run) = root.dir(&name) else {
            continue;
        };
        for process in run.names().unwrap_or_default() {
            if sweep_one(root, &run, &process, now, after, removed.len()) {
                removed.push(run.join(&process));
            }
        }
        // Fails, as it should, while anything is left in it (or an agent just made one).
        let _ = std::fs::remove_dir(&path);
    }
    removed
}

/// Removes process directory `name` of the run's directory `run` when no agent holds it and
/// nothing wrote to it for `after`.
fn sweep_one(
    root: &Beneath,
    run: &Beneath,
    name: &str,
    now: SystemTime,
    after: Duration,
    n: usize,
) -> bool {
    let Ok(dir) = run.dir(name) else {
        return false;
    };
    // A directory made before agents held one has no lock file: it is made to take the lock.
    let create = matches!(dir.entry(LOCK), Ok(None));
    let Ok(Some(held)) = try_lock(run, name, create) else {
        return false;
    };
    let idle = last_written(&dir)
        .and_then(|t| now.duration_since(t).ok())
        .is_some_and(|idle| idle >= after);
    if !idle {
        return false;
    }
    let away = format!("{SWEPT}{}-{n}", std::process::id());
    if run.move_to(name, root, &away).is_err() {
        return false;
    }
    drop(held);
    match std::fs::remove_dir_all(root.join(&away)) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("cannot remove {}: {e}", root.join(&away).display());
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(root: &Path, run: &str, name: &str) -> PathBuf {
        let dir = root.join(run).join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("slot-0"), b"copy").unwrap();
        dir
    }

    fn open(p: &Path) -> Beneath {
        Beneath::open(p).unwrap()
    }

    fn sweep(root: &Path, after: Duration) -> Vec<PathBuf> {
        super::sweep(&open(root), after)
    }

    /// Holds process directory `dir` (`ROOT/RUN/NAME`), as an agent starting does.
    fn hold(dir: &Path) -> Option<Held> {
        let run = dir.parent().unwrap();
        let name = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_string();
        super::make_and_hold(&open(run.parent().unwrap()), &name(run), &name(dir))
            .unwrap()
            .1
    }

    fn try_lock(dir: &Path, create: bool) -> std::io::Result<Option<Flock<File>>> {
        let run = open(dir.parent().unwrap());
        super::try_lock(&run, dir.file_name().unwrap().to_str().unwrap(), create)
    }

    #[test]
    fn only_copies_no_agent_holds_and_nothing_wrote_to_lately_are_swept() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let held_dir = process(root, "run-a", "worker-0");
        let held = hold(&held_dir).expect("nobody else holds it");
        let left = process(root, "run-a", "worker-1");
        let other_run = process(root, "run-b", "rollout-0");
        // Nothing is old enough yet: everything stays.
        assert!(sweep(root, Duration::from_secs(60)).is_empty());
        assert!(left.exists() && other_run.exists());
        // Once old enough, what no agent holds goes; the held one stays, and its run with it.
        let mut gone = sweep(root, Duration::ZERO);
        gone.sort();
        assert_eq!(gone, vec![left.clone(), other_run.clone()]);
        assert!(held_dir.join("slot-0").exists());
        assert!(!left.exists() && !root.join("run-b").exists());
        // The agent gone (kill -9 lets go of its lock as this drop does), its copy goes too.
        drop(held);
        assert_eq!(sweep(root, Duration::ZERO), vec![held_dir]);
        assert_eq!(std::fs::read_dir(root).unwrap().count(), 0, "all removed");
    }

    #[test]
    fn an_agent_killed_minus_9_lets_go_and_its_copies_are_swept() {
        let root = tempfile::tempdir().unwrap();
        let dir = process(root.path(), "run", "worker-0");
        // Another process takes the lock and is killed: the kernel releases it.
        let mut holder = std::process::Command::new("flock")
            // --no-fork: `sleep` is the process that holds it, and the one killed.
            .args(["--no-fork", "-x"])
            .arg(dir.join(LOCK))
            .args(["sleep", "60"])
            .spawn()
            .expect("flock(1) runs");
        test_wait(|| matches!(try_lock(&dir, false), Ok(None)));
        assert!(sweep(root.path(), Duration::ZERO).is_empty(), "held");
        holder.kill().unwrap(); // SIGKILL
        holder.wait().unwrap();
        test_wait(|| matches!(try_lock(&dir, false), Ok(Some(_))));
        assert_eq!(sweep(root.path(), Duration::ZERO), vec![dir]);
    }

    #[test]
    fn a_new_agent_racing_a_sweep_ends_up_holding_a_directory_at_its_path() {
        let root = tempfile::tempdir().unwrap();
        for _ in 0..20 {
            let dir = process(root.path(), "run", "worker-0");
            let r = root.path().to_path_buf();
            let sweeper = std::thread::spawn(move || sweep(&r, Duration::ZERO));
            let held = hold(&dir).expect("held after the sweep");
            sweeper.join().unwrap();
            // Whatever the order, the agent holds the file at its path, and a sweep now
            // leaves it.
            assert!(dir.join(LOCK).exists());
            assert!(sweep(root.path(), Duration::ZERO).is_empty());
            drop(held);
            sweep(root.path(), Duration::ZERO);
        }
    }

    #[test]
    fn what_a_sweep_killed_mid_way_left_goes_at_the_next() {
        let root = tempfile::tempdir().unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let half = root.path().join(format!("{SWEPT}{}-0", gone.id()));
        std::fs::create_dir_all(half.join("x")).unwrap();
        let mine = root.path().join(format!("{SWEPT}{}-0", std::process::id()));
        std::fs::create_dir_all(&mine).unwrap();
        sweep(root.path(), Duration::ZERO);
        assert!(!half.exists());
        assert!(mine.exists(), "a running sweep's is its own to remove");
    }

    fn test_wait(mut f: impl FnMut() -> bool) {
        for _ in 0..200 {
            if f() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("not within 5 s");
    }
}
