//! What a submitted job may run. The brain starts a job's master and processes as its own
//! user, so before a spec is accepted: a `command:` job's program must be one the operator's
//! policy names (`[submissions] commands`; none by default: only the built-in workload runs);
//! the environment it sets may not redirect what runs (`PATH`, `LD_*`, …) nor the brain's own
//! variables; its checkpoint directory stays inside its run directory; and where it runs is the
//! brain's choice, not the spec's (`platform` is refused). The job name is checked where the
//! store takes it.

use std::path::{Component, Path};

use optimizer::config::SubmissionPolicy;
use vocab::JobSpec;

fn env_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why `spec` may not run here, or `Ok`. `run_dir` is where the brain would run it.
pub fn admit(spec: &JobSpec, policy: &SubmissionPolicy, run_dir: &Path) -> Result<(), String> {
    // The workload's program and every service or single role's.
    for (path, command) in spec.commands() {
        check_command(&path, command, policy)?;
    }
    for (path, env) in spec.envs() {
        check_env(&path, env)?;
    }
    let ckpt = &spec.checkpoint.dir;
    let inside = if ckpt.is_absolute() {
        ckpt.starts_with(run_dir) && !ckpt.components().any(|c| matches!(c, Component::ParentDir))
    } else {
        ckpt.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    };
    if !inside {
        return Err(format!(
            "checkpoint.dir: {} is outside the job's run directory {} (give a relative path)",
            ckpt.display(),
            run_dir.display()
        ));
    }
    if spec.platform.is_some() {
        return Err(
            "platform: where a job runs is the brain's choice (its config); leave it out".into(),
        );
    }
    Ok(())
}

/// What each program of `spec` is on this machine: `worker runs python3 = /opt/venv/bin/python3
/// (the brain's PATH, which its jobs inherit)`; a program a relative path names resolves in the
/// job's working directory (the brain's), and one that is not found is said so (the job would
/// fail to start). The brain records these with the job's sizing reasons, so that the user sees
/// at submission which interpreter will run the script.
pub fn programs(spec: &JobSpec) -> Vec<String> {
    spec.commands()
        .into_iter()
        .filter_map(|(path, command)| {
            let program = command.first()?;
            let what = path.trim_end_matches(".command");
            Some(match vocab::spec::host::resolve_program(program) {
                Some(p) if program.contains('/') => format!("{what} runs {}", p.display()),
                Some(p) => format!(
                    "{what} runs {program} = {} (the brain's PATH, which its jobs inherit)",
                    p.display()
                ),
                None => format!(
                    "{what} runs {program}, which is not found on the brain's PATH: the job's \
                     processes will fail to start"
                ),
            })
        })
        .collect()
}

/// Why a program may not run here: the operator's allow-list does not name it.
fn check_command(path: &str, command: &[String], policy: &SubmissionPolicy) -> Result<(), String> {
    if let Some(word) = command.iter().find(|w| optimizer::config::climbs(w)) {
        let word: String = word.chars().take(200).collect();
        return Err(format!(
            "{path}: `{word}`: a `..` in a command's words is refused (it could lead out of the \
             directory the operator's pattern names); write the path without it"
        ));
    }
    if policy
        .commands
        .iter()
        .any(|allowed| allowed.matches(command))
    {
        return Ok(());
    }
    // Quoted in part only: a refusal must not carry a command of any length back.
    let mut shown = shlex::try_join(command.iter().take(8).map(String::as_str))
        .unwrap_or_else(|_| format!("{command:?}"));
    if shown.len() > 200 || command.len() > 8 {
        shown = shown.chars().take(200).collect::<String>() + " …";
    }
    Err(if policy.commands.is_empty() {
        format!(
            "{path}: `{shown}`: the operator's policy allows no `command:` jobs; an \
             operator lists the whole commands jobs may run in [submissions] commands"
        )
    } else {
        format!(
            "{path}: `{shown}` is not one of the commands the operator's policy \
             allows ([submissions] commands = {:?}: the program and a pattern per argument)",
            policy
                .commands
                .iter()
                .map(|c| c.as_str())
                .collect::<Vec<_>>()
        )
    })
}

