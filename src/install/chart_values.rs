//! The chart's values, defined once: `values.schema.json` (Helm checks every install, upgrade and
//! template against it, so a misspelt key or a failurePolicy that is neither Fail nor Ignore stops
//! the render naming it) and the values table of the chart's README come from these types and their
//! doc comments. `values.yaml` keeps the defaults and the longer comments; a test renders it.

// The types exist for their schema: nothing builds or reads them.
#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, PodSecurityContext, ResourceRequirements,
    SecurityContext, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde_json::Value;

/// The values of charts/koord-webhook.
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(title = "koord-webhook chart values")]
pub struct Values {
    /// `enforce`: Koordinator's names, in place of koord-manager's webhook. `shadow`: beside it, to
    /// try koord-webhook first (own names and CA, every rule in Audit, Ignore, no CRDs; README,
    /// "Try it beside koord-manager first"); install it into a namespace of its own.
    mode: Mode,
    /// Replicas of the webhook server; one is leader (certificates, caBundles), all serve admission.
    #[schemars(range(min = 1))]
    replica_count: u32,
    image: Image,
    /// Secrets for pulling the image.
    image_pull_secrets: Vec<LocalObjectReference>,
    /// The container's requests and limits (README, "Sizing").
    resources: ResourceRequirements,
    /// Render the Namespace object (`helm install --create-namespace` does it instead).
    create_namespace: bool,
    crds: Crds,
    /// Feature gates, name: true|false (docs/admission.md).
    feature_gates: BTreeMap<String, bool>,
    webhooks: Webhooks,
    #[serde(rename = "clientCA")]
    client_ca: ClientCa,
    network_policy: NetworkPolicy,
    certificates: Certificates,
    /// Any other `koord-webhook serve` flag by its name without dashes (files/serve-flags.yaml).
    serve: BTreeMap<String, Value>,
    /// Arguments added to the container as they are.
    extra_args: Vec<String>,
    /// Environment variables added to the container as they are.
    extra_env: Vec<EnvVar>,
    logging: Logging,
    metrics: Metrics,
    pod_disruption_budget: PodDisruptionBudget,
    /// The replicas' priority class.
    priority_class_name: String,
    priority_class_quota: PriorityClassQuota,
    /// The Pod's security context (no fixed UID or GID by default: README, "Platforms").
    pod_security_context: PodSecurityContext,
    /// The container's security context.
    security_context: SecurityContext,
    /// The replicas' node selector.
    node_selector: BTreeMap<String, String>,
    /// The replicas' tolerations.
    tolerations: Vec<Toleration>,
    /// Empty: the replicas preferably on different nodes; anything given replaces that.
    affinity: Affinity,
    /// E.g. spreading the replicas over zones.
    topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// Annotations of the replicas' Pods.
    pod_annotations: BTreeMap<String, String>,
    tests: Tests,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Tests {
    /// `helm test` checks admission with a dry-run pod create here (not a namespace the pod entries
    /// skip).
    admission_namespace: String,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Image {
    /// The image without its tag.
    repository: String,
    /// Default: the chart's appVersion.
    tag: String,
    /// `sha256:...`: pins the exact image, and wins over the tag.
    #[schemars(regex(pattern = r"^(sha256:[0-9a-f]{64})?$"))]
    digest: String,
    /// When the kubelet pulls the image.
    pull_policy: PullPolicy,
}

#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Enforce,
    Shadow,
}

#[derive(JsonSchema)]
enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
struct Crds {
    /// Install Koordinator's CRDs with the chart (kept on uninstall).
    install: bool,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Webhooks {
    /// failurePolicy per entry name, or `all`.
    failure_policy: BTreeMap<String, FailurePolicy>,
    /// Seconds the API server waits for an answer.
    #[schemars(range(min = 1, max = 30))]
    timeout_seconds: u32,
    /// Namespaces the pod entries skip, besides kube-system and the release namespace.
    exclude_namespaces: Vec<String>,
    /// Namespace labels (`KEY` or `KEY=VALUE`) that exempt a namespace from the pod entries.
    exclude_namespace_labels: Vec<String>,
    /// Call only for requests whose answer can differ from "allowed, unchanged" (docs/narrowing.md).
    narrow_calls: bool,
    /// Entries whose rules record instead of enforcing, by entry name or `all` (docs/admission.md).
    actions: BTreeMap<String, EntryAction>,
}

#[derive(JsonSchema)]
enum FailurePolicy {
    Fail,
    Ignore,
}

#[derive(JsonSchema)]
enum EntryAction {
    Audit,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClientCa {
    /// A ConfigMap in the release namespace holding the client CA bundle (or `secret`, not both).
    config_map: String,
    /// A Secret in the release namespace holding the client CA bundle.
    secret: String,
    /// The key of the bundle in it.
    key: String,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NetworkPolicy {
    /// The API server's source CIDRs: the NetworkPolicy is rendered when given.
    #[serde(rename = "apiServerCIDRs")]
    api_server_cidrs: Vec<String>,
    /// Who may reach the operations port, as NetworkPolicy `from` peers (empty: anyone).
    operations_from: Vec<Value>,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Certificates {
    mode: CertificateMode,
    cert_manager: CertManager,
}

/// `self`: the operator issues and rotates its certificates; `external`: cert-manager does.
#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
enum CertificateMode {
    #[serde(rename = "self")]
    OwnCa,
    External,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CertManager {
    /// The Issuer or ClusterIssuer of the serving certificate (empty: a self-signed CA).
    issuer_ref: BTreeMap<String, String>,
    /// The serving certificate's lifetime (a Go duration).
    duration: String,
    /// Renewal before expiry (a Go duration).
    renew_before: String,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Logging {
    /// `text`, or `json` (one object per line, for log collectors).
    format: LogFormat,
    /// RUST_LOG: `info`, `debug`, or per target.
    level: String,
}

#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
enum LogFormat {
    Text,
    Json,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Metrics {
    /// A Service for the plain-HTTP `/metrics` port (8080).
    service: Enabled,
    service_monitor: ServiceMonitor,
    prometheus_rule: PrometheusRule,
    grafana_dashboard: GrafanaDashboard,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GrafanaDashboard {
    /// The dashboard (docs/grafana-dashboard.json) in a ConfigMap, for Grafana's dashboard sidecar.
    enabled: bool,
    /// Labels the sidecar selects dashboard ConfigMaps by.
    labels: BTreeMap<String, String>,
    /// The ConfigMap's namespace (empty: the release namespace).
    namespace: String,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
struct Enabled {
    /// Render it.
    enabled: bool,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ServiceMonitor {
    /// A Prometheus Operator ServiceMonitor scraping that Service.
    enabled: bool,
    /// The scrape interval (a Prometheus duration).
    interval: String,
    /// Labels the Prometheus selects ServiceMonitors by.
    labels: BTreeMap<String, String>,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PrometheusRule {
    /// The alerts (docs/runbooks.md) as a Prometheus Operator PrometheusRule.
    enabled: bool,
    /// Labels the Prometheus selects rules by.
    labels: BTreeMap<String, String>,
    /// Alert when a certificate expires within this many days.
    #[schemars(range(min = 1))]
    certificate_expiry_days: u32,
    /// Each alert's runbook_url is this page with the alert's name as anchor.
    #[serde(rename = "runbookBaseURL")]
    runbook_base_url: String,
}

#[derive(JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PodDisruptionBudget {
    /// Rendered only with more than one replica.
    min_available: IntOrString,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
struct PriorityClassQuota {
    /// A ResourceQuota admitting the critical priority class outside kube-system (GKE).
    enabled: bool,
    /// How many pods of the class the namespace may run.
    #[schemars(range(min = 1))]
    pods: u32,
}

/// `values.schema.json`.
pub fn schema() -> Value {
    serde_json::to_value(schemars::schema_for!(Values)).unwrap_or_default()
}

/// The chart's README: how to install, and every value with its type and description.
pub fn readme(schema: &Value) -> String {
    let mut rows = Vec::new();
    rows_of(schema, schema, "", &mut rows);
    let mut out = String::from(
        "<!-- Generated by `koord-webhook chart-files` (scripts/gen) from src/install/chart_values.rs; do not edit. -->\n\
         # koord-webhook chart\n\n\
         Koordinator's admission webhooks, served by one self-managing operator. Install:\n\n\
         ```sh\nhelm install koord-webhook charts/koord-webhook -n koordinator-system --create-namespace\n```\n\n\
         The defaults and longer notes are in `values.yaml`; the project's README explains each setting.\n\
         Values are checked against `values.schema.json`: a key the chart does not know stops the install.\n\n\
         | value | type | description |\n| --- | --- | --- |\n",
    );
    for (key, kind, description) in rows {
        out += &format!("| `{key}` | {kind} | {description} |\n");
    }
    out
}

/// The schema that `node` stands for (following a `$ref` into `$defs`).
fn resolve<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        Some(name) => &root["$defs"][name],
        None => node,
    }
}

/// One row per value: our objects are walked into, Kubernetes' types and maps are one row.
fn rows_of(root: &Value, node: &Value, prefix: &str, rows: &mut Vec<(String, String, String)>) {
    let node = resolve(root, node);
    let Some(properties) = node["properties"].as_object() else {
        return;
    };
    for (name, property) in properties {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let target = resolve(root, property);
        let ours = target["additionalProperties"] == Value::Bool(false);
        if ours && target["properties"].is_object() {
            rows_of(root, target, &key, rows);
            continue;
        }
        let description = property["description"]
            .as_str()
            .or(target["description"].as_str())
            .unwrap_or_default()
            .replace('\n', " ")
            .replace('|', "\\|");
        rows.push((key, kind_of(target), description));
    }
}

fn kind_of(schema: &Value) -> String {
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
            .collect();
        return values.join(" \\| ");
    }
    if let Some(choices) = schema["oneOf"].as_array() {
        let values: Vec<String> = choices
            .iter()
            .filter_map(|c| c["const"].as_str().or(c["enum"][0].as_str()))
            .map(|v| format!("`{v}`"))
            .collect();
        if !values.is_empty() {
            return values.join(" \\| ");
        }
    }
    if schema["x-kubernetes-int-or-string"] == true {
        return "integer or string".to_owned();
    }
    match &schema["type"] {
        Value::String(t) => t.clone(),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "object".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_refuses_unknown_keys_and_lists_the_choices() {
        let schema = schema();
        assert_eq!(schema["additionalProperties"], false);
        let readme = readme(&schema);
        for row in [
            "| `metrics.serviceMonitor.enabled` | boolean |",
            "| `webhooks.timeoutSeconds` | integer |",
            "| `logging.format` | `text` \\| `json` |",
            "| `certificates.mode` | `self` \\| `external` |",
        ] {
            assert!(readme.contains(row), "{row} not in:\n{readme}");
        }
    }
}
