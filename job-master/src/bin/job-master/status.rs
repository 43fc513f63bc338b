//! `job-master status` and the progress line `run` prints.

use std::time::Duration;

use proto::jobmaster::v1 as pb;

use crate::{MasterArgs, client};

fn print_role_groups(groups: &[pb::RoleGroupStatus]) {
    if !groups.is_empty() {
        say!("role groups:");
    }
    for g in groups {
        say!("  {}", role_group_line(g));
    }
}

/// A role group's size wanted against what runs: `worker     (allreduce, training) 2 of 2
/// running`, `rollout    (service) 3 wanted: 2 running, 1 starting or restarting; 1 relaunch`.
fn role_group_line(g: &pb::RoleGroupStatus) -> String {
    let kind = match g.training {
        true => format!("{}, training", g.topology),
        false => g.topology.clone(),
    };
    let size = match (g.desired, g.live, g.running) {
        (d, l, r) if d == l && l == r => format!("{r} of {d} running"),
        (d, l, r) => format!(
            "{d} wanted: {r} running, {} starting or restarting{}",
            l.saturating_sub(r),
            match l > d {
                true => format!(", {} to leave", l - d),
                false => String::new(),
            }
        ),
    };
    let restarts = match g.restarts {
        0 => String::new(),
        1 => "; 1 relaunch".to_string(),
        n => format!("; {n} relaunches"),
    };
    format!("{:<10} ({kind}) {size}{restarts}", g.role)
}