/// A job's extra environment may not redirect what runs nor set the runtime's variables.
fn check_env(path: &str, env: &std::collections::BTreeMap<String, String>) -> Result<(), String> {
    for key in env.keys() {
        if !env_name(key) {
            return Err(format!(
                "{path}: {key:?} is not a variable name (letters, digits and _, not \
                 starting with a digit)"
            ));
        }
        if vocab::spec::env::injects(key) {
            return Err(format!(
                "{path}: {key} may not be set by a job: it makes a loader or an \
                 interpreter run code the command does not name (PATH, LD_*, DYLD_*, \
                 PYTHONPATH, PYTHONSTARTUP, BASH_ENV, ENV, NODE_OPTIONS, GCONV_PATH, PERL5OPT, \
                 … in any case)"
            ));
        }
        if vocab::spec::env::runtime_owned(key) {
            return Err(format!(
                "{path}: {key} may not be set by a job: it is the runtime's (torchrun's \
                 variables, TF_CONFIG, the devices a process was given, BRAIN_*, in any case)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str, workload: &str, ckpt: &str) -> JobSpec {
        JobSpec::from_yaml(&format!(
            "name: j\nkind: allreduce\nroles:\n  worker: {{}}\nworkload:\n{workload}\
             data: {{ num_samples: 1000, shard_size: 100 }}\ncheckpoint: {{ dir: {ckpt} }}\n{extra}"
        ))
        .unwrap()
    }

    /// The interpreter a command job will run is said at submission (issue 44: a script ran
    /// with a python3 that had no torch, and the only word was "exited with code 1").
    #[test]
    fn each_program_is_resolved_on_the_brains_path_and_said() {
        let found = spec("", "  command: [sh, train.sh]\n", "checkpoints");
        let said = programs(&found);
        let sh = vocab::spec::host::resolve_program("sh").unwrap();
        assert_eq!(
            said,
            vec![format!(
                "workload runs sh = {} (the brain's PATH, which its jobs inherit)",
                sh.display()
            )]
        );
        let missing = spec("", "  command: [no-such-python9, x.py]\n", "checkpoints");
        assert!(
            programs(&missing)[0].contains("no-such-python9, which is not found"),
            "{:?}",
            programs(&missing)
        );
        assert!(programs(&spec("", "  builtin: {}\n", "checkpoints")).is_empty());
    }

    #[test]
    fn only_what_the_operator_allows_runs_and_nothing_leaves_the_run_directory() {
        let run = Path::new("/srv/brain/runs/j");
        let none = SubmissionPolicy::default();
        let python = SubmissionPolicy {
            commands: vec!["python3 train.py ...".to_string().try_into().unwrap()],
        };
        let builtin = spec("", "  builtin: {}\n", "checkpoints");
        assert_eq!(admit(&builtin, &none, run), Ok(()));

        let cmd = spec("", "  command: [python3, train.py]\n", "checkpoints");
        let e = admit(&cmd, &none, run).unwrap_err();
        assert!(e.contains("allows no `command:` jobs"), "{e}");
        assert_eq!(admit(&cmd, &python, run), Ok(()));
        let sh = spec(
            "",
            "  command: [/bin/sh, -c, \"rm -rf ~\"]\n",
            "checkpoints",
        );
        let e = admit(&sh, &python, run).unwrap_err();
        assert!(e.contains("`/bin/sh -c 'rm -rf ~'` is not one of"), "{e}");
        // An allowed interpreter runs only the allowed script (issue 40, attack 5).
        for argv in [
            "[python3, -c, \"import os\"]",
            "[python3, other.py]",
            "[python3]",
            "[python3, -m, http.server]",
        ] {
            let s = spec("", &format!("  command: {argv}\n"), "checkpoints");
            let e = admit(&s, &python, run).unwrap_err();
            assert!(e.contains("is not one of the commands"), "{argv}: {e}");
        }
        let with_args = spec(
            "",
            "  command: [python3, train.py, --lr, \"0.1\"]\n",
            "checkpoints",
        );
        assert_eq!(admit(&with_args, &python, run), Ok(()));
        // A pattern stays in its directory: `*` crosses no `/`, and `..` is refused.
        let scripts = SubmissionPolicy {
            commands: vec!["python3 scripts/*.py ...".to_string().try_into().unwrap()],
        };
        let ok = spec(
            "",
            "  command: [python3, scripts/train.py]\n",
            "checkpoints",
        );
        assert_eq!(admit(&ok, &scripts, run), Ok(()));
        for (argv, says) in [
            (
                "[python3, scripts/../../anything.py]",
                "a `..` in a command's words",
            ),
            ("[python3, scripts/sub/x.py]", "is not one of the commands"),
            (
                "[python3, scripts/x.py, ../y]",
                "a `..` in a command's words",
            ),
        ] {
            let s = spec("", &format!("  command: {argv}\n"), "checkpoints");
            let e = admit(&s, &scripts, run).unwrap_err();
            assert!(e.contains(says), "{argv}: {e}");
        }
        // A refusal quotes the command in part only.
        let long = spec(
            "",
            &format!("  command: [python3, \"{}\"]\n", "x".repeat(10_000)),
            "checkpoints",
        );
        let e = admit(&long, &python, run).unwrap_err();
        assert!(e.len() < 600, "{}", e.len());

        for (key, says) in [
            ("LD_PRELOAD", "may not be set"),
            ("ld_preload", "loader or an interpreter"),
            ("PATH", "may not be set"),
            ("PYTHONPATH", "loader or an interpreter"),
            ("BASH_ENV", "loader or an interpreter"),
            ("NODE_OPTIONS", "loader or an interpreter"),
            ("GCONV_PATH", "loader or an interpreter"),
            ("PERL5OPT", "loader or an interpreter"),
            ("RANK", "the runtime's"),
            ("master_addr", "the runtime's"),
            ("BRAIN_TOKEN_FILE", "may not be set"),
            ("\"A-B\"", "not a variable name"),
            ("\"1X\"", "not a variable name"),
        ] {
            let s = spec(
                "",
                &format!("  builtin: {{}}\n  env: {{ {key}: x }}\n"),
                "checkpoints",
            );
            let e = admit(&s, &python, run).unwrap_err();
            assert!(e.contains(says), "{key}: {e}");
        }
        let ok_env = spec(
            "",
            "  builtin: {}\n  env: { OMP_NUM_THREADS: \"2\" }\n",
            "ck",
        );
        assert_eq!(admit(&ok_env, &none, run), Ok(()));

        for dir in ["/etc/x", "../escape", "a/../../b", "/srv/brain/runs/j/../k"] {
            let e = admit(&spec("", "  builtin: {}\n", dir), &none, run).unwrap_err();
            assert!(e.contains("outside the job's run directory"), "{dir}: {e}");
        }
        assert_eq!(
            admit(
                &spec("", "  builtin: {}\n", "/srv/brain/runs/j/ck"),
                &none,
                run
            ),
            Ok(())
        );
        let local = spec(
            "platform: { type: local, agent_bin: /bin/sh }\n",
            "  builtin: {}\n",
            "ck",
        );
        let e = admit(&local, &none, run).unwrap_err();
        assert!(e.contains("platform"), "{e}");
    }
}
