//! The environment variables a job's spec may not set, compared without regard to case (a
//! loader reads `LD_PRELOAD`; a shell or a case-insensitive lookup may read `ld_preload`):
//!
//! * [`runtime_owned`]: what the runtime gives every training process (torchrun's variables,
//!   `TF_CONFIG`, the devices it was given, `BRAIN_*`). A job setting them would lie to its own
//!   processes about their rank or reach another master; the spec's validation refuses them.
//! * [`injects`]: what makes a loader or an interpreter run code the command does not name
//!   (`LD_PRELOAD`, `PYTHONPATH`, `BASH_ENV`, `NODE_OPTIONS`, `GCONV_PATH`, …). The brain
//!   refuses them in a submitted job: its jobs run only the commands its operator allows.

/// Names (upper case) the runtime sets for every training process.
const RUNTIME: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TF_CONFIG",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
];

/// Prefixes (upper case) of the runtime's variables.
const RUNTIME_PREFIXES: &[&str] = &["BRAIN_", "TORCHELASTIC_"];

/// Names (upper case) that make a loader or an interpreter load or run other code.
const INJECTS: &[&str] = &[
    "PATH",
    "IFS",
    "ENV",
    "BASH_ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "GLIBC_TUNABLES",
    "GCONV_PATH",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RESOLV_HOST_CONF",
    "MALLOC_CONF",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONINSPECT",
    "PYTHONBREAKPOINT",
    "PYTHONWARNINGS",
    "PYTHONEXECUTABLE",
    "PYTHONPLATLIBDIR",
    "PYTHONSAFEPATH",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "PERL5DB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    "SSLKEYLOGFILE",
    "LUA_PATH",
    "LUA_CPATH",
    "TCLLIBPATH",
    "R_PROFILE",
    "R_PROFILE_USER",
];

/// Prefixes (upper case) of loader and interpreter variables.
const INJECT_PREFIXES: &[&str] = &["LD_", "DYLD_", "BASH_FUNC_"];

/// Whether `key` (in any case) is one of the runtime's own variables.
pub fn runtime_owned(key: &str) -> bool {
    let k = key.to_ascii_uppercase();
    RUNTIME.contains(&k.as_str()) || RUNTIME_PREFIXES.iter().any(|p| k.starts_with(p))
}

/// Whether `key` (in any case) makes a loader or an interpreter run code of its choosing.
pub fn injects(key: &str) -> bool {
    let k = key.to_ascii_uppercase();
    INJECTS.contains(&k.as_str()) || INJECT_PREFIXES.iter().any(|p| k.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_case_is_caught() {
        for k in [
            "RANK",
            "rank",
            "Master_Addr",
            "BRAIN_X",
            "brain_token_file",
            "TorchElastic_Run_Id",
        ] {
            assert!(runtime_owned(k), "{k}");
        }
        for k in [
            "LD_PRELOAD",
            "ld_preload",
            "Ld_Audit",
            "DYLD_INSERT_LIBRARIES",
            "PYTHONPATH",
            "pythonstartup",
            "BASH_ENV",
            "ENV",
            "NODE_OPTIONS",
            "GCONV_PATH",
            "PERL5OPT",
            "BASH_FUNC_x%%",
            "GLIBC_TUNABLES",
        ] {
            assert!(injects(k), "{k}");
        }
        for k in ["OMP_NUM_THREADS", "NCCL_DEBUG", "EXTRA", "PYTHONUNBUFFERED"] {
            assert!(!runtime_owned(k) && !injects(k), "{k}");
        }
    }
}
