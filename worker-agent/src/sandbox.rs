//! Starting a job's process confined ([`vocab::sandbox::Sandbox`]): a `command:` or the
//! built-in workload, as the unprivileged user the brain's operator named, inside bubblewrap.
//! Before each start the agent gives the process its own copies of the job's secret and TLS
//! files (owned by that user: a secret must be its reader's), makes the checkpoint directory
//! that user's, and builds bubblewrap's view (the system and the job's code read only, the
//! brain's data hidden, the checkpoint directory writable). bubblewrap builds the sandbox as
//! the agent's user (root, when there is a user to run as: only it reaches the job's
//! directories), and the command drops to the job's user inside it (`setpriv`: no groups, no
//! capabilities, no new privileges); without a sandbox the user is switched between fork and
//! exec.
//!
//! bubblewrap stays the agent's child and the command its descendant: [`process_tree`] finds
//! the command (what a SIGTERM must reach, so that it can checkpoint) and what to sample.

use std::io;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid};
use vocab::sandbox::{Confined, Isolation, Sandbox};

/// A confined start: the program (bubblewrap, or the command itself without isolation), its
/// arguments, the user to switch to, and the variables that point the process at its copies.
pub struct Start {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub user: Option<(Uid, Gid)>,
    pub env: Vec<(String, String)>,
}

fn io_err(what: impl Into<String>) -> io::Error {
    io::Error::other(what.into())
}

/// The user and group of `name`; refused when it is root or unknown.
pub fn user(name: &str) -> io::Result<(Uid, Gid)> {
    let u = nix::unistd::User::from_name(name)
        .map_err(io::Error::from)?
        .ok_or_else(|| io_err(format!("run_as: no user named {name:?} on this machine")))?;
    if u.uid.is_root() {
        return Err(io_err(format!(
            "run_as: {name:?} is root: jobs run as an unprivileged user"
        )));
    }
    Ok((u.uid, u.gid))
}

/// bubblewrap on `PATH`.
pub fn bwrap() -> Option<PathBuf> {
    vocab::spec::host::resolve_program("bwrap")
}

