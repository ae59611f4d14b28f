//! The client of the commands that read a cluster (`status`, `uninstall`), chosen as kubectl
//! chooses it: `--kubeconfig` and `--context` when given, else $KUBECONFIG, ~/.kube/config or the
//! in-cluster service account.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Which cluster and namespace a command reads, as kubectl chooses them.
#[derive(Args, Debug, Clone, Default)]
pub struct ClusterFlags {
    /// Path of the kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// The namespace koord-webhook runs in (default koordinator-system, koord-webhook-shadow with
    /// `--mode shadow`).
    #[arg(long, short, env = "KOORD_WEBHOOK_NAMESPACE", value_parser = crate::names::parse_namespace)]
    pub namespace: Option<String>,
    /// Which install: the one that enforces (Koordinator's names) or a shadow beside
    /// koord-manager's webhook (`manifests --mode shadow`).
    #[arg(long, value_enum, default_value = "enforce")]
    pub mode: crate::names::Mode,
}

impl ClusterFlags {
    /// The install's namespace: `--namespace`, else its mode's default.
    pub fn namespace(&self) -> &str {
        self.mode.namespace_or(self.namespace.as_deref())
    }
}

pub async fn client(flags: &ClusterFlags) -> anyhow::Result<Client> {
    let options = KubeConfigOptions {
        context: flags.context.clone(),
        ..Default::default()
    };
    let config = match (&flags.kubeconfig, &flags.context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("cannot use the kubeconfig {}", path.display()))?
        }
        (None, Some(context)) => Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("cannot use the kubeconfig context {context}"))?,
        (None, None) => Config::infer()
            .await
            .context("cannot configure a Kubernetes client (KUBECONFIG or in-cluster)")?,
    };
    Client::try_from(config).context("cannot build a Kubernetes client")
}
