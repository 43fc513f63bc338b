//! The job spec is the vocabulary's ([`vocab::spec`]): what a user writes and its pure
//! validation. This module adds what the job master needs on top: [`load`] reads a spec file
//! and also runs the checks that touch this machine ([`vocab::spec::host::check`]).

use std::path::Path;

pub use vocab::spec::*;
pub use vocab::{Bytes, JobKind, Millicores, Role};

use crate::error::Error;

/// Reads and validates the spec file `path`, then checks it against this machine (the
/// program is executable, the checkpoint directory can be created).
pub fn load(path: &Path) -> Result<JobSpec, Error> {
    let spec = JobSpec::from_file(path)?;
    host::check(&spec).map_err(|e| e.in_file(path))?;
    Ok(spec)
}
