//! The data the Helm chart (`charts/koord-webhook`) renders from, written by `scripts/gen`
//! (`koord-webhook chart-files DIR`): the CRDs, the RBAC rules and the webhook table. The chart's
//! templates hold only the parts that values change, so the entries, rules and schemas stay in one
//! place (this crate), and a test renders the chart and `koord-webhook manifests` with the same
//! settings and compares them object by object.

use std::path::Path;

use serde_json::{Value, json};

use super::entry_policy::EntryPolicy;
use super::serve_flags::ServeFlags;
use crate::entries::narrowing::Calls;
use crate::entries::narrowing::pod::PodReach;
use crate::entries::{ENDPOINTS, WebhookKind};
use crate::features::FeatureGates;
use crate::install::rbac;
use crate::install::webhook_configurations::{self, WebhookTarget};
use crate::names::{DEFAULT_NAMESPACE, Mode};

/// docs/grafana-dashboard.json, which the chart's dashboard ConfigMap carries.
const GRAFANA_DASHBOARD: &str = include_str!("../../docs/grafana-dashboard.json");

/// The fields of an entry the chart's values decide; the rest is copied from the table.
const VALUE_FIELDS: &[&str] = &[
    "clientConfig",
    "failurePolicy",
    "namespaceSelector",
    "timeoutSeconds",
    "matchConditions",
];

/// `{mutating: [...], validating: [...]}`: per entry its gate (and the gate's default), its path,
/// the table's failurePolicy, whether it skips the system namespaces, what it is called for when
/// calls are narrowed (`neverCalled`, `matchConditions`), and every other field as rendered wide
/// (`base`).
fn webhook_table() -> Result<Value, serde_json::Error> {
    let mut every_gate = FeatureGates::default();
    for gate in crate::features::Gate::all() {
        every_gate.set(gate, true);
    }
    // Every entry, without conditions (the template adds them when narrowing is on): those of the
    // wide rendering, and those registered only when calls are narrowed.
    let wide = WebhookTarget {
        policy: EntryPolicy {
            narrow_calls: false,
            ..EntryPolicy::default()
        },
        ..WebhookTarget::default()
    };
    let narrowed = WebhookTarget::default();
    let mut out = json!({"mutating": [], "validating": []});
    let render = |kind: WebhookKind| -> Result<Vec<Value>, serde_json::Error> {
        let mut entries = Vec::new();
        for target in [&wide, &narrowed] {
            let configuration =
                match kind {
                    WebhookKind::Mutating => serde_json::to_value(
                        webhook_configurations::mutating(&every_gate, target, None),
                    )?,
                    WebhookKind::Validating => serde_json::to_value(
                        webhook_configurations::validating(&every_gate, target, None),
                    )?,
                };
            entries.extend(
                configuration["webhooks"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        Ok(entries)
    };
    let rendered = [
        (
            "mutating",
            WebhookKind::Mutating,
            render(WebhookKind::Mutating)?,
        ),
        (
            "validating",
            WebhookKind::Validating,
            render(WebhookKind::Validating)?,
        ),
    ];
    for (key, kind, entries) in rendered {
        for spec in ENDPOINTS.iter().filter(|w| w.kind == kind) {
            for entry in spec.entries {
                let Some(mut base) = entries.iter().find(|e| e["name"] == entry.name).cloned()
                else {
                    continue;
                };
                if let Some(fields) = base.as_object_mut() {
                    for field in VALUE_FIELDS {
                        fields.remove(*field);
                    }
                }
                // The chart knows no cluster: pod entries reach every pod until the leader narrows.
                let calls = entry.narrowing.calls(&every_gate, &PodReach::default());
                out[key].as_array_mut().expect("an array").push(json!({
                    "name": entry.name,
                    "neverCalled": calls == Calls::Never,
                    "onlyNarrowed": entry.narrowing.calls_wide() == Calls::Never,
                    "matchConditions": release_namespace_placeholder(json!(calls.match_conditions())),
                    "gate": spec.gate.name(),
                    "gateDefault": spec.gate.default_enabled(),
                    "path": spec.path,
                    "failurePolicy": spec.failure_policy.as_str(),
                    "excludeSystemNamespaces": entry.exclude_system_namespaces,
                    "base": base,
                }));
            }
        }
    }
    Ok(out)
}

/// Writes `crds.yaml`, `rbac.yaml`, `webhooks.yaml` and `serve-flags.yaml` (the flags the chart's
/// `serve:` value may set) into `dir` (the chart's `files/`), and `values.schema.json` and the
/// values table of `README.md` into the chart beside it.
pub fn write(dir: &Path, serve_flags: &ServeFlags) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let header = "# Generated by `koord-webhook chart-files` (scripts/gen); do not edit.\n";
    let write = |name: &str, body: String| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{header}{body}"))
            .with_context(|| format!("cannot write {}", path.display()))
    };
    write("crds.yaml", crate::apis::crds_yaml()?)?;
    let shadow_reader = rbac::config_reader(Mode::Shadow, DEFAULT_NAMESPACE).map(|(r, _)| r.rules);
    let rbac = json!({
        "clusterRole": rbac::cluster_role(Mode::Enforce).rules,
        "role": rbac::role(Mode::Enforce).rules,
        "shadow": {
            "clusterRole": rbac::cluster_role(Mode::Shadow).rules,
            "role": rbac::role(Mode::Shadow).rules,
            "configReader": shadow_reader,
        },
    });
    write("rbac.yaml", serde_yaml::to_string(&rbac)?)?;
    write("webhooks.yaml", serde_yaml::to_string(&webhook_table()?)?)?;
    write("serve-flags.yaml", serde_yaml::to_string(serve_flags)?)?;
    // The Grafana dashboard the chart ships in a ConfigMap (metrics.grafanaDashboard), as is.
    let dashboard = dir.join("grafana-dashboard.json");
    std::fs::write(&dashboard, GRAFANA_DASHBOARD)
        .with_context(|| format!("cannot write {}", dashboard.display()))?;
    let chart = dir.parent().unwrap_or(dir);
    let schema = super::chart_values::schema();
    let readme = super::chart_values::readme(&schema);
    for (name, body) in [
        (
            "values.schema.json",
            serde_json::to_string_pretty(&schema)? + "\n",
        ),
        ("README.md", readme),
    ] {
        let path = chart.join(name);
        std::fs::write(&path, body).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
/// What the chart's templates replace with the release's namespace in a condition's expression.
pub const NAMESPACE_PLACEHOLDER: &str = "__RELEASE_NAMESPACE__";

/// The conditions with the install's namespace (in the replicas' user name, which
/// `velasticquota` compares) written as [`NAMESPACE_PLACEHOLDER`]: the chart is installed into a
/// namespace of the user's choosing.
fn release_namespace_placeholder(conditions: Value) -> Value {
    let ours = crate::names::service_account_user();
    let placeholder = ours.replacen(crate::names::namespace(), NAMESPACE_PLACEHOLDER, 1);
    match conditions {
        Value::String(text) => Value::String(text.replace(&ours, &placeholder)),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(release_namespace_placeholder)
                .collect(),
        ),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, release_namespace_placeholder(v)))
                .collect(),
        ),
        other => other,
    }
}
