//! `brainctl nodes`: the nodes the brain plans on (ok, cordoned, or holding a running job's
//! stragglers), and cordoning or uncordoning one.

use clap::Subcommand;
use proto::service::v1 as pb;

use crate::link::ask_brain;

#[derive(Subcommand)]
pub enum NodesAction {
    /// Take NODE (its name in `brainctl nodes`) out of what the brain plans on.
    Cordon {
        node: String,
        /// Why (shown with the node).
        #[arg(long)]
        reason: String,
        /// For how long (`30m`, `2h`, `1d`) [default: until uncordoned].
        #[arg(long = "for", value_parser = humantime::parse_duration)]
        for_: Option<std::time::Duration>,
    },
    /// Give NODE back to the brain's rounds.
    Uncordon { node: String },
}

pub fn nodes(action: Option<NodesAction>, brain: &str) -> anyhow::Result<()> {
    let nodes = ask_brain(brain, async |mut c| {
        Ok(match action {
            None => {
                c.list_nodes(pb::ListNodesRequest {})
                    .await?
                    .into_inner()
                    .nodes
            }
            Some(NodesAction::Cordon { node, reason, for_ }) => vec![
                c.cordon_node(pb::CordonNodeRequest {
                    node,
                    reason,
                    for_s: for_.map_or(0, |d| d.as_secs().max(1)),
                })
                .await?
                .into_inner(),
            ],
            Some(NodesAction::Uncordon { node }) => vec![
                c.uncordon_node(pb::UncordonNodeRequest { node })
                    .await?
                    .into_inner(),
            ],
        })
    })?;
    print_nodes(&nodes);
    Ok(())
}

/// A time of the brain's clock (Unix ms) as an RFC 3339 UTC time, to the second.
fn at(unix_ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn print_nodes(nodes: &[pb::NodeState]) {
    say!(
        "{:<20} {:>8} {:>10}  {:<9} why",
        "node",
        "cpus",
        "gpus",
        "state"
    );
    for n in nodes {
        let gpus = match (n.gpus, n.gpu_type.as_str()) {
            (0, _) => "-".to_string(),
            (g, "") => g.to_string(),
            (g, t) => format!("{g} {t}"),
        };
        let why = match n.state.as_str() {
            "straggler" => format!("stragglers: {}", n.stragglers.join("; ")),
            "cordoned" => format!(
                "{} (since {}{})",
                n.reason,
                at(n.since_unix_ms),
                if n.until_unix_ms > 0 {
                    format!(", until {}", at(n.until_unix_ms))
                } else {
                    ", until uncordoned".to_string()
                }
            ),
            _ => String::new(),
        };
        // A cordoned node may hold stragglers too.
        let why = if n.state == "cordoned" && !n.stragglers.is_empty() {
            format!("{why}; stragglers: {}", n.stragglers.join("; "))
        } else {
            why
        };
        say!(
            "{:<20} {:>8.1} {:>10}  {:<9} {why}",
            n.name,
            n.cpu_millicores as f64 / 1000.0,
            gpus,
            n.state
        );
    }
}
