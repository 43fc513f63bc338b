//! How the agent writes a flash copy out (`flash.rs` decides which copy and when): on a thread
//! of its own at the lowest CPU priority, so that the node's training comes first, and around
//! the page cache where the file system allows, so that the write costs the node a transfer
//! from memory rather than a copy into the page cache and its write-back. The part is written
//! under a temporary name, synced and renamed: a reader sees the whole part or none.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::flash::io;

/// Work for the background thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The thread that writes a process's copies out: it runs at the lowest CPU priority
/// (`SCHED_IDLE`), so that the node's training processes come first and the write-out takes
/// the CPU time they leave (a longer write-out, not slower steps, where every core trains). It
/// ends when the sender is dropped (the [`crate::flash::Writer`] stopped), after the job in hand.
pub(crate) fn background_thread() -> std::sync::mpsc::Sender<Job> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let spawned = std::thread::Builder::new()
        .name("flash-write-out".into())
        .spawn(move || {
            lowest_cpu_priority();
            for job in rx {
                job();
            }
        });
    if let Err(e) = spawned {
        // The sender's next send fails, and the writer says so.
        tracing::warn!("the flash write-out thread did not start: {e}");
    }
    tx
}

/// Puts the calling thread in the `SCHED_IDLE` class: it runs on what the node's other
/// threads leave (a thread may always lower its own priority; where that fails anyway, it
/// stays as it was, and says so).
fn lowest_cpu_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread, and `param` is a valid sched_param for SCHED_IDLE
    // (whose priority must be 0); the call reads it and changes nothing else.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc != 0 {
        tracing::warn!(
            "the flash write-out runs at normal CPU priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The name a part is written under before it is renamed into place: `part-R.bin.tmp-HOST-PID`
/// (the host too: a checkpoint directory may be shared by nodes).
pub(crate) fn tmp_prefix(to: &Path) -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = to.file_name().unwrap_or_default().to_string_lossy();
    format!("{name}.tmp-{host}-")
}

/// Removes what an agent of this node killed while writing `to` out left of it: its temporary
/// file, named with a process that no longer runs here.
fn remove_stale_tmp(to: &Path) {
    let (Some(dir), prefix) = (to.parent(), tmp_prefix(to)) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            match std::fs::remove_file(e.path()) {
                Ok(()) => tracing::info!("removed {}, left by an agent killed mid-write", name),
                Err(err) => tracing::warn!("cannot remove {}: {err}", e.path().display()),
            }
        }
    }
}

/// The bytes read, hashed and written at a time.
const CHUNK: usize = 8 << 20;
/// What a write around the page cache must be aligned to (memory, length and offset): 4 KiB,
/// the logical block of every disk we write to, and a multiple of the smaller ones.
const BLOCK: usize = 4096;

/// Copies `from` to `to` by a temporary name (synced, renamed, the directory synced): a reader
/// sees the whole file or none. Its SHA-256 (hex) and length.
pub(crate) fn copy_hashed(from: &mut File, to: &Path) -> Result<(String, u64), Error> {
    remove_stale_tmp(to);
    let tmp = to.with_file_name(format!("{}{}", tmp_prefix(to), std::process::id()));
    let mut out = PartFile::create(&tmp).map_err(io(&tmp))?;
    let mut sha = Sha256::new();
    // A chunk whose start is aligned to a block, inside a buffer one block longer.
    let mut storage = vec![0u8; CHUNK + BLOCK];
    let start = storage.as_ptr().align_offset(BLOCK);
    let buf = &mut storage[start..start + CHUNK];
    let mut bytes = 0u64;
    loop {
        let n = fill(from, buf).map_err(io(to))?;
        if n == 0 {
            break;
        }
        sha.update(&buf[..n]);
        out.write_at(&buf[..n], bytes).map_err(io(&tmp))?;
        bytes += n as u64;
    }
    out.sync().map_err(io(&tmp))?;
    std::fs::rename(&tmp, to).map_err(io(to))?;
    if let Some(parent) = to.parent() {
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io(parent))?;
    }
    Ok((hex::encode(sha.finalize()), bytes))
}

/// Reads into `buf` until it is full or `from` ends: every chunk but the last is whole, so
/// that every write but the last starts and ends on a block.
fn fill(from: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match from.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(r) => n += r,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A part's file being written. Whole blocks go around the page cache (`O_DIRECT`) where the
/// file system takes that; the tail under a block, and everything where `O_DIRECT` is refused
/// (at the open, or at the first write), through it.
struct PartFile {
    direct: Option<File>,
    buffered: File,
}

impl PartFile {
    fn create(path: &Path) -> std::io::Result<Self> {
        let buffered = File::create(path)?;
        let direct = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok();
        Ok(Self { direct, buffered })
    }

    /// Writes `chunk`, which starts on a block in memory, at `offset`, a multiple of a block.
    fn write_at(&mut self, chunk: &[u8], offset: u64) -> std::io::Result<()> {
        let mut whole = 0;
        if let Some(direct) = &self.direct {
            whole = chunk.len() / BLOCK * BLOCK;
            if whole > 0
                && let Err(e) = direct.write_all_at(&chunk[..whole], offset)
            {
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(e);
                }
                // Not taken here after all: the page cache from now on, this chunk again.
                tracing::debug!("O_DIRECT refused at the first write: {e}");
                self.direct = None;
                whole = 0;
            }
        }
        self.buffered
            .write_all_at(&chunk[whole..], offset + whole as u64)
    }

    /// Syncs what went through the page cache and the file's size (the direct writes are on
    /// the disk already).
    fn sync(self) -> std::io::Result<()> {
        self.buffered.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part of more than one chunk and not a whole number of blocks, written out where the
    /// tests' temporary files live and in shared memory: the same bytes, its SHA-256.
    #[test]
    fn a_part_of_any_length_is_written_whole_around_the_page_cache_or_through_it() {
        let body: Vec<u8> = (0..CHUNK + 3 * BLOCK + 123)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        for root in [std::env::temp_dir(), "/dev/shm".into()] {
            let dir = tempfile::tempdir_in(&root).unwrap();
            let (from, to) = (dir.path().join("slot"), dir.path().join("part-0.bin"));
            std::fs::write(&from, &body).unwrap();
            let (digest, bytes) = copy_hashed(&mut File::open(&from).unwrap(), &to).unwrap();
            assert_eq!(bytes, body.len() as u64, "{}", root.display());
            assert_eq!(std::fs::read(&to).unwrap(), body, "{}", root.display());
            assert_eq!(digest, hex::encode(Sha256::digest(&body)));
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert_eq!(left.len(), 2, "the temporary file is renamed into place");
        }
    }
}
