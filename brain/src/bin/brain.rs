//! `brain`: the cluster-wide brain service.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "brain",
    version,
    about = "The cluster-wide brain: job masters register with it, report metrics and receive \
             scale plans."
)]
struct Cli {
    /// Address to serve the gRPC API on.
    #[arg(long, default_value = "127.0.0.1:50070")]
    listen: String,
    /// SQLite database of jobs, metric summaries and plans (created if missing).
    #[arg(long, default_value = "brain-data/brain.db")]
    database: PathBuf,
    /// A TOML config file instead of the flags (`database = "path/brain.db"`; unknown keys are
    /// errors).
    #[arg(long, conflicts_with = "database")]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let config = match cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("{}", path.display()))?
        }
        None => brain::BrainConfig {
            database: cli.database,
        },
    };
    let listener = tokio::net::TcpListener::bind(&cli.listen)
        .await
        .with_context(|| format!("binding {}", cli.listen))?;
    // The address actually bound (port 0 picks one), for whoever started us.
    println!("listening on {}", listener.local_addr()?);
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    brain::run(config, listener, shutdown).await?;
    Ok(())
}
