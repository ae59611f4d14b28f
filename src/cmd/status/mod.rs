//! `koord-webhook status`: what an operator of the cluster wants to know about koord-webhook in its
//! namespace, read from the API server: health and the problems found, leader, certificates,
//! rotation phase, whether each webhook configuration carries the trusted bundle, enabled entries,
//! ready endpoints, object counts, recent Events. Exit 0 healthy, 1 unhealthy, 2 when the cluster
//! cannot be read; `--wait` polls until healthy.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::apis::{ClusterColocationProfile, ElasticQuota, ElasticQuotaProfile, Reservation};
use crate::certs::authority;
use crate::cli::{OutputFormat, StatusArgs};
use crate::names::{LEASE, Mode, SECRET_TLS};
use crate::operator::secrets::{self, PHASE_ANNOTATION};
use crate::operator::webhook_keeper;

mod admission_check;
mod rules;
pub use rules::RuleStatus;

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// No problem found: a live leader, both configurations carrying the trusted bundle, no
    /// certificate expiring within the threshold, ready endpoints behind the Service.
    pub healthy: bool,
    pub problems: Vec<String>,
    pub namespace: String,
    pub leader: Option<String>,
    pub ca_not_after: Option<String>,
    pub serving_not_after: Option<String>,
    pub rotation_phase: Option<String>,
    /// Ready endpoints behind the webhook Service (`None`: the entries call a URL, or no Service).
    pub ready_endpoints: Option<usize>,
    pub configurations: Vec<ConfigurationStatus>,
    pub objects: Vec<ObjectCount>,
    pub recent_events: Vec<String>,
    /// Rules not at their default action, or with refusals counted (docs/admission.md).
    pub rules: Vec<RuleStatus>,
    /// What could not be read for `rules`.
    pub rule_notes: Vec<String>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStatus {
    pub name: String,
    pub exists: bool,
    pub ca_bundle_in_sync: bool,
    pub entries: Vec<EntryStatus>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct EntryStatus {
    pub name: String,
    pub failure_policy: String,
    /// The names of its matchConditions: empty when every request its rules select is sent.
    pub match_conditions: Vec<String>,
}

#[derive(Serialize, Debug)]
pub struct ObjectCount {
    pub kind: String,
    pub count: usize,
}

/// What `status` checks against.
#[derive(Clone, Debug)]
pub struct Checks {
    pub namespace: String,
    /// Which install (`--mode`): its configurations and Service.
    pub mode: Mode,
    /// A certificate expiring sooner than this is a problem.
    pub expiry_threshold: Duration,
}

/// A certificate's notAfter as text, and whether it expires within `threshold` (or is unreadable).
fn not_after(pem: &str, threshold: Duration) -> (Option<String>, bool) {
    let Ok((_, until)) = authority::validity(pem.as_bytes()) else {
        return (None, true);
    };
    let expiring = until
        .duration_since(SystemTime::now())
        .map_or(true, |left| left < threshold);
    (
        jiff::Timestamp::try_from(until).ok().map(|t| t.to_string()),
        expiring,
    )
}

/// Objects of a kind, counted a page at a time (metadata only) so a large cluster costs bounded
/// memory.
async fn count<K>(api: Api<PartialObjectMeta<K>>) -> kube::Result<usize>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default().limit(PAGE);
    let mut total = 0;
    loop {
        let page = api.list_metadata(&params).await?;
        total += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(total),
        }
    }
}

const PAGE: u32 = 500;

async fn count_all<K>(client: &Client) -> kube::Result<usize>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    count(Api::<PartialObjectMeta<K>>::all(client.clone())).await
}

/// The Lease's holder, and a problem when there is none or its renewal is overdue.
fn leader_of(lease: Option<Lease>, problems: &mut Vec<String>) -> Option<String> {
    let spec = lease.and_then(|l| l.spec);
    let holder = spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty());
    let Some(spec) = spec.filter(|_| holder.is_some()) else {
        problems.push(format!("no leader: the Lease {LEASE} has no holder"));
        return None;
    };
    if let (Some(renewed), Some(seconds)) = (&spec.renew_time, spec.lease_duration_seconds) {
        let overdue =
            jiff::Timestamp::now().duration_since(renewed.0).as_secs() > i64::from(seconds.max(0));
        if overdue {
            problems.push(format!(
                "no leader: {} last renewed the Lease at {}, more than {seconds}s ago",
                holder.as_deref().unwrap_or_default(),
                renewed.0
            ));
        }
    }
    holder
}

/// Ready endpoints behind the webhook Service; `None` when there is no Service (URL mode).
async fn ready_endpoints(
    client: &Client,
    namespace: &str,
    service: &str,
) -> kube::Result<Option<usize>> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    if services.get_opt(service).await?.is_none() {
        return Ok(None);
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let by_service = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    let ready = slices
        .list(&by_service)
        .await?
        .items
        .iter()
        .flat_map(|s| &s.endpoints)
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .count();
    Ok(Some(ready))
}