pub async fn status(master: &MasterArgs) -> anyhow::Result<std::process::ExitCode> {
    let mut c = client(master).await?;
    let s = c.get_status(pb::StatusRequest {}).await?.into_inner();
    say!("{}", summary_line(&s));
    say!(
        "{:<10} {:>11} {:>10} {:<15} {:>8} {:>9} {:>11} {:>5} {:>14}  given",
        "process",
        "incarnation",
        "state",
        "host",
        "pid",
        "cpu (m)",
        "rss (MiB)",
        "gpu",
        "step work (ms)"
    );
    for p in &s.processes {
        let (cpu, rss, gpu) = p
            .sample
            .as_ref()
            .map(|x| {
                (
                    x.cpu_millicores.to_string(),
                    format!("{:.1}", x.rss_bytes as f64 / 1048576.0),
                    if x.gpu_present { "yes" } else { "no" },
                )
            })
            .unwrap_or(("-".into(), "-".into(), "-"));
        let given = p.resources.as_ref().map_or_else(
            || "-".to_string(),
            |r| {
                let model = if r.gpu_type.is_empty() {
                    String::new()
                } else {
                    format!(" {}", r.gpu_type)
                };
                let devices = if p.devices.is_empty() {
                    String::new()
                } else {
                    format!(" (devices {})", p.devices)
                };
                format!(
                    "{}m cpu, {:.0} MiB, {}{model} gpu{devices}",
                    r.cpu_millicores,
                    r.memory_bytes as f64 / 1048576.0,
                    vocab::Gpus::from_milli(r.gpu_milli)
                )
            },
        );
        // Its own work per step, and how many times its group's median when it straggles.
        let work = match (p.step_compute_ms, p.straggler_ratio) {
            (w, _) if w <= 0.0 => "-".to_string(),
            (w, r) if r > 0.0 => format!("{w:.1} ({r:.2}x!)"),
            (w, _) => format!("{w:.1}"),
        };
        say!(
            "{:<10} {:>11} {:>10} {:<15} {:>8} {:>9} {:>11} {:>5} {:>14}  {given}",
            format!("{}-{}", p.role, p.index),
            p.incarnation,
            p.state,
            if p.host.is_empty() { "-" } else { &p.host },
            p.pid,
            cpu,
            rss,
            gpu,
            work
        );
    }
    print_role_groups(&s.role_groups);
    let stragglers: Vec<String> = s
        .processes
        .iter()
        .filter(|p| p.straggler_ratio > 0.0)
        .map(|p| format!("{}-{} ({:.2}x)", p.role, p.index, p.straggler_ratio))
        .collect();
    if !stragglers.is_empty() {
        say!("stragglers: {}", stragglers.join(", "));
    }
    if s.wall_ms > 0 {
        say!(
            "effective training time: {:.1} % of {:.1} s ({:.1} s trained, {:.1} s thrown away by restarts)",
            100.0 * s.training_ms as f64 / s.wall_ms as f64,
            s.wall_ms as f64 / 1000.0,
            s.training_ms as f64 / 1000.0,
            s.lost_training_ms as f64 / 1000.0
        );
    }
    if s.hangs > 0 {
        say!(
            "hangs found: {} (their stacks are in the job's report.json when it ends)",
            s.hangs
        );
    }
    for c in &s.role_checkpoints {
        say!(
            "{} checkpoint: step {} committed by {}-{} at {:.1} s ({})",
            c.role,
            c.step,
            c.role,
            c.index,
            c.at_ms as f64 / 1000.0,
            c.path
        );
    }
    if !s.role_rates.is_empty() {
        say!("calls between roles (last 30 s):");
    }
    for r in &s.role_rates {
        say!(
            "  {:<10} {} serving, {:.1} calls/s, busy {:.0}%; {} caller(s) wait {:.0}% of their time",
            r.role,
            r.processes,
            r.served_per_s,
            r.busy_share * 100.0,
            r.callers,
            r.callers_wait_share * 100.0
        );
        if r.caller_waits.len() > 1 {
            let by: Vec<String> = r
                .caller_waits
                .iter()
                .map(|c| format!("{} ×{} {:.0}%", c.role, c.callers, c.wait_share * 100.0))
                .collect();
            say!("  {:<10} callers by role: {}", "", by.join(", "));
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Prints one progress line every `every`, read over the master's own gRPC status call.
pub async fn show_progress(addr: std::net::SocketAddr, creds: auth::JobCreds, every: Duration) {
    let mut client = loop {
        match crate::connect(&addr.to_string(), &creds).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Ok(s) = client.get_status(pb::StatusRequest {}).await else {
            continue;
        };
        let s = s.into_inner();
        say!("{}", summary_line(&s));
    }
}

/// One line of a job's status: phase, progress, throughput, loss and processes alive.
pub fn summary_line(s: &pb::JobStatus) -> String {
    let alive = s.processes.iter().filter(|p| p.state == "running").count();
    let members = s.processes.iter().filter(|p| p.state != "removed").count();
    let plan = match (s.desired_plan_version, s.transition.is_empty()) {
        (0, _) => String::new(),
        (_, true) => format!(" plan {}", s.reached_plan_version),
        (_, false) => format!(" [{}]", s.transition),
    };
    let reason = if s.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", s.reason)
    };
    format!(
        "[{}{reason}] epoch {} shards {}/{} step {} {:.0} samples/s loss {:.4} checkpoints {} processes alive {}/{}{plan}",
        s.phase,
        s.epoch,
        s.shards_done,
        s.shards_total,
        s.global_step,
        s.samples_per_second,
        s.loss,
        s.checkpoints,
        alive,
        members
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_groups_line_sets_what_runs_against_what_it_should_be() {
        let group = |role: &str, training, desired, live, running, restarts| pb::RoleGroupStatus {
            role: role.into(),
            topology: if training { "allreduce" } else { "service" }.into(),
            training,
            desired,
            live,
            running,
            restarts,
        };
        assert_eq!(
            role_group_line(&group("worker", true, 2, 2, 2, 0)),
            "worker     (allreduce, training) 2 of 2 running"
        );
        assert_eq!(
            role_group_line(&group("rollout", false, 3, 3, 2, 1)),
            "rollout    (service) 3 wanted: 2 running, 1 starting or restarting; 1 relaunch"
        );
        assert_eq!(
            role_group_line(&group("rollout", false, 1, 3, 3, 2)),
            "rollout    (service) 1 wanted: 3 running, 0 starting or restarting, 2 to leave; \
             2 relaunches"
        );
    }
}
