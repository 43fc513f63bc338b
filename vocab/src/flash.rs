//! Where flash checkpoints' copies in shared memory live on a node: under a root on tmpfs
//! ([`root`]), a directory per run, and in it one per training process. The worker agent makes
//! and adopts its process's directory and removes it when the job ends; the job master removes
//! its run's directory on its own node once every agent has stopped, which takes away what an
//! agent killed -9 and never started again left behind.

use std::path::{Path, PathBuf};

/// The environment variable that moves the root [default: [`DEFAULT_ROOT`]].
pub const ROOT_ENV: &str = "BRAIN_FLASH_ROOT";
pub const DEFAULT_ROOT: &str = "/dev/shm/brain-flash";

/// The root this process sees: `$BRAIN_FLASH_ROOT`, else [`DEFAULT_ROOT`].
pub fn root() -> PathBuf {
    std::env::var_os(ROOT_ENV).map_or_else(|| DEFAULT_ROOT.into(), PathBuf::from)
}

/// Run `run`'s directory under `root`.
pub fn run_dir(root: &Path, run: &str) -> PathBuf {
    root.join(run_name(run))
}

/// Process `role`-`index` of run `run`'s directory under `root`.
pub fn process_dir(root: &Path, run: &str, role: &str, index: u32) -> PathBuf {
    run_dir(root, run).join(process_name(role, index))
}

/// The name of run `run`'s directory in the root (one path component).
pub fn run_name(run: &str) -> String {
    safe(run)
}

/// The name of process `role`-`index`'s directory in its run's (one path component).
pub fn process_name(role: &str, index: u32) -> String {
    format!("{}-{index}", safe(role))
}

/// A name as one path component: letters, digits and `-` kept, anything else `_`.
fn safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_never_leaves_its_root() {
        let root = Path::new("/r");
        assert_eq!(run_dir(root, "job-12"), Path::new("/r/job-12"));
        assert_eq!(run_dir(root, "../x/y"), Path::new("/r/___x_y"));
        assert_eq!(
            process_dir(root, "run/1", "work.er", 3),
            Path::new("/r/run_1/work_er-3")
        );
    }
}
