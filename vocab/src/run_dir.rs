//! The files a job master keeps in its run directory, as the brain and tests read them.

use std::path::Path;

use serde::Deserialize;

use crate::report::JobPhase;

/// The job context, rewritten atomically after every change.
pub const CONTEXT_FILE: &str = "job-context.json";
/// The final report ([`crate::report::JobReport`]), written when the job has ended.
pub const REPORT_FILE: &str = "report.json";

/// Whether the master of the job in `master_dir` left it unfinished: its persisted context
/// says it still runs and there is no report. A missing or unreadable context is not
/// unfinished work (nothing can be resumed from it).
pub fn left_unfinished(master_dir: &Path) -> bool {
    #[derive(Deserialize)]
    struct Context {
        phase: JobPhase,
    }
    !master_dir.join(REPORT_FILE).exists()
        && std::fs::read(master_dir.join(CONTEXT_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<Context>(&b).ok())
            .is_some_and(|c| !c.phase.is_terminal())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_running_context_without_a_report_is_unfinished() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(!left_unfinished(d), "no context at all");
        std::fs::write(d.join(CONTEXT_FILE), r#"{"phase":"Running","other":1}"#).unwrap();
        assert!(left_unfinished(d));
        std::fs::write(
            d.join(CONTEXT_FILE),
            r#"{"phase":{"Failed":{"reason":"x"}}}"#,
        )
        .unwrap();
        assert!(!left_unfinished(d));
        std::fs::write(d.join(CONTEXT_FILE), r#"{"phase":"Finishing"}"#).unwrap();
        assert!(left_unfinished(d));
        std::fs::write(d.join(REPORT_FILE), "{}").unwrap();
        assert!(!left_unfinished(d), "a report means the job ended");
    }
}
