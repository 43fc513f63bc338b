//! `job-master scale`: a scale plan sent to a running job, followed with `--wait`.

use std::time::Duration;

use anyhow::Context;
use proto::jobmaster::v1 as pb;

use crate::status::summary_line;
use crate::{MasterArgs, client};

#[derive(clap::Args)]
pub struct ScaleArgs {
    /// Target number of workers (the `worker` role; a training group named otherwise, e.g. an
    /// all-reduce `actor`, is resized with `--role actor=N`).
    #[arg(long)]
    workers: Option<u32>,
    /// Target number of parameter servers (ps jobs): keys are resharded while training.
    #[arg(long)]
    ps: Option<u32>,
    /// Target count of any role group by name, e.g. `--role rollout=4` (repeatable). The
    /// other roles keep running untouched where the role's topology allows it.
    #[arg(long = "role", value_name = "ROLE=N")]
    roles: Vec<vocab::role::RoleCount>,
    /// Replace one process (e.g. ps-1 or worker-0) by one with the --cpu/--memory given,
    /// handing its state over.
    #[arg(long)]
    migrate: Option<String>,
    /// CPU of the migrated process: cores (2, 0.5) or millicores (500m).
    #[arg(long)]
    cpu: Option<String>,
    /// Memory of the migrated process: bytes or a quantity (512Mi, 2Gi).
    #[arg(long)]
    memory: Option<String>,
    /// Why (recorded in the job's events).
    #[arg(long, default_value = "by hand")]
    reason: String,
    /// Plan version [default: one above the newest the job accepted].
    #[arg(long)]
    version: Option<u64>,
    /// Wait until the job has carried the plan out, printing its progress.
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    master: MasterArgs,
}

pub async fn scale(args: ScaleArgs) -> anyhow::Result<std::process::ExitCode> {
    let ScaleArgs {
        workers,
        ps,
        roles,
        migrate,
        cpu,
        memory,
        reason,
        version,
        wait,
        master,
    } = args;
    let mut c = client(&master).await?;
    let before = c.get_status(pb::StatusRequest {}).await?.into_inner();
    let mut plan = pb::ScalePlan {
        version: version.unwrap_or(before.desired_plan_version + 1),
        ..Default::default()
    };
    let targets = vocab::role::role_targets(workers, ps, &roles).map_err(anyhow::Error::msg)?;
    for (role, count) in targets {
        plan.roles.push(pb::RoleTarget {
            nodes: Vec::new(),
            role: role.to_string(),
            count,
            resources: None,
        });
    }
    if let Some(m) = migrate {
        if cpu.is_none() && memory.is_none() {
            anyhow::bail!("--migrate {m} needs --cpu or --memory for the new process");
        }
        let key: job_master::job::SlotKey = m
            .parse()
            .map_err(|e| anyhow::anyhow!("--migrate {m}: {e}"))?;
        let cpu = cpu
            .map(|c| serde_norway::from_str::<job_master::spec::Millicores>(&c).map(|m| m.0))
            .transpose()
            .context("--cpu")?
            .unwrap_or(0);
        let memory = memory
            .map(|m| serde_norway::from_str::<job_master::spec::Bytes>(&m).map(|b| b.0))
            .transpose()
            .context("--memory")?
            .unwrap_or(0);
        plan.migrations.push(pb::Migration {
            role: key.role.to_string(),
            index: key.index,
            resources: Some(pb::Resources {
                cpu_millicores: cpu,
                memory_bytes: memory,
                ..Default::default()
            }),
            reason,
        });
    }
    if plan.roles.is_empty() && plan.migrations.is_empty() {
        anyhow::bail!("nothing to do: give --workers, --ps, --role or --migrate");
    }
    let answer = c.apply_scale_plan(plan.clone()).await?.into_inner();
    if !answer.accepted {
        say_err!("plan {} rejected: {}", plan.version, answer.reason);
        return Ok(std::process::ExitCode::from(3));
    }
    say!("plan {} accepted", plan.version);
    if !wait {
        return Ok(std::process::ExitCode::SUCCESS);
    }
    loop {
        let s = c.get_status(pb::StatusRequest {}).await?.into_inner();
        say!("{}", summary_line(&s));
        if s.reached_plan_version >= plan.version {
            say!("plan {} reached", plan.version);
            break;
        }
        if s.phase.parse::<vocab::Phase>() != Ok(vocab::Phase::Running) {
            anyhow::bail!(
                "the job is {} before reaching plan {}",
                s.phase,
                plan.version
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(std::process::ExitCode::SUCCESS)
}
