//! `brainctl`: the operator's command line. This file holds the flags and the commands'
//! `--help` texts; each command lives in a module of its own (`jobs_cmd`: jobs and status,
//! `submit_cmd`, `plan_cmd`, `scale_cmd`, `cancel_cmd`, `diagnose_cmd`, `nodes_cmd`,
//! `policy_cmd`, `certs_cmd`, `train`, `whatif_cmd`, `trace_cmd`), and `link` is how they
//! reach a running brain.
//!
//! Its doc comments are `--help` texts, where `[live]` names a TOML table, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

/// `println!` for what brainctl prints: a job's text in it (events, reasons, what a node's
/// reports said) goes through [`vocab::text::printable`], so no escape sequence reaches the
/// terminal.
macro_rules! say {
    () => { ::std::println!() };
    ($($t:tt)*) => { ::std::println!("{}", ::vocab::text::printable(&::std::format!($($t)*))) };
}

/// `eprintln!` as [`say!`] is `println!`.
macro_rules! say_err {
    ($($t:tt)*) => { ::std::eprintln!("{}", ::vocab::text::printable(&::std::format!($($t)*))) };
}

mod cancel_cmd;
mod certs_cmd;
mod diagnose_cmd;
mod events_cmd;
mod jobs_cmd;
mod link;
mod logs_cmd;
mod nodes_cmd;
mod plan_cmd;
mod policy_cmd;
mod scale_cmd;
mod submit_cmd;
mod trace_cmd;
mod train;
mod whatif_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use link::{LINK, Link, brain_tls};

