//! File operations inside a directory a job's processes can write, for a component that runs
//! as root (the worker agent, the job master). Such a directory is opened once ([`Beneath`]);
//! everything inside it is then reached by one name at a time relative to that open directory,
//! never by a path, and a symbolic link is never followed (`O_NOFOLLOW` at every step, `O_EXCL`
//! for a file made new, `renameat` within the directory). A file read there must be a regular
//! file with one link, owned by the directory's owner or by this process' user, so that a hard
//! link to a file of root's is not read either; a read is bounded. What a job planted is then
//! refused with an error that names it, and nothing outside the directory is read or written
//! through it: this is runc's rule for a privileged component acting in a directory an
//! unprivileged workload controls.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{Gid, Uid};

/// An open directory that everything inside is reached through (see the module's doc).
#[derive(Debug)]
pub struct Beneath {
    fd: OwnedFd,
    path: PathBuf,
}

/// An owner to give what is made (a job's user), or `None` to keep this process' own.
pub type Owner = Option<(Uid, Gid)>;

fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: {why}", path.display()),
    )
}

/// `name` as one component of a path: no `/`, not empty, not `.` or `..`.
fn component(dir: &Path, name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(refused(
            &dir.join(name),
            "not a single name inside its directory",
        ));
    }
    Ok(())
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