/// Prepares the start of `command` for the slot `slot` (`worker-0`) of the job whose secret is
/// `token_file` (TLS files in `tls_dir`), writing into `checkpoint_dir`.
pub fn prepare(
    sandbox: &Sandbox,
    slot: &str,
    token_file: &Path,
    tls_dir: Option<&Path>,
    checkpoint_dir: &Path,
    flash_dir: Option<&Path>,
    command: &[String],
) -> io::Result<Start> {
    let user = sandbox.run_as.as_deref().map(user).transpose()?;
    let root = nix::unistd::geteuid().is_root();
    if user.is_some() && !root {
        return Err(io_err(
            "run_as: the agent is not root and cannot start a process as another user",
        ));
    }
    let own = |p: &Path| -> io::Result<()> {
        match user {
            Some((uid, gid)) => {
                nix::unistd::chown(p, Some(uid), Some(gid)).map_err(io::Error::from)
            }
            None => Ok(()),
        }
    };
    // The process's copies of the job's secrets, its user's alone.
    let secrets = token_file
        .parent()
        .unwrap_or(Path::new("."))
        .join("sandbox")
        .join(slot);
    let _ = std::fs::remove_dir_all(&secrets);
    std::fs::create_dir_all(&secrets)?;
    let token = auth::read_secret(token_file).map_err(|e| io_err(e.to_string()))?;
    let token_copy = secrets.join(auth::JOB_TOKEN_FILE);
    auth::write_secret(&token_copy, &token).map_err(|e| io_err(e.to_string()))?;
    own(&token_copy)?;
    let mut env = vec![(
        auth::JOB_TOKEN_ENV.to_string(),
        token_copy.to_string_lossy().into_owned(),
    )];
    if let Some(dir) = tls_dir {
        let copy = secrets.join(auth::tls::JOB_DIR);
        std::fs::create_dir_all(&copy)?;
        for f in [auth::tls::JOB_CA, auth::tls::JOB_CERT, auth::tls::JOB_KEY] {
            let bytes = if f == auth::tls::JOB_KEY {
                auth::read_private(&dir.join(f)).map_err(|e| io_err(e.to_string()))?
            } else {
                std::fs::read(dir.join(f))?
            };
            auth::write_private(&copy.join(f), &bytes).map_err(|e| io_err(e.to_string()))?;
            own(&copy.join(f))?;
        }
        own(&copy)?;
        env.push((
            auth::tls::JOB_TLS_ENV.to_string(),
            copy.to_string_lossy().into_owned(),
        ));
    }
    own(&secrets)?;
    // What the process writes: the checkpoint directory, its user's, given through the open
    // directory (a link at its name is refused, never followed). The flash directory was
    // made the user's with the process's slots (`FlashDir::open`).
    if root && let Some((uid, gid)) = user {
        vocab::beneath::Beneath::open(checkpoint_dir)?.chown(uid, gid)?;
    }
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| io_err("an empty command"))?;
    if sandbox.isolation == Isolation::None {
        return Ok(Start {
            program: PathBuf::from(program),
            args: rest.to_vec(),
            user,
            env,
        });
    }
    // The user's home is not in the sandbox: a writable one that is.
    env.push(("HOME".into(), "/tmp".into()));
    let bwrap = bwrap().ok_or_else(|| {
        io_err("bubblewrap (bwrap) is not installed: a job's processes run in it")
    })?;
    let cwd = std::env::current_dir()?;
    let (links, dirs) = system_entries();
    let devices = gpu_devices();
    let mut args = sandbox.bwrap_args(&Confined {
        cwd: &cwd,
        checkpoint_dir,
        flash_dir,
        secrets: &secrets,
        devices: &devices,
        system_links: &links,
        system_dirs: &dirs,
    });
    // bubblewrap run by root builds the sandbox as root (it reaches the job's directories,
    // which only the brain's user may traverse); the command drops to the job's user inside
    // it, with no capabilities and no way to gain any.
    if let Some((uid, gid)) = user {
        let setpriv = vocab::spec::host::resolve_program("setpriv")
            .ok_or_else(|| io_err("setpriv (util-linux) is not installed"))?;
        args.extend([
            setpriv.to_string_lossy().into_owned(),
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".into(),
            "--inh-caps=-all".into(),
            "--bounding-set=-all".into(),
            "--no-new-privs".into(),
            "--".into(),
        ]);
    }
    args.push(program.clone());
    args.extend(rest.iter().cloned());
    Ok(Start {
        program: bwrap,
        args,
        // The switch happens inside the sandbox.
        user: None,
        env,
    })
}

/// The system's top-level library and program directories: links (merged /usr) and real ones.
fn system_entries() -> (Vec<(PathBuf, PathBuf)>, Vec<PathBuf>) {
    let (mut links, mut dirs) = (Vec::new(), Vec::new());
    for d in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        let p = PathBuf::from(d);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(&p) {
                    links.push((p, target));
                }
            }
            Ok(m) if m.is_dir() => dirs.push(p),
            _ => {}
        }
    }
    (links, dirs)
}

/// NVIDIA's device files, passed through so that a process sees its GPUs.
fn gpu_devices() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/dev")
        .map(|r| {
            r.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("nvidia"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `pid` and its descendants, with their command names.
pub fn process_tree(pid: u32) -> Vec<(i32, String)> {
    let Ok(all) = procfs::process::all_processes() else {
        return vec![(pid as i32, String::new())];
    };
    let stats: Vec<_> = all.flatten().filter_map(|p| p.stat().ok()).collect();
    let mut tree = vec![(pid as i32, String::new())];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i].0;
        for s in &stats {
            if s.ppid == parent && !tree.iter().any(|(p, _)| *p == s.pid) {
                tree.push((s.pid, s.comm.clone()));
            }
        }
        i += 1;
    }
    if let Some(s) = stats.iter().find(|s| s.pid == pid as i32) {
        tree[0].1 = s.comm.clone();
    }
    tree
}

/// What a signal to a confined process must reach: the command and its children, not
/// bubblewrap (which would die at once and take the command with it before it could save).
pub fn signal_targets(pid: u32) -> Vec<i32> {
    process_tree(pid)
        .into_iter()
        .filter(|(_, comm)| comm != "bwrap")
        .map(|(p, _)| p)
        .collect()
}