#[derive(Parser)]
#[command(
    name = "brainctl",
    version,
    about = "Operate Brain: submit jobs without resources, look at what a brain runs and \
             would do, set its policy, and replay traces under policies before they touch a \
             cluster."
)]
struct Cli {
    /// The operator token the brain wrote at its first start (mode 0600, beside its database),
    /// sent with every call to the brain.
    #[arg(
        long,
        global = true,
        env = "BRAIN_TOKEN_FILE",
        default_value = "brain-data/operator.token"
    )]
    token_file: PathBuf,
    /// TLS to the brain: the CA that signed its certificate (`ca.pem` of `brainctl certs`);
    /// the brain's address may then be given as http:// or https://.
    #[arg(long, global = true, env = "BRAIN_CA_FILE")]
    ca: Option<PathBuf>,
    /// Mutual TLS: the certificate brainctl presents (`client.pem`), with --tls-key.
    #[arg(long, global = true, env = "BRAIN_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Mutual TLS: brainctl's private key (`client.key`, owner-only).
    #[arg(long, global = true, env = "BRAIN_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS with the files `brainctl certs --out DIR` made: --ca DIR/ca.pem --tls-cert
    /// DIR/client.pem --tls-key DIR/client.key.
    #[arg(long, global = true, env = "BRAIN_TLS_DIR", conflicts_with_all = ["ca", "tls_cert", "tls_key"])]
    tls_dir: Option<PathBuf>,
    /// Talk to a brain started with --insecure: plain text, no token sent. Without it
    /// brainctl checks the brain's certificate before it sends the operator token: against
    /// --ca, or the CA the brain made beside its database (tls/ca.pem next to --token-file).
    #[arg(long, global = true, env = "BRAIN_INSECURE", conflicts_with_all = ["ca", "tls_cert", "tls_key", "tls_dir"])]
    insecure: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the jobs a running brain knows, with their metric summaries and plan versions.
    Jobs {
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Show one job of a running brain: its state, size, why the brain sized it so, why it
    /// waits (queued), its speed now, its newest plans with their reasons and answers, and how
    /// it ended.
    Status {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// What went wrong in one job (running or ended) and what it cost: its effective training
    /// time, its pre-run check, a timeline of faults, relaunches, plans, checkpoints,
    /// stragglers, hangs (with the stacks captured) and nodes. The brain reads the job's run
    /// directory on its own machine (`job-master diagnose` of it).
    Diagnose {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// Every event in the timeline, not only those about trouble or change.
        #[arg(long)]
        all: bool,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Every event of one job (running or ended), one a line: seconds since its start, kind,
    /// text (faults, restarts, plans, checkpoints, ...), as its master recorded them.
    Events {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// The output of one process of a job (its newest incarnation: after a relaunch, the new
    /// one's), read by the brain from the job's run directory; with --follow, what it writes
    /// next too, until the job ends.
    Logs {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// The process's role [default: the job's training group: `worker`, or its all-reduce
        /// group's own name].
        #[arg(long)]
        role: Option<String>,
        /// The process's index in its role.
        #[arg(long, default_value_t = 0)]
        index: u32,
        /// Go on printing what it writes until the job has ended.
        #[arg(long)]
        follow: bool,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Submit a job spec (YAML) that names no replicas or resources: the brain predicts them
    /// from its history, records why, and starts the job's master when a round gives it room.
    /// Counts or resources the spec does name are kept.
    Submit {
        /// The job spec; see examples/ (resource-free specs omit replicas and resources).
        spec: PathBuf,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
        /// Follow the job until it ends; exit 0 only if it succeeded.
        #[arg(long)]
        wait: bool,
        /// Where the job owner's token is kept (mode 0600, never replaced; default
        /// `owners/job-ID.owner.token` beside --token-file): the person's credential for this
        /// job alone (`brainctl --token-file FILE jobs/events/logs/diagnose/scale/cancel`, and
        /// the console), which the brain returns once. It makes no job master's call.
        #[arg(long)]
        owner_token_file: Option<PathBuf>,
    },
    /// Show what the brain's next round would decide for every queued and running job, and
    /// why, without dispatching anything.
    Plan {
        /// Required: the brain dispatches plans itself every round; this only shows them.
        #[arg(long)]
        dry_run: bool,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Resize a running job through the brain: a versioned plan like the brain's own, which
    /// its job master carries out (a job master a brain manages refuses plans from anywhere
    /// else). Counts outside the job's bounds or node unit are refused with the reason, and
    /// so is a size the brain's next round would change again at once (beyond the cluster's
    /// capacity, say) unless `--force`; the cool-down the plan starts is said.
    Scale {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// Target number of workers (the `worker` role; a training group named otherwise,
        /// e.g. an all-reduce `actor`, is resized with `--role actor=N`).
        #[arg(long)]
        workers: Option<u32>,
        /// Target number of parameter servers (ps jobs; keys are resharded while training).
        #[arg(long)]
        ps: Option<u32>,
        /// Target count of any role group by name, e.g. `--role rollout=4` (repeatable).
        #[arg(long = "role", value_name = "ROLE=N")]
        roles: Vec<vocab::role::RoleCount>,
        /// Why (recorded with the plan).
        #[arg(long, default_value = "by hand (brainctl scale)")]
        reason: String,
        /// Propose it even when the brain's next round would change the job again at once
        /// (beyond the cluster's capacity or the job's bounds): refused without it, saying why.
        #[arg(long)]
        force: bool,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Cancel a job through the brain: a queued job never starts; a running one takes a last
    /// checkpoint (where its job master tracks its data), stops every process and is recorded
    /// as cancelled. An unknown or ended job is refused, saying so.
    Cancel {
        /// The job's id or name (from `brainctl jobs`).
        job: String,
        /// Why (recorded with the job).
        #[arg(long, default_value = "cancelled by hand (brainctl cancel)")]
        reason: String,
        /// The brain's gRPC address.
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// List the nodes the brain plans on (ok, cordoned: why, since and until when; or holding
    /// a running job's stragglers: which, how much slower), or
    /// cordon and uncordon one. A cordoned node is taken out of every round's capacity: no
    /// process of a new plan goes there and jobs on it are planned off it.
    Nodes {
        #[command(subcommand)]
        action: Option<nodes_cmd::NodesAction>,
        /// The brain's gRPC address.
        #[arg(long, global = true, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Fit the job-profile model on the brain's finished jobs (20 at least) and store it in its
    /// database (the brain sizes submitted jobs' worker CPU and memory with it from then on);
    /// with --evaluate, score it against DLRover's rule, the user's request and the global
    /// median on a time-ordered split of that history and of Alibaba's 2023 and 2025 GPU traces.
    Train(train::TrainArgs),
    /// Show or set the operator's policy of a running brain (TOML: [scheduler] sizes the jobs,
    /// [[heuristics]] correct their PS count and processes' resources, [live] interval_s,
    /// cooldown_s, pin_while_plan_in_flight, max_resumes pace the rounds).
    Policy {
        #[command(subcommand)]
        action: policy_cmd::PolicyAction,
    },
    /// Make a private CA and, signed by it, the brain's TLS certificate and a client
    /// certificate (for mutual TLS), then print the configuration that uses them. Nothing is
    /// ever overwritten; private keys are owner-only.
    Certs {
        /// Where to write ca.pem, ca.key, brain.pem, brain.key, client.pem, client.key.
        #[arg(long, default_value = "brain-data/tls")]
        out: PathBuf,
        /// A name or address clients reach the brain by (repeatable); localhost and 127.0.0.1
        /// are always included.
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
    /// Replay job traces on a simulated cluster under each policy, side by side.
    ///
    /// Every trace is replayed under every policy (one simulation per core); the table shows,
    /// per policy, the jobs of all traces pooled. Traces are workload CSVs in Pollux's and Sia's
    /// format (`name,time,application,num_replicas,batch_size`), whose jobs train applications
    /// known by their profiles (directories of measured step times and training curves, as in
    /// Pollux's `traces/`), or Philly job lists (`timestamp,duration,num_gpus,gpu_time,cluster`),
    /// whose jobs run for their duration on exactly the GPUs they asked for.
    Whatif(Box<whatif_cmd::WhatifArgs>),
    /// Make traces for `brainctl whatif`: larger ones drawn from a real trace's distribution.
    Trace {
        #[command(subcommand)]
        action: trace_cmd::TraceAction,
    },
}

impl Command {
    /// Whether the command calls a running brain (the others work on files alone).
    fn talks_to_a_brain(&self) -> bool {
        !matches!(
            self,
            Command::Train(_) | Command::Certs { .. } | Command::Whatif(_) | Command::Trace { .. }
        )
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // The error and its causes on one line each, never a backtrace (RUST_BACKTRACE is for
        // our bugs, not for a refusal or a missing file).
        Err(e) => {
            say_err!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // Offline commands (whatif, trace, train, certs) talk to no brain: nothing to check.
    let tls = if cli.command.talks_to_a_brain() {
        brain_tls(&cli)?
    } else {
        None
    };
    LINK.set(Link {
        token_file: cli.token_file.clone(),
        tls,
    })
    .unwrap_or_else(|_| unreachable!("set once, before any call"));
    match cli.command {
        Command::Jobs { brain } => jobs_cmd::jobs(&brain),
        Command::Status { job, brain } => jobs_cmd::status(&job, &brain),
        Command::Diagnose { job, all, brain } => diagnose_cmd::diagnose(&job, all, &brain),
        Command::Events { job, brain } => events_cmd::events(&job, &brain),
        Command::Logs {
            job,
            role,
            index,
            follow,
            brain,
        } => logs_cmd::logs(&job, role.as_deref(), index, follow, &brain),
        Command::Submit {
            spec,
            brain,
            wait,
            owner_token_file,
        } => submit_cmd::submit(&spec, &brain, wait, owner_token_file),
        Command::Plan { dry_run, brain } => plan_cmd::plan(dry_run, &brain),
        Command::Scale {
            job,
            workers,
            ps,
            roles,
            reason,
            force,
            brain,
        } => scale_cmd::scale(&job, (workers, ps, &roles), reason, force, &brain),
        Command::Cancel { job, reason, brain } => cancel_cmd::cancel(&job, reason, &brain),
        Command::Train(args) => train::train(args),
        Command::Nodes { action, brain } => nodes_cmd::nodes(action, &brain),
        Command::Policy { action } => policy_cmd::policy(action),
        Command::Whatif(args) => whatif_cmd::whatif(*args),
        Command::Trace { action } => trace_cmd::trace(action),
        Command::Certs { out, hosts } => certs_cmd::certs(&out, &hosts),
    }
}
