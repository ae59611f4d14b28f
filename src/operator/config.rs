//! What the operator is configured with (`cmd/serve.rs` resolves it from the flags), the serving
//! certificate's SANs, and who records its Events.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Reporter;

use super::certificates::CertPolicy;
use super::leader::LeaseTimings;
use super::webhook_keeper::Desired;
use crate::names::{Mode, namespace};

/// Who issues the serving certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CertMode {
    /// The operator issues and rotates its CA and serving certificate.
    #[value(name = "self")]
    SelfManaged,
    /// `webhook-tls` comes from elsewhere (e.g. cert-manager); the operator only reads it.
    External,
}

#[derive(Clone, Debug)]
pub struct OperatorConfig {
    pub identity: String,
    pub leader_elect: bool,
    pub lease: LeaseTimings,
    pub cert_mode: CertMode,
    pub policy: CertPolicy,
    pub desired: Desired,
    /// How long after quota evaluation last wrote a quota the leader may recount its child-request.
    pub child_request_quiet: Duration,
    /// How long after the last admitted change that needed a pod entry (and after its cache
    /// synced) the leader may narrow it (`--narrow-hold`).
    pub narrow_hold: Duration,
    /// How long a watch may fail without a success before the replica turns unready
    /// (`--watch-failure-bound`).
    pub watch_failure_bound: Duration,
    /// The ConfigMaps the rules read (namespace, name): the only ones the cache watches.
    pub config_maps: Vec<(String, String)>,
    /// `--memory-limit`: the replica turns unready near it (`memory_guard.rs`).
    pub memory_limit: Option<u64>,
}

/// The SANs of the serving certificate (docs/certificates.md).
pub fn serving_hosts(webhook_host: Option<&str>, mode: Mode) -> Vec<String> {
    let svc = mode.service_name();
    let mut hosts = vec![
        format!("{svc}.{}.svc", namespace()),
        svc.to_owned(),
        format!("{svc}.{}", namespace()),
        format!("{svc}.{}.svc.cluster.local", namespace()),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ];
    if let Some(host) = webhook_host {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        hosts.retain(|h| *h != host);
        hosts.insert(0, host);
    }
    hosts
}

/// Who records this replica's Events.
pub(crate) fn reporter(identity: &str) -> Reporter {
    Reporter {
        controller: "koord-webhook".to_owned(),
        instance: Some(identity.to_owned()),
    }
}

/// The replica's own Pod, which its Events regard.
pub fn own_pod(identity: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(identity.to_owned()),
        namespace: Some(namespace().to_owned()),
        ..Default::default()
    }
}