pub async fn collect(client: &Client, checks: &Checks) -> anyhow::Result<Status> {
    let namespace = checks.namespace.as_str();
    let mut problems = Vec::new();
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = leases
        .get_opt(LEASE)
        .await
        .context("cannot reach the cluster")?;
    let leader = leader_of(lease, &mut problems);
    let certificates = certificates(client, checks, &mut problems).await?;
    let (configurations, via_service) =
        configurations(client, checks.mode, &certificates.trusted, &mut problems).await?;
    let service = checks.mode.service_name();
    let ready_endpoints = match via_service {
        true => ready_endpoints(client, namespace, service).await?,
        false => None,
    };
    if ready_endpoints == Some(0) {
        problems.push(format!("the Service {service} has no ready endpoint"));
    }
    let objects = objects(client, namespace).await?;
    let recent_events = recent_events(client, namespace, checks.mode).await?;
    let (rules, rule_notes) = rules::collect(client, namespace).await;

    Ok(Status {
        healthy: problems.is_empty(),
        problems,
        namespace: namespace.to_owned(),
        leader,
        ca_not_after: certificates.ca_not_after,
        serving_not_after: certificates.serving_not_after,
        rotation_phase: certificates.rotation_phase,
        ready_endpoints,
        configurations,
        objects,
        recent_events,
        rules,
        rule_notes,
    })
}

/// What the Secret `webhook-tls` holds, read for the report.
struct Certificates {
    /// The CA bundle the configurations should carry.
    trusted: String,
    ca_not_after: Option<String>,
    serving_not_after: Option<String>,
    rotation_phase: Option<String>,
}

/// The certificates' expiry (a problem within the threshold) and the rotation's phase.
async fn certificates(
    client: &Client,
    checks: &Checks,
    problems: &mut Vec<String>,
) -> anyhow::Result<Certificates> {
    let secrets_api: Api<Secret> = Api::namespaced(client.clone(), &checks.namespace);
    let tls_secret = secrets_api.get_opt(SECRET_TLS).await?;
    let tls = tls_secret.as_ref().and_then(secrets::read_tls);
    let rotation_phase = tls_secret
        .as_ref()
        .and_then(|s| crate::apis::meta::annotation(s, PHASE_ANNOTATION))
        .map(str::to_owned);
    let (mut ca_not_after, mut serving_not_after) = (None, None);
    match &tls {
        None => problems.push(format!(
            "the Secret {SECRET_TLS} holds no usable certificate"
        )),
        Some(t) => {
            for (what, pem, slot) in [
                ("CA", &t.bundle, &mut ca_not_after),
                (
                    "serving certificate",
                    &t.serving.cert_pem,
                    &mut serving_not_after,
                ),
            ] {
                let (until, expiring) = not_after(pem, checks.expiry_threshold);
                if expiring {
                    problems.push(format!(
                        "the {what} expires within {:?} ({})",
                        checks.expiry_threshold,
                        until.as_deref().unwrap_or("unreadable")
                    ));
                }
                *slot = until;
            }
        }
    }
    Ok(Certificates {
        trusted: tls.map(|t| t.bundle).unwrap_or_default(),
        ca_not_after,
        serving_not_after,
        rotation_phase,
    })
}

/// The webhook configurations as published (a missing one, or a caBundle other than `trusted`, is a
/// problem), and whether any entry calls through the Service.
async fn configurations(
    client: &Client,
    mode: Mode,
    trusted: &str,
    problems: &mut Vec<String>,
) -> anyhow::Result<(Vec<ConfigurationStatus>, bool)> {
    let published = webhook_keeper::published_entries(client, mode).await?;
    let via_service = published
        .iter()
        .flat_map(|(_, entries)| entries.iter().flatten())
        .any(|e| e.via_service);
    let configurations: Vec<ConfigurationStatus> = published
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
                .map(|e| EntryStatus {
                    name: e.name,
                    failure_policy: e.failure_policy,
                    match_conditions: e.match_conditions,
                })
                .collect(),
        })
        .collect();
    for c in &configurations {
        match (c.exists, c.ca_bundle_in_sync) {
            (false, _) => problems.push(format!("{} does not exist", c.name)),
            (true, false) => problems.push(format!("{}: caBundle NOT in sync", c.name)),
            (true, true) => {}
        }
    }
    Ok((configurations, via_service))
}

