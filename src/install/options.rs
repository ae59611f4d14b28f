//! What `koord-webhook manifests` renders from: the image, the gates, the webhook entries' target
//! and caller authentication.

use super::webhook_configurations::WebhookTarget;
use crate::features::FeatureGates;

/// The image the manifests name: tag = crate version (`scripts/image` builds it under this name).
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/koord-webhook/koord-webhook:",
    env!("CARGO_PKG_VERSION")
);

/// What `koord-webhook manifests` renders.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    pub image: String,
    /// Further `serve` arguments of the Deployment (`--serve-flag`, checked by `serve_flags.rs`).
    pub serve_args: Vec<String>,
    pub gates: FeatureGates,
    pub target: WebhookTarget,
    /// Where the CA bundle of caller authentication comes from (`--client-ca-file`), if any.
    pub client_ca: Option<ClientCaMount>,
    /// The Pod's terminationGracePeriodSeconds: derived from the drain the replicas are given
    /// (`server::shutdown::grace_period`).
    pub termination_grace_period_seconds: i64,
    /// Where Koordinator's ConfigMaps the rules read live (the replicas' `--config-namespace`): a
    /// shadow, in a namespace of its own, is given a Role there to read them.
    pub config_namespace: String,
}

/// The object holding the client CA bundle, in koord-webhook's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientCaObject {
    ConfigMap(String),
    Secret(String),
}

/// The client CA bundle, mounted into the replicas and re-read when the object changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCaMount {
    pub object: ClientCaObject,
    /// The key of the object holding the PEM bundle.
    pub key: String,
}

impl ClientCaMount {
    /// Where the replicas read it (the chart mounts it at the same place).
    pub const DIR: &'static str = "/etc/koord-webhook/client-ca";

    pub fn file(&self) -> String {
        format!("{}/{}", Self::DIR, self.key)
    }
}