impl Beneath {
    /// Opens the directory at `path`; a symbolic link at its last component is refused (what
    /// lies above it is the operator's, followed as the kernel does).
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = nix::fcntl::open(path, dir_flags(), Mode::empty())
            .map_err(|e| explain(path, e, Errno::ENOTDIR))?;
        Ok(Self {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Opens the directory at `path`, made with `mode` when missing (its parent must exist),
    /// and refuses it unless it is this process' user's and nobody else may write in it: a
    /// fixed path in a directory anybody writes (`/dev/shm`) may have been made first by
    /// somebody else to steer what is written there. One that is ours gets `mode`.
    pub fn private(path: &Path, mode: u32) -> io::Result<Self> {
        match nix::unistd::mkdir(path, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("{}: {e}", path.display()),
                ));
            }
        }
        let dir = Self::open(path)?;
        let st = dir.stat()?;
        let me = nix::unistd::geteuid().as_raw();
        if st.st_uid != me || st.st_mode & 0o022 != 0 {
            return Err(refused(
                path,
                &format!(
                    "owned by uid {} with mode {:o}, not this process' uid {me} alone: somebody \
                     else may have made it first; remove it, or choose another directory",
                    st.st_uid,
                    st.st_mode & 0o7777
                ),
            ));
        }
        nix::sys::stat::fchmod(&dir.fd, Mode::from_bits_truncate(mode))
            .map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?;
        Ok(dir)
    }

    /// The directory `rel` below `base` (opened as [`Self::open`] does): each component of
    /// `rel` reached by name through the one above it, a link refused. `rel` may be empty
    /// (`base` itself) and must hold names only (no `..`, not absolute).
    pub fn open_below(base: &Path, rel: &Path) -> io::Result<Self> {
        let mut dir = Self::open(base)?;
        for c in rel.components() {
            match c {
                std::path::Component::Normal(name) => {
                    let name = name.to_str().ok_or_else(|| refused(rel, "not UTF-8"))?;
                    dir = dir.dir(name)?;
                }
                std::path::Component::CurDir => {}
                _ => return Err(refused(rel, "not a path of names below its directory")),
            }
        }
        Ok(dir)
    }

    /// The open directory `dir` and the name of `path` in it, where `path` lies below `base`:
    /// what a file inside a job's directory is reached by.
    pub fn parent_below(base: &Path, path: &Path) -> io::Result<(Self, String)> {
        let rel = path
            .strip_prefix(base)
            .map_err(|_| refused(path, &format!("not inside {}", base.display())))?;
        let name = rel
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| refused(path, "names no file"))?
            .to_string();
        let dir = Self::open_below(base, rel.parent().unwrap_or(Path::new("")))?;
        Ok((dir, name))
    }

    /// Removes `name` and everything in it (a link at any depth is removed, never followed;
    /// the walk goes through the open directory, not through its path).
    pub fn remove_tree(&self, name: &str) -> io::Result<()> {
        component(&self.path, name)?;
        match self.entry(name)? {
            None => Ok(()),
            Some(st) if kind(&st) != SFlag::S_IFDIR => self.remove_file(name),
            // `/proc/self/fd/N` is the open directory itself, whatever its path has become.
            Some(_) => std::fs::remove_dir_all(self.proc_path().join(name)).map_err(|e| {
                io::Error::new(e.kind(), format!("{}: {e}", self.join(name).display()))
            }),
        }
    }

    fn proc_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Where it was opened (for messages and for what is reported by path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` inside it (for messages and reports, never to be opened as root).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn stat(&self) -> io::Result<FileStat> {
        nix::sys::stat::fstat(&self.fd).map_err(|e| self.err(None, e))
    }

    /// The existing directory `name` inside it; a link there is refused.
    pub fn dir(&self, name: &str) -> io::Result<Self> {
        component(&self.path, name)?;
        let fd = nix::fcntl::openat(&self.fd, name, dir_flags(), Mode::empty())
            .map_err(|e| self.explain(name, e, Errno::ENOTDIR))?;
        Ok(Self {
            fd,
            path: self.join(name),
        })
    }

    /// The directory `name` inside it, made with `mode` (and given to `owner`) when missing;
    /// whether it was made. Anything else at that name, a link included, is refused.
    pub fn make_dir(&self, name: &str, mode: u32, owner: Owner) -> io::Result<(Self, bool)> {
        component(&self.path, name)?;
        let made = match nix::sys::stat::mkdirat(&self.fd, name, Mode::from_bits_truncate(mode)) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(self.err(Some(name), e)),
        };
        let dir = self.dir(name)?;
        if made && let Some((uid, gid)) = owner {
            dir.chown(uid, gid)?;
        }
        Ok((dir, made))
    }

    /// Gives the directory itself to `uid`:`gid` (through the open directory: a link swapped in
    /// at its path since is not followed).
    pub fn chown(&self, uid: Uid, gid: Gid) -> io::Result<()> {
        nix::unistd::fchown(&self.fd, Some(uid), Some(gid)).map_err(|e| self.err(None, e))
    }

    /// Opens the regular file `name` for reading (see the module's doc for what is refused).
    pub fn open_read(&self, name: &str) -> io::Result<File> {
        self.open_file(name, OFlag::O_RDONLY)
    }

    /// Opens the existing regular file `name` with `flags` (`O_RDONLY`, `O_WRONLY`, ... and
    /// any others such as `O_DIRECT`), on the same terms as [`Self::open_read`].
    pub fn open_file(&self, name: &str, flags: OFlag) -> io::Result<File> {
        component(&self.path, name)?;
        // Non-blocking: a FIFO planted at the name must not hold the open.
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            flags | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
            Mode::empty(),
        )
        .map_err(|e| self.explain(name, e, Errno::ELOOP))?;
        let file = File::from(fd);
        self.check_regular(name, &file)?;
        // Back to blocking for what follows (regular files ignore it, but say what we mean).
        let fl = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)
            .map_err(|e| self.err(Some(name), e))?;
        let fl = OFlag::from_bits_truncate(fl) - OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(fl))
            .map_err(|e| self.err(Some(name), e))?;
        Ok(file)
    }

    fn check_regular(&self, name: &str, file: &File) -> io::Result<()> {
        let st = nix::sys::stat::fstat(file).map_err(|e| self.err(Some(name), e))?;
        if kind(&st) != SFlag::S_IFREG {
            return Err(refused(&self.join(name), "not a regular file"));
        }
        let dir_owner = self.stat()?.st_uid;
        let me = nix::unistd::geteuid().as_raw();
        if st.st_nlink != 1 || (st.st_uid != dir_owner && st.st_uid != me) {
            return Err(refused(
                &self.join(name),
                &format!(
                    "a file of uid {} with {} links in a directory of uid {dir_owner}: not read \
                     (a hard link to another's file)",
                    st.st_uid, st.st_nlink
                ),
            ));
        }
        Ok(())
    }

    /// The contents of the regular file `name`, refused past `limit` bytes.
    pub fn read(&self, name: &str, limit: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.open_read(name)?
            .take(limit + 1)
            .read_to_end(&mut out)?;
        if out.len() as u64 > limit {
            return Err(refused(
                &self.join(name),
                &format!("longer than {limit} bytes: not read"),
            ));
        }
        Ok(out)
    }

    /// Makes the file `name`, which must not exist (a link there included), with `mode`, for
    /// writing, given to `owner`.
    pub fn create_new(&self, name: &str, mode: u32, owner: Owner) -> io::Result<File> {
        component(&self.path, name)?;
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC
                | OFlag::O_NOCTTY,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| self.explain(name, e, Errno::EEXIST))?;
        let file = File::from(fd);
        if let Some((uid, gid)) = owner {
            nix::unistd::fchown(&file, Some(uid), Some(gid))
                .map_err(|e| self.err(Some(name), e))?;
        }
        Ok(file)
    }

    /// Replaces `name` with a file of `bytes` (mode `mode`, given to `owner`) whole and durably:
    /// written under a new name beside it, synced, renamed over it, the directory synced. A
    /// link at `name` is replaced, never written through.
    pub fn replace(&self, name: &str, bytes: &[u8], mode: u32, owner: Owner) -> io::Result<()> {
        component(&self.path, name)?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = format!(".{name}.tmp-{}-{n}", std::process::id());
        match self.remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut f = self.create_new(&tmp, mode, owner)?;
        let written = f.write_all(bytes).and_then(|()| f.sync_all());
        if let Err(e) = written.and_then(|()| self.rename(&tmp, name)) {
            let _ = self.remove_file(&tmp);
            return Err(e);
        }
        self.sync()
    }

    /// Renames `from` to `to` inside it (what is at `to`, a link included, is replaced).
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        component(&self.path, from)?;
        component(&self.path, to)?;
        self.move_to(from, self, to)
    }

    /// Moves `from` inside it to `to` inside `dest` (what is at `to` is replaced, as
    /// [`Self::rename`] does).
    pub fn move_to(&self, from: &str, dest: &Beneath, to: &str) -> io::Result<()> {
        component(&self.path, from)?;
        component(&dest.path, to)?;
        nix::fcntl::renameat(&self.fd, from, &dest.fd, to).map_err(|e| self.err(Some(from), e))
    }

    /// Removes the entry `name` that is not a directory (a link is removed, not followed).
    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        component(&self.path, name)?;
        nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(|e| self.err(Some(name), e))
    }

    /// What is at `name`, a link not followed; `None` when nothing is.
    pub fn entry(&self, name: &str) -> io::Result<Option<FileStat>> {
        component(&self.path, name)?;
        match nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.err(Some(name), e)),
        }
    }

    /// The names in it (`.` and `..` left out), in no order.
    pub fn names(&self) -> io::Result<Vec<String>> {
        let fd = nix::fcntl::openat(&self.fd, ".", dir_flags(), Mode::empty())
            .map_err(|e| self.err(None, e))?;
        let mut d = nix::dir::Dir::from_fd(fd).map_err(|e| self.err(None, e))?;
        let mut out = Vec::new();
        for e in d.iter() {
            let e = e.map_err(|e| self.err(None, e))?;
            let name = OsStr::from_bytes(e.file_name().to_bytes());
            if name != "." && name != ".." {
                out.push(name.to_string_lossy().into_owned());
            }
        }
        Ok(out)
    }

    /// Syncs the directory (a rename in it made durable).
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(&self.fd).map_err(|e| self.err(None, e))
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn err(&self, name: Option<&str>, e: Errno) -> io::Error {
        let path = name.map_or_else(|| self.path.clone(), |n| self.join(n));
        io::Error::new(
            io::Error::from(e).kind(),
            format!("{}: {e}", path.display()),
        )
    }

    /// An open's error, said plainly where a link was met (`ELOOP`, or `link_errno` when the
    /// entry turns out to be a link).
    fn explain(&self, name: &str, e: Errno, link_errno: Errno) -> io::Error {
        let is_link = e == Errno::ELOOP
            || (e == link_errno
                && self
                    .entry(name)
                    .ok()
                    .flatten()
                    .is_some_and(|st| kind(&st) == SFlag::S_IFLNK));
        if is_link {
            return refused(
                &self.join(name),
                "a symbolic link, not followed (nothing is read or written through a link in a \
                 job's directory)",
            );
        }
        self.err(Some(name), e)
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// [`Beneath::explain`] for a path opened from outside any directory.
fn explain(path: &Path, e: Errno, link_errno: Errno) -> io::Error {
    let is_link = e == Errno::ELOOP
        || (e == link_errno
            && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()));
    if is_link {
        return refused(
            path,
            "a symbolic link, not followed (nothing is read or written through a link in a \
             job's directory)",
        );
    }
    io::Error::new(
        io::Error::from(e).kind(),
        format!("{}: {e}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn secret(d: &Path) -> PathBuf {
        let outside = d.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"operator token").unwrap();
        outside
    }

    #[test]
    fn nothing_is_read_or_written_through_a_planted_link() {
        let d = tempfile::tempdir().unwrap();
        let outside = secret(d.path());
        let job = d.path().join("job");
        std::fs::create_dir(&job).unwrap();
        symlink(outside.join("secret"), job.join("slot-0")).unwrap();
        symlink(&outside, job.join("flash")).unwrap();
        symlink(outside.join("new"), job.join("part.tmp")).unwrap();
        let dir = Beneath::open(&job).unwrap();

        let e = dir.read("slot-0", 1 << 20).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = dir.make_dir("flash", 0o700, None).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = dir.dir("flash").unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = dir
            .create_new("part.tmp", 0o600, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link") || e.contains("exists"), "{e}");
        assert!(!outside.join("new").exists());
        // A replace puts a file where the link was, and leaves its target alone.
        dir.replace("slot-0", b"status", 0o600, None).unwrap();
        assert_eq!(
            std::fs::read(outside.join("secret")).unwrap(),
            b"operator token"
        );
        assert_eq!(dir.read("slot-0", 100).unwrap(), b"status");
        // The directory itself swapped for a link after it was opened: the open one is used.
        std::fs::rename(&job, d.path().join("moved")).unwrap();
        symlink(&outside, &job).unwrap();
        dir.replace("status.json", b"{}", 0o600, None).unwrap();
        assert!(!outside.join("status.json").exists());
        assert!(d.path().join("moved/status.json").exists());
        let e = Beneath::open(&job).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
    }

    #[test]
    fn a_name_is_one_component_and_a_read_is_bounded_and_regular() {
        let d = tempfile::tempdir().unwrap();
        let dir = Beneath::open(d.path()).unwrap();
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert!(dir.read(bad, 10).is_err(), "{bad:?}");
            assert!(dir.create_new(bad, 0o600, None).is_err(), "{bad:?}");
        }
        std::fs::write(d.path().join("big"), vec![b'x'; 100]).unwrap();
        assert_eq!(dir.read("big", 100).unwrap().len(), 100);
        let e = dir.read("big", 99).unwrap_err().to_string();
        assert!(e.contains("longer than 99"), "{e}");
        // A FIFO does not hold the open, and is refused.
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let e = dir.read("fifo", 10).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // A second link to a file is refused (a hard link to another's file reads as one).
        std::fs::hard_link(d.path().join("big"), d.path().join("linked")).unwrap();
        let e = dir.read("linked", 1000).unwrap_err().to_string();
        assert!(e.contains("links"), "{e}");
        assert_eq!(dir.names().unwrap().len(), 3);
    }

    #[test]
    fn a_tree_below_is_reached_and_removed_without_following_a_link() {
        let d = tempfile::tempdir().unwrap();
        let outside = secret(d.path());
        let ckpt = d.path().join("ckpt");
        std::fs::create_dir_all(ckpt.join("flash/step-1/inner")).unwrap();
        std::fs::write(ckpt.join("flash/step-1/inner/part"), b"x").unwrap();
        symlink(&outside, ckpt.join("flash/step-1/out")).unwrap();
        let (dir, name) = Beneath::parent_below(&ckpt, &ckpt.join("flash/step-1")).unwrap();
        assert_eq!(
            (dir.path(), name.as_str()),
            (ckpt.join("flash").as_path(), "step-1")
        );
        dir.remove_tree("step-1").unwrap();
        assert!(!ckpt.join("flash/step-1").exists());
        assert_eq!(
            std::fs::read(outside.join("secret")).unwrap(),
            b"operator token"
        );
        // A link on the way: refused, nothing removed through it.
        std::fs::create_dir(outside.join("step-2")).unwrap();
        std::fs::remove_dir(ckpt.join("flash")).unwrap();
        symlink(&outside, ckpt.join("flash")).unwrap();
        let e = Beneath::parent_below(&ckpt, &ckpt.join("flash/step-2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(outside.join("step-2").exists());
        for bad in ["../x", "/etc/x"] {
            assert!(
                Beneath::parent_below(&ckpt, &ckpt.join(bad)).is_err(),
                "{bad}"
            );
        }
        assert!(Beneath::open_below(&ckpt, Path::new("../outside")).is_err());
    }

    #[test]
    fn a_private_directory_made_first_by_another_user_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("root");
        let dir = Beneath::private(&path, 0o711).unwrap();
        assert_eq!(dir.stat().unwrap().st_mode & 0o777, 0o711);
        // Another may write in it: refused.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let e = Beneath::private(&path, 0o711).unwrap_err().to_string();
        assert!(e.contains("somebody else"), "{e}");
        std::fs::remove_dir(&path).unwrap();
        // A link made first: refused.
        symlink(d.path(), &path).unwrap();
        assert!(Beneath::private(&path, 0o711).is_err());
        std::fs::remove_file(&path).unwrap();
        // Another user's (as root: `nobody`).
        if nix::unistd::geteuid().is_root()
            && let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody")
        {
            std::fs::create_dir(&path).unwrap();
            nix::unistd::chown(&path, Some(nobody.uid), Some(nobody.gid)).unwrap();
            let e = Beneath::private(&path, 0o711).unwrap_err().to_string();
            assert!(e.contains("owned by uid"), "{e}");
        }
    }
}
