//! How a job's processes (its `command:`, or the built-in workload) are confined when the brain
//! runs them: as which user, and in which sandbox. The brain's operator sets it (`[launcher.sandbox]`); the brain hands it to
//! the job masters it starts in [`SANDBOX_ENV`], and they to their agents, which start each
//! process as [`Sandbox::run_as`] inside bubblewrap, seeing the system and the job's code read
//! only, its checkpoint directory writable, its own copy of the job's secret, a private `/tmp`,
//! and nothing of the brain's data ([`Sandbox::hide`]). What the sandbox's command line is, is
//! [`Sandbox::bwrap_args`] (pure: the paths are given).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The variable that carries a [`Sandbox`] (JSON) from the brain to a job master and its agents.
pub const SANDBOX_ENV: &str = "BRAIN_SANDBOX";

/// The variable that names (comma-separated) the variables of an agent's environment that its
/// job's processes get besides the agent's fixed set: what the job's spec gave the platform to
/// set for its agents (`platform: { env: ... }` on Ray).
pub const PASS_ENV: &str = "BRAIN_PASS_ENV";

/// How processes are confined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Linux namespaces through bubblewrap (`bwrap`, Debian's `bubblewrap`).
    #[default]
    Bwrap,
    /// None: processes see what their user may see (a trusted cluster only).
    None,
}

/// What the brain's config says of its jobs' processes (`[launcher.sandbox]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sandbox {
    /// The unprivileged user a job's processes run as. Required when the brain runs as
    /// root; without it (a brain that is not root) they run as the brain's user, sandboxed.
    #[serde(default)]
    pub run_as: Option<String>,
    #[serde(default)]
    pub isolation: Isolation,
    /// Paths a process may read beyond the system (`/usr`, `/etc`, ...) and its working
    /// directory: its interpreter and libraries (a virtualenv), its code.
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
    /// Paths a process must not see even where they lie inside one it may read: the brain's
    /// data directory and runs directory (set by the brain, not the operator).
    #[serde(default)]
    pub hide: Vec<PathBuf>,
    /// The most a process's output (stdout and stderr together, per incarnation) puts in its
    /// log, as a quantity (`"64Mi"`); past it the rest is dropped, with a note in the log
    /// [default: 256 MiB].
    #[serde(
        default,
        with = "crate::units::quantity::opt_memory",
        skip_serializing_if = "Option::is_none"
    )]
    pub output_cap: Option<crate::units::Bytes>,
}

/// The paths of one sandboxed process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confined<'a> {
    /// The working directory (read only; the job's relative paths resolve against it).
    pub cwd: &'a Path,
    /// The checkpoint directory (writable).
    pub checkpoint_dir: &'a Path,
    /// The process's flash checkpoint slots in shared memory (writable), when the job has them.
    pub flash_dir: Option<&'a Path>,
    /// The process's own copies of the job's secret and TLS files (read only).
    pub secrets: &'a Path,
    /// GPU device files to pass through (`/dev/nvidia*`).
    pub devices: &'a [PathBuf],
    /// The system's top-level entries that are links (`/bin -> usr/bin` on merged-/usr
    /// systems) with their targets; the others of `/bin`, `/sbin`, `/lib`, `/lib64` that exist
    /// are bound as directories.
    pub system_links: &'a [(PathBuf, PathBuf)],
    pub system_dirs: &'a [PathBuf],
}

