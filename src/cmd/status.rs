//! `koord-webhook status`: what an operator of the cluster wants to know about koord-webhook in
//! `koordinator-system`, read from the API server: leader, certificates, rotation phase, whether each
//! webhook configuration carries the trusted bundle, enabled entries, object counts, recent Events.

use std::fmt::Write as _;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, Secret};
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::apis::{ClusterColocationProfile, ElasticQuota, ElasticQuotaProfile, Reservation};
use crate::certs::authority;
use crate::controller::secrets::{self, PHASE_ANNOTATION};
use crate::controller::webhook_configs;
use crate::names::NAMESPACE;
use crate::names::{LEASE, SECRET_TLS};

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub leader: Option<String>,
    pub ca_not_after: Option<String>,
    pub serving_not_after: Option<String>,
    pub rotation_phase: Option<String>,
    pub configurations: Vec<ConfigurationStatus>,
    pub objects: Vec<(String, usize)>,
    pub recent_events: Vec<String>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStatus {
    pub name: String,
    pub exists: bool,
    pub ca_bundle_in_sync: bool,
    pub entries: Vec<(String, String)>,
}

fn not_after(pem: &str) -> Option<String> {
    let (_, until) = authority::validity(pem.as_bytes()).ok()?;
    jiff::Timestamp::try_from(until).ok().map(|t| t.to_string())
}

async fn count<K>(client: &Client) -> kube::Result<usize>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<PartialObjectMeta<K>> = Api::all(client.clone());
    Ok(api.list_metadata(&ListParams::default()).await?.items.len())
}

pub async fn collect(client: &Client) -> anyhow::Result<Status> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let leader = leases
        .get_opt(LEASE)
        .await
        .context("cannot reach the cluster")?
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty());
    let secrets_api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let tls_secret = secrets_api.get_opt(SECRET_TLS).await?;
    let tls = tls_secret.as_ref().and_then(secrets::read_tls);
    let rotation_phase = tls_secret
        .as_ref()
        .and_then(|s| crate::apis::meta::annotation(s, PHASE_ANNOTATION))
        .map(str::to_owned);
    let ca_not_after = tls.as_ref().and_then(|t| not_after(&t.bundle));
    let serving_not_after = tls.as_ref().and_then(|t| not_after(&t.serving.cert_pem));
    let trusted = tls.as_ref().map(|t| t.bundle.clone()).unwrap_or_default();

    let configurations = webhook_configs::published_entries(client)
        .await?
        .into_iter()
        .map(|(name, entries)| ConfigurationStatus {
            name: name.to_owned(),
            exists: entries.is_some(),
            ca_bundle_in_sync: entries.as_ref().is_some_and(|entries| {
                !trusted.is_empty() && entries.iter().all(|e| e.ca_bundle == trusted.as_bytes())
            }),
            entries: entries
                .into_iter()
                .flatten()
                .map(|e| (e.name, e.failure_policy))
                .collect(),
        })
        .collect();

    let objects = vec![
        (
            "ElasticQuota".to_owned(),
            count::<ElasticQuota>(client).await?,
        ),
        (
            "ElasticQuotaProfile".to_owned(),
            count::<ElasticQuotaProfile>(client).await?,
        ),
        (
            "Reservation".to_owned(),
            count::<Reservation>(client).await?,
        ),
        (
            "ClusterColocationProfile".to_owned(),
            count::<ClusterColocationProfile>(client).await?,
        ),
        ("ConfigMap (koordinator-system)".to_owned(), {
            let api: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client.clone(), NAMESPACE);
            api.list_metadata(&ListParams::default()).await?.items.len()
        }),
        ("Namespace".to_owned(), count::<Namespace>(client).await?),
        ("Node".to_owned(), count::<Node>(client).await?),
        ("Pod".to_owned(), count::<Pod>(client).await?),
    ];

    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    let mut items = events.list(&ListParams::default()).await?.items;
    let when = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    items.sort_by_key(|e| when(e));
    let recent_events = items
        .iter()
        .rev()
        .take(10)
        .map(|e| {
            format!(
                "{} {} {}: {}",
                when(e).map(|t| t.to_string()).unwrap_or_default(),
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default()
            )
        })
        .collect();

    Ok(Status {
        leader,
        ca_not_after,
        serving_not_after,
        rotation_phase,
        configurations,
        objects,
        recent_events,
    })
}

pub fn render_text(status: &Status) -> String {
    let mut out = String::new();
    let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".to_owned());
    let _ = writeln!(out, "leader:            {}", or_none(&status.leader));
    let _ = writeln!(out, "CA notAfter:       {}", or_none(&status.ca_not_after));
    let _ = writeln!(
        out,
        "serving notAfter:  {}",
        or_none(&status.serving_not_after)
    );
    let _ = writeln!(
        out,
        "rotation phase:    {}",
        or_none(&status.rotation_phase)
    );
    for c in &status.configurations {
        let state = match (c.exists, c.ca_bundle_in_sync) {
            (false, _) => "missing",
            (true, true) => "caBundle in sync",
            (true, false) => "caBundle NOT in sync",
        };
        let _ = writeln!(out, "{}: {state}", c.name);
        for (entry, policy) in &c.entries {
            let _ = writeln!(out, "  {entry} (failurePolicy {policy})");
        }
    }
    let _ = writeln!(out, "objects:");
    for (kind, n) in &status.objects {
        let _ = writeln!(out, "  {kind}: {n}");
    }
    let _ = writeln!(out, "recent events:");
    for e in &status.recent_events {
        let _ = writeln!(out, "  {e}");
    }
    out
}

pub async fn run(json: bool) -> anyhow::Result<String> {
    let client = Client::try_default()
        .await
        .context("cannot configure a Kubernetes client (KUBECONFIG or in-cluster)")?;
    let status = tokio::time::timeout(std::time::Duration::from_secs(15), collect(&client))
        .await
        .context("the cluster did not answer within 15s")??;
    Ok(if json {
        serde_json::to_string_pretty(&status)? + "\n"
    } else {
        render_text(&status)
    })
}
