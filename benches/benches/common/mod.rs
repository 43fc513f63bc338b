//! What the bench binaries share.

use std::path::{Path, PathBuf};

/// A release binary of the workspace; the benches measure release builds only.
pub fn release_bin(name: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap()
                .join("target")
        });
    let bin = target.join("release").join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p job-master -p worker-agent` first",
        bin.display()
    );
    bin
}
