//! The vocabulary's one error type: a job spec that cannot be read or is not valid.

use std::path::{Path, PathBuf};

/// A problem in a job spec: the field's path and what is wrong with its value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct SpecError {
    pub path: String,
    pub problem: String,
    pub file: Option<PathBuf>,
}

impl SpecError {
    pub fn new(path: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            problem: problem.into(),
            file: None,
        }
    }

    /// The same problem, said of the spec file `file`.
    pub fn in_file(mut self, file: &Path) -> Error {
        self.file = Some(file.to_path_buf());
        Error::Spec(self)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid job spec{file}: {0}", file = .0.file.as_ref().map(|f| format!(" {}", f.display())).unwrap_or_default())]
    Spec(SpecError),
    #[error("cannot read job spec {path}: {source}")]
    SpecFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<SpecError> for Error {
    fn from(e: SpecError) -> Self {
        Error::Spec(e)
    }
}
