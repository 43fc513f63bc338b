//! Paths made from what a user wrote, kept inside the directory they belong to. A job's name
//! and checkpoint directory become paths under the brain's runs directory; a planted symbolic
//! link or a `..` must not lead them out of it. [`inside`] resolves a path (what exists of it,
//! links included) and refuses one that ends outside its base; [`make_dir`] and [`create`]
//! make a directory or a file at a path without following a link already there (another
//! process may have planted one), and [`write_new`] replaces a file's contents whole without
//! writing through a link.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// `path` (relative to `base`, or absolute) as it resolves, when that is inside `base`:
/// components that exist are resolved (symbolic links followed, as the kernel would), the rest
/// appended; `..` is refused wherever it stands. Why not, otherwise.
pub fn inside(base: &Path, path: &Path) -> Result<PathBuf, String> {
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!("{} contains `..`", path.display()));
    }
    let base = base
        .canonicalize()
        .map_err(|e| format!("{}: {e}", base.display()))?;
    let full = base.join(path);
    // The longest prefix that exists, resolved; the rest as written.
    let mut existing = full.as_path();
    let mut rest = Vec::new();
    let resolved = loop {
        match existing.canonicalize() {
            Ok(r) => break r,
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    existing = parent;
                }
                _ => return Err(format!("{} cannot be resolved", full.display())),
            },
        }
    };
    let mut out = resolved;
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    if !out.starts_with(&base) {
        return Err(format!(
            "{} resolves to {}, outside {}",
            path.display(),
            out.display(),
            base.display()
        ));
    }
    Ok(out)
}

/// Why the checkpoint directory `ckpt` may not be used beside a job master whose run directory
/// is `master_dir`, or `Ok`: the job's processes own the checkpoint directory (it is given to
/// their user and bound writable into their sandbox), so it may be neither the master's run
/// directory nor anything inside it (its logs, secrets and sandbox copies) nor a directory the
/// master's run directory is inside (whoever owns that may swap what lies in it). Both paths
/// are compared as they resolve (what exists of them, links followed).
pub fn clear_of_master(ckpt: &Path, master_dir: &Path) -> Result<(), String> {
    if ckpt.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!("checkpoint.dir: {} contains `..`", ckpt.display()));
    }
    let resolve = |p: &Path| -> PathBuf {
        let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut existing = p.as_path();
        let mut rest = Vec::new();
        loop {
            if let Ok(r) = existing.canonicalize() {
                let mut out = r;
                out.extend(rest.iter().rev());
                return out;
            }
            match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    existing = parent;
                }
                _ => return p.clone(),
            }
        }
    };
    let (c, m) = (resolve(ckpt), resolve(master_dir));
    let why = if c == m {
        "is the job master's run directory"
    } else if c.starts_with(&m) {
        "is inside the job master's run directory"
    } else if m.starts_with(&c) {
        "holds the job master's run directory"
    } else {
        return Ok(());
    };
    Err(format!(
        "checkpoint.dir: {} {why} ({}): the job's processes own their checkpoint directory, \
         so it must lie apart from the master's files (the default, `checkpoints`, does)",
        ckpt.display(),
        m.display()
    ))
}

/// Makes the directory `path` (its parent must exist); a directory already there is taken
/// (`Ok(false)`), anything else there, a symbolic link included, is an error. `Ok(true)`: made.
pub fn make_dir(path: &Path) -> io::Result<bool> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(path)?;
            if meta.file_type().is_dir() {
                Ok(false)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a directory{}",
                        path.display(),
                        if meta.file_type().is_symlink() {
                            " (a symbolic link, not followed)"
                        } else {
                            ""
                        }
                    ),
                ))
            }
        }
        Err(e) => Err(e),
    }
}

/// Opens `path` for writing without following a symbolic link at it: created when missing;
/// with `append`, an existing regular file is appended to, else one must not exist.
pub fn create(path: &Path, append: bool) -> io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    if append {
        o.append(true).create(true);
    } else {
        o.write(true).create_new(true);
    }
    o.custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is a symbolic link (not followed)", path.display()),
                )
            } else {
                e
            }
        })
}

/// Replaces the contents of `path` with `bytes`: written to a new file beside it, then renamed
/// over it (a link at `path` is replaced, never written through).
pub fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = create(&tmp, false)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_stays_inside_its_base_after_links_are_resolved() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("runs/j");
        std::fs::create_dir_all(&base).unwrap();
        let outside = d.path().join("elsewhere");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, base.join("ckpt")).unwrap();
        let b = base.canonicalize().unwrap();
        assert_eq!(inside(&base, Path::new("a/b")).unwrap(), b.join("a/b"));
        assert_eq!(
            inside(&base, &base.join("c")).unwrap(),
            b.join("c"),
            "absolute inside"
        );
        for bad in ["../k", "a/../../k", "ckpt", "ckpt/x", "/etc"] {
            let e = inside(&base, Path::new(bad)).unwrap_err();
            assert!(e.contains("outside") || e.contains(".."), "{bad}: {e}");
        }
    }

    #[test]
    fn a_checkpoint_directory_lies_apart_from_the_master_s_files() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("runs/j");
        let master = run.join("master");
        std::fs::create_dir_all(master.join("logs")).unwrap();
        std::os::unix::fs::symlink(master.join("logs"), run.join("sneaky")).unwrap();
        for bad in [
            run.clone(),
            master.clone(),
            master.join("logs"),
            master.join("sandbox/worker-0"),
            run.join("sneaky"),
            d.path().to_path_buf(),
            run.join("master/tls"),
        ] {
            let e = clear_of_master(&bad, &master).unwrap_err();
            assert!(e.contains("checkpoint.dir"), "{}: {e}", bad.display());
        }
        for good in [
            run.join("checkpoints"),
            run.join("ckpt/a"),
            d.path().join("other"),
        ] {
            clear_of_master(&good, &master).unwrap();
        }
        assert!(clear_of_master(&run.join("x/../master"), &master).is_err());
    }

    #[test]
    fn nothing_is_made_or_written_through_a_planted_link() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link = d.path().join("job");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = make_dir(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(make_dir(&d.path().join("fresh")).unwrap());
        assert!(!make_dir(&d.path().join("fresh")).unwrap());

        let secret = target.join("brain.db");
        std::fs::write(&secret, "keep").unwrap();
        let planted = d.path().join("spec.yaml");
        std::os::unix::fs::symlink(&secret, &planted).unwrap();
        for append in [false, true] {
            let e = create(&planted, append).unwrap_err().to_string();
            assert!(
                e.contains("symbolic link") || e.contains("exists"),
                "{append}: {e}"
            );
        }
        write_new(&planted, b"spec").unwrap();
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&planted).unwrap(), "spec");
        assert!(!std::fs::symlink_metadata(&planted).unwrap().is_symlink());
    }
}
