//! `brainctl policy show|set`: the operator's policy of a running brain.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use proto::service::v1 as pb;

use crate::link::ask_brain;

#[derive(Subcommand)]
pub enum PolicyAction {
    /// Print the policy in force and the file it lives in.
    Show {
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
    /// Check a policy file and make it the brain's policy from the next round on. The brain
    /// keeps it in its database (also across restarts); the policy file it was started with is
    /// never rewritten, and is put in force again if it is edited later.
    Set {
        file: PathBuf,
        #[arg(long, default_value = "http://127.0.0.1:50070")]
        brain: String,
    },
}

pub fn policy(action: PolicyAction) -> anyhow::Result<()> {
    match action {
        PolicyAction::Show { brain } => {
            let p = ask_brain(&brain, async |mut c| {
                Ok(c.get_policy(pb::GetPolicyRequest {}).await?.into_inner())
            })?;
            if p.path.is_empty() {
                say!("# no policy file and none set: the defaults are in force");
            } else {
                say!("# {}", p.path);
            }
            print!("{}", p.toml);
            Ok(())
        }
        PolicyAction::Set { file, brain } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            optimizer::config::PolicyConfig::from_toml(&text)
                .with_context(|| format!("{} is not a valid policy", file.display()))?;
            let p = ask_brain(&brain, async |mut c| {
                Ok(c.set_policy(pb::PolicyText {
                    toml: text,
                    path: String::new(),
                })
                .await?
                .into_inner())
            })?;
            say!("policy set, in force from the next round: {}", p.path);
            Ok(())
        }
    }
}
