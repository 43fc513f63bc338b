//! The one error type of this crate: every failure names the file, and a bad value also its line
//! and column, so a user fixing their own trace knows where to look.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file as a whole cannot be read in this format (not CSV, wrong header, empty).
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
    /// One value is missing or malformed. `line` and `column` count from 1, as editors do.
    #[error("{path}:{line}:{column}: {message}")]
    Value {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    /// A trace cannot be drawn from the source given (`synth`).
    #[error("drawing a trace: {0}")]
    Synth(String),
    /// Writing an export failed.
    #[error("writing {path}: {message}")]
    Write { path: PathBuf, message: String },
}

impl DatasetError {
    pub(crate) fn format(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        DatasetError::Format {
            path: path.into(),
            message: message.into(),
        }
    }
}
