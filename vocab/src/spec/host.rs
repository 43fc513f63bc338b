//! The checks of a job spec that only the machine running it can make: the training program
//! is an executable file (or found on `PATH`) and the checkpoint directory is a writable
//! directory or can be created under one. Pure validation is [`super::JobSpec::validate`].

use std::path::{Path, PathBuf};

use super::JobSpec;
use crate::error::SpecError;

/// Checks `spec` against this machine; the first problem found is returned.
pub fn check(spec: &JobSpec) -> Result<(), SpecError> {
    for (path, command) in spec.commands() {
        if let Some(program) = command.first()
            && resolve_program(program).is_none()
        {
            return Err(SpecError::new(
                format!("{path}[0]"),
                format!("{program:?} is not an executable file nor found on PATH"),
            ));
        }
    }
    check_writable_dir("checkpoint.dir", &spec.checkpoint.dir)
}

/// The checkpoint directory must exist as a writable directory or be creatable under one.
fn check_writable_dir(path: &str, dir: &Path) -> Result<(), SpecError> {
    let mut probe = dir;
    loop {
        if probe.exists() {
            if !probe.is_dir() {
                return Err(SpecError::new(
                    path,
                    format!("{} is not a directory", probe.display()),
                ));
            }
            let meta = std::fs::metadata(probe).map_err(|e| {
                SpecError::new(path, format!("{} cannot be read: {e}", probe.display()))
            })?;
            if meta.permissions().readonly()
                || nix::unistd::access(probe, nix::unistd::AccessFlags::W_OK).is_err()
            {
                return Err(SpecError::new(
                    path,
                    format!("{} is not writable", probe.display()),
                ));
            }
            return Ok(());
        }
        match probe.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => probe = parent,
            _ => return Ok(()),
        }
    }
}

/// Finds a program as `execvp` would: a path with a slash as is, a bare name on `PATH`.
pub fn resolve_program(program: &str) -> Option<PathBuf> {
    let is_exec =
        |p: &Path| p.is_file() && nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok();
    if program.contains('/') {
        let p = PathBuf::from(program);
        return is_exec(&p).then_some(p);
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| is_exec(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(command: &str, dir: &Path) -> JobSpec {
        JobSpec::from_yaml(&format!(
            "name: t\nkind: allreduce\nroles:\n  worker: {{ replicas: 1 }}\n\
             workload:\n  command: [{command}]\ndata: {{ num_samples: 10, shard_size: 5 }}\n\
             checkpoint: {{ dir: {} }}\n",
            dir.display()
        ))
        .unwrap()
    }

    #[test]
    fn the_machine_decides_what_pure_validation_cannot() {
        let dir = tempfile::tempdir().unwrap();
        let ok = spec("sh", &dir.path().join("ckpt/new"));
        ok.validate().unwrap();
        check(&ok).unwrap();
        let missing = spec("/nonexistent/train.py", &dir.path().join("ckpt"));
        missing.validate().unwrap();
        assert_eq!(
            check(&missing).unwrap_err().to_string(),
            "workload.command[0]: \"/nonexistent/train.py\" is not an executable file nor found on PATH"
        );
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        let under_file = spec("sh", &file.join("ckpt"));
        under_file.validate().unwrap();
        assert!(
            check(&under_file)
                .unwrap_err()
                .to_string()
                .contains("is not a directory")
        );
    }
}