/// How many objects of each kind the replicas' caches follow.
async fn objects(client: &Client, namespace: &str) -> anyhow::Result<Vec<ObjectCount>> {
    let objects = [
        ("ElasticQuota", count_all::<ElasticQuota>(client).await?),
        (
            "ElasticQuotaProfile",
            count_all::<ElasticQuotaProfile>(client).await?,
        ),
        ("Reservation", count_all::<Reservation>(client).await?),
        (
            "ClusterColocationProfile",
            count_all::<ClusterColocationProfile>(client).await?,
        ),
        (
            "ConfigMap (in the namespace)",
            count(Api::<PartialObjectMeta<ConfigMap>>::namespaced(
                client.clone(),
                namespace,
            ))
            .await?,
        ),
        ("Namespace", count_all::<Namespace>(client).await?),
        ("Node", count_all::<Node>(client).await?),
        ("Pod", count_all::<Pod>(client).await?),
    ];
    Ok(objects
        .into_iter()
        .map(|(kind, count)| ObjectCount {
            kind: kind.to_owned(),
            count,
        })
        .collect())
}

/// The ten latest Events of the namespace and of the webhook configurations, newest first.
async fn recent_events(
    client: &Client,
    namespace: &str,
    mode: Mode,
) -> anyhow::Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let mut items = events.list(&ListParams::default().limit(PAGE)).await?.items;
    // Events about the webhook configurations (cluster-scoped, so kept in `default`): caBundle
    // writes and hand edits put back.
    let default: Api<Event> = Api::namespaced(client.clone(), "default");
    for (_, configuration) in mode.configurations() {
        let about = ListParams::default()
            .fields(&format!("involvedObject.name={configuration}"))
            .limit(PAGE);
        items.extend(default.list(&about).await?.items);
    }
    let when = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    items.sort_by_key(|e| when(e));
    Ok(items
        .iter()
        .rev()
        .take(10)
        .map(|e| {
            format!(
                "{} {} {} {}: {}",
                when(e).map(|t| t.to_string()).unwrap_or_default(),
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                e.involved_object.name.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default()
            )
        })
        .collect())
}

pub fn render_text(status: &Status) -> String {
    let mut out = String::new();
    let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".to_owned());
    let health = if status.healthy {
        "healthy"
    } else {
        "UNHEALTHY"
    };
    let _ = writeln!(out, "koord-webhook in {}: {health}", status.namespace);
    for p in &status.problems {
        let _ = writeln!(out, "  problem: {p}");
    }
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
        for e in &c.entries {
            let calls = if e.match_conditions.is_empty() {
                "every request".to_owned()
            } else {
                format!("narrowed by {}", e.match_conditions.join(", "))
            };
            let _ = writeln!(
                out,
                "  {} (failurePolicy {}; {calls})",
                e.name, e.failure_policy
            );
        }
    }
    if let Some(ready) = status.ready_endpoints {
        let _ = writeln!(out, "ready endpoints:   {ready}");
    }
    let _ = writeln!(out, "objects:");
    for o in &status.objects {
        let _ = writeln!(out, "  {}: {}", o.kind, o.count);
    }
    let _ = writeln!(out, "recent events:");
    for e in &status.recent_events {
        let _ = writeln!(out, "  {e}");
    }
    let _ = writeln!(
        out,
        "rules (not enforcing, or refusing; counts since each replica started):"
    );
    for r in &status.rules {
        let _ = writeln!(
            out,
            "  {} on {}: {}; denied {}, would deny {}, would change {}",
            r.rule, r.webhook, r.action, r.denied, r.would_deny, r.would_change
        );
    }
    for note in &status.rule_notes {
        let _ = writeln!(out, "  ({note})");
    }
    out
}

/// One report, or with `wait` the first healthy one (or the last before `timeout`). The bool says
/// whether it is healthy.
pub async fn run(args: &StatusArgs) -> anyhow::Result<(String, bool)> {
    let client = crate::cluster_client::client(&args.cluster).await?;
    let checks = Checks {
        namespace: args.cluster.namespace().to_owned(),
        mode: args.cluster.mode,
        expiry_threshold: args.expiry_threshold,
    };
    let deadline = tokio::time::Instant::now() + args.timeout;
    let status = loop {
        let attempt = tokio::time::timeout(Duration::from_secs(15), collect(&client, &checks))
            .await
            .context("the cluster did not answer within 15s")
            .and_then(|collected| collected);
        let mut status = match attempt {
            Ok(status) => status,
            // `--wait` polls through a failed read (an object replaced between a list and a get
            // while an upgrade rolls, a busy API server) until its deadline, as `kubectl wait`
            // does; the last error is the answer then.
            Err(e) if args.wait && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %format!("{e:#}"), "status: reading the cluster failed; trying again");
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Some(namespace) = args.check_admission.as_deref().filter(|_| status.healthy)
            && let Some(problem) = admission_check::check(&client, namespace).await
        {
            status.problems.push(problem);
            status.healthy = false;
        }
        if status.healthy || !args.wait || tokio::time::Instant::now() >= deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let text = match args.output {
        OutputFormat::Json => serde_json::to_string_pretty(&status)? + "\n",
        OutputFormat::Yaml => serde_yaml::to_string(&status)?,
        OutputFormat::Text => render_text(&status),
    };
    Ok((text, status.healthy))
}
