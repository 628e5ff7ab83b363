//! How the command line reaches the running agent's API (address, bearer
//! token, TLS trust) and prints its answers.

use std::path::PathBuf;

use anyhow::Context as _;
use pxe_agent::{client, trust::Trust};

/// How to reach the running agent's API.
#[derive(clap::Args)]
pub struct ApiArgs {
    /// The running agent's API: https://HOST:PORT, http://HOST:PORT (or
    /// HOST:PORT); default $PXE_AGENT_ADDR, else $PXE_AGENT_API, else
    /// http://127.0.0.1:9465.
    #[arg(long, alias = "api", value_name = "ADDR", env = "PXE_AGENT_ADDR")]
    agent: Option<String>,
    /// File holding the bearer token (a `name token` line of the agent's
    /// token file works too); default $PXE_AGENT_TOKEN_FILE.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The CA certificates (PEM) an https:// API's certificate must be
    /// signed by; default the system's.
    #[arg(long, value_name = "FILE", env = "PXE_AGENT_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Do not verify an https:// API's certificate: whoever answers gets
    /// the token. For a test bench only.
    #[arg(long)]
    insecure: bool,
}

impl ApiArgs {
    /// The API's address: --agent (or its older name --api), else
    /// $PXE_AGENT_ADDR, else the older $PXE_AGENT_API, else the default.
    pub fn addr(&self) -> String {
        self.agent
            .clone()
            .or_else(|| std::env::var("PXE_AGENT_API").ok())
            .unwrap_or_else(|| client::DEFAULT_API.to_string())
    }

    /// A client of the API these flags name, with their token and trust.
    pub fn client(&self) -> anyhow::Result<client::Api> {
        let trust = match (&self.ca_file, self.insecure) {
            (_, true) => Trust::Insecure,
            (Some(ca), false) => Trust::CaFile(ca.clone()),
            (None, false) => Trust::System,
        };
        client::Api::new(
            &self.addr(),
            client::token_file(self.token_file.as_deref()).as_deref(),
            trust,
        )
    }
}

/// How to reach the running agent's acting API, and how to print its
/// answers.
#[derive(clap::Args)]
pub struct AgentCall {
    #[command(flatten)]
    pub api: ApiArgs,
    /// Print a table, or the agent's JSON.
    #[arg(long, alias = "output", value_enum, default_value_t = Output::Table)]
    pub format: Output,
}

/// How a command prints what the agent answered.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Prints an API answer as indented JSON, as the agent gave it.
pub fn print_json(body: &str) -> anyhow::Result<()> {
    let value: serde_json::Value =
        serde_json::from_str(body).context("malformed answer from the agent")?;
    println!("{}", serde_json::to_string_pretty(&value)?);
    Ok(())
}