impl Sandbox {
    /// bubblewrap's arguments (after `bwrap`, before the command): a fresh root with the
    /// system and `read_only` read only, `hide` covered by empty directories, the checkpoint
    /// directory writable, the secrets read only, private `/tmp`, `/proc` and `/dev`, its own
    /// process, IPC, host-name and cgroup namespaces (the network is shared: a process reaches
    /// its master and peers), killed with its agent.
    pub fn bwrap_args(&self, p: &Confined<'_>) -> Vec<String> {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        // Every namespace but the user's and the network's: bubblewrap makes a user namespace
        // itself when it runs unprivileged; run by root it builds the sandbox as root and the
        // command drops to the job's user inside (a user namespace would not map that user).
        let mut a: Vec<String> = [
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--ro-bind",
            "/usr",
            "/usr",
            "--ro-bind",
            "/etc",
            "/etc",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            // Writable by the job's user, sticky like a system's /tmp (torch and tempfile need
            // one; bubblewrap would make it root's, 0755).
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        for (link, target) in p.system_links {
            a.extend(["--symlink".into(), s(target), s(link)]);
        }
        for dir in p.system_dirs {
            a.extend(["--ro-bind".into(), s(dir), s(dir)]);
        }
        for dev in p.devices {
            a.extend(["--dev-bind".into(), s(dev), s(dev)]);
        }
        // bubblewrap makes the directories above a mount point its own (0700): the job's user
        // must pass through them.
        let parents = |a: &mut Vec<String>, dest: &Path| {
            let mut up: Vec<&Path> = dest.ancestors().skip(1).collect();
            up.reverse();
            for dir in up.into_iter().filter(|d| d.parent().is_some()) {
                a.extend(["--perms".into(), "0755".into(), "--dir".into(), s(dir)]);
            }
        };
        // A path inside /usr or /etc is there already (bound again, through a link such as
        // /usr/local/cuda -> cuda-13.0, bubblewrap fails to start).
        let system = |d: &Path| d.starts_with("/usr") || d.starts_with("/etc");
        let read_only = self.read_only.iter().map(PathBuf::as_path);
        for dir in read_only.filter(|d| !system(d)).chain([p.cwd]) {
            parents(&mut a, dir);
            a.extend(["--ro-bind".into(), s(dir), s(dir)]);
        }
        for dir in &self.hide {
            parents(&mut a, dir);
            a.extend(["--tmpfs".into(), s(dir)]);
        }
        parents(&mut a, p.checkpoint_dir);
        a.extend(["--bind".into(), s(p.checkpoint_dir), s(p.checkpoint_dir)]);
        if let Some(flash) = p.flash_dir {
            parents(&mut a, flash);
            a.extend(["--bind".into(), s(flash), s(flash)]);
        }
        parents(&mut a, p.secrets);
        a.extend(["--ro-bind".into(), s(p.secrets), s(p.secrets)]);
        a.extend(["--chdir".into(), s(p.cwd), "--".into()]);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_cap_is_a_quantity_and_travels_to_the_agents_whole() {
        let sb: Sandbox = serde_json::from_str(r#"{"output_cap": "1Mi"}"#).unwrap();
        assert_eq!(sb.output_cap, Some(crate::units::Bytes(1 << 20)));
        let again: Sandbox = serde_json::from_str(&serde_json::to_string(&sb).unwrap()).unwrap();
        assert_eq!(again, sb);
        let e = serde_json::from_str::<Sandbox>(r#"{"output_cap": "lots"}"#).unwrap_err();
        assert!(e.to_string().contains("not a number"), "{e}");
    }

    #[test]
    fn what_a_process_sees_is_bound_in_order_hidden_after_what_contains_it() {
        let sb = Sandbox {
            run_as: Some("brain-job".into()),
            isolation: Isolation::Bwrap,
            read_only: vec!["/opt/venv".into(), "/usr/local/cuda".into()],
            hide: vec!["/srv/brain-data".into()],
            output_cap: None,
        };
        let links = [(PathBuf::from("/bin"), PathBuf::from("usr/bin"))];
        let a = sb.bwrap_args(&Confined {
            cwd: Path::new("/srv"),
            checkpoint_dir: Path::new("/srv/brain-data/runs/j/checkpoints"),
            flash_dir: None,
            secrets: Path::new("/srv/brain-data/runs/j/master/sandbox/worker-0"),
            devices: &[],
            system_links: &links,
            system_dirs: &[],
        });
        let at = |w: &[&str]| {
            a.windows(w.len())
                .position(|x| x.iter().zip(w).all(|(a, b)| a == b))
                .unwrap_or_else(|| panic!("{w:?} not in {a:?}"))
        };
        let cwd = at(&["--ro-bind", "/srv", "/srv"]);
        let hidden = at(&["--tmpfs", "/srv/brain-data"]);
        let ckpt = at(&["--bind", "/srv/brain-data/runs/j/checkpoints"]);
        assert!(cwd < hidden && hidden < ckpt, "{a:?}");
        at(&["--ro-bind", "/opt/venv", "/opt/venv"]);
        // Under /usr already: not bound again.
        assert!(!a.iter().any(|w| w == "/usr/local/cuda"), "{a:?}");
        // A private /tmp the job's user may write.
        at(&["--perms", "1777", "--tmpfs", "/tmp"]);
        at(&["--symlink", "usr/bin", "/bin"]);
        at(&["--unshare-ipc", "--unshare-pid"]);
        assert!(
            !a.iter()
                .any(|w| w == "--unshare-net" || w == "--unshare-all")
        );
        assert_eq!(&a[a.len() - 3..], ["--chdir", "/srv", "--"]);
        let json = serde_json::to_string(&sb).unwrap();
        assert_eq!(serde_json::from_str::<Sandbox>(&json).unwrap(), sb);
    }
}
