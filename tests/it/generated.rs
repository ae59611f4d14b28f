//! `crds/`, the chart's data files and `manifests/` are generated (from the code, and from the chart);
//! a stale copy fails here, and so does a chart that renders other objects than the binary.

use std::path::Path;
use std::time::Duration;

fn assert_current(relative: &str, rendered: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    let on_disk =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        on_disk == rendered,
        "{relative} is stale: regenerate it with `just gen` (or scripts/gen) and commit the result"
    );
}

#[test]
fn crds_are_current() {
    assert_current("crds/crds.yaml", &koord_webhook::apis::crds_yaml().unwrap());
}

/// The helm binary of `scripts/helm build`.
pub fn helm() -> std::path::PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/helm-bin/helm");
    assert!(
        path.exists(),
        "{} is missing: build it with scripts/helm build (scripts/test does)",
        path.display()
    );
    path
}

/// `helm template` of the chart into `namespace` with `extra` arguments; its output.
fn helm_render(namespace: &str, extra: &[&str]) -> String {
    let out = std::process::Command::new(helm())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["template", "koord-webhook", "charts/koord-webhook"])
        .args(["--namespace", namespace])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm template {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One template of the chart (`--show-only`), rendered into `namespace` with the defaults.
pub fn helm_show(namespace: &str, template: &str) -> String {
    helm_render(namespace, &["--show-only", template])
}

/// `helm template` of the chart into `namespace` with `--set` values (test hooks left out).
pub fn helm_template(namespace: &str, sets: &[&str]) -> String {
    let mut extra = vec!["--skip-tests"];
    for set in sets {
        extra.extend(["--set", set]);
    }
    helm_render(namespace, &extra)
}

fn manifests(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
        .arg("manifests")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "manifests {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The objects of a multi-document YAML text by kind/namespace/name, nulls and Helm's keep
/// annotation (which only a Helm release acts on) left out.
fn objects(text: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    fn clean(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.retain(|_, v| !v.is_null());
                if let Some(serde_json::Value::Object(annotations)) = map.get_mut("annotations") {
                    annotations.remove("helm.sh/resource-policy");
                    if annotations.is_empty() {
                        map.remove("annotations");
                    }
                }
                map.values_mut().for_each(clean);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(clean),
            _ => {}
        }
    }
    serde_yaml::Deserializer::from_str(text)
        .filter_map(|doc| {
            let mut value: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
            if value.is_null() {
                return None;
            }
            clean(&mut value);
            let key = format!(
                "{}/{}/{}",
                value["kind"].as_str().unwrap_or_default(),
                value["metadata"]["namespace"].as_str().unwrap_or_default(),
                value["metadata"]["name"].as_str().unwrap_or_default()
            );
            Some((key, value))
        })
        .collect()
}

fn assert_same_objects(chart: &str, binary: &str, what: &str) {
    let (chart, binary) = (objects(chart), objects(binary));
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        binary.keys().collect::<Vec<_>>(),
        "{what}: the chart and `koord-webhook manifests` render different objects"
    );
    for (key, object) in &chart {
        assert!(
            *object == binary[key],
            "{what}: {key} differs:\nchart:  {}\nbinary: {}",
            serde_json::to_string(object).unwrap(),
            serde_json::to_string(&binary[key]).unwrap()
        );
    }
}

/// manifests/install.yaml is the chart rendered with its defaults, byte for byte.
#[test]
fn install_manifests_are_the_chart_rendered() {
    let header = "# koord-webhook install manifests: the Helm chart charts/koord-webhook rendered with its defaults\n\
                  # (scripts/gen); do not edit. Apply with: kubectl apply --server-side -f manifests/install.yaml\n";
    let rendered = helm_template("koordinator-system", &["createNamespace=true"]);
    assert_current("manifests/install.yaml", &format!("{header}{rendered}"));
}

/// The chart's data files (CRDs, RBAC rules, the webhook table; beside `files/`, the values schema and
/// the README) are what the binary writes.
#[test]
fn chart_files_are_current() {
    let chart = tempfile::tempdir().unwrap();
    let files = chart.path().join("files");
    koord_webhook::install::chart_files::write(
        &files,
        &koord_webhook::cmd::manifests::serve_flags(),
    )
    .unwrap();
    for name in [
        "crds.yaml",
        "rbac.yaml",
        "webhooks.yaml",
        "grafana-dashboard.json",
    ] {
        let rendered = std::fs::read_to_string(files.join(name)).unwrap();
        assert_current(&format!("charts/koord-webhook/files/{name}"), &rendered);
    }
    for name in ["values.schema.json", "README.md"] {
        let rendered = std::fs::read_to_string(chart.path().join(name)).unwrap();
        assert_current(&format!("charts/koord-webhook/{name}"), &rendered);
    }
}

/// The tables generated into the docs (every `serve` flag in README.md, every gate in
/// docs/admission.md) are what the code defines.
#[test]
fn doc_tables_are_current() {
    for section in koord_webhook::cmd::doc_tables::SECTIONS {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(section.file);
        let text = std::fs::read_to_string(&path).unwrap();
        let rendered =
            koord_webhook::cmd::doc_tables::replaced(&text, section.marker, &(section.table)())
                .unwrap_or_else(|| {
                    panic!(
                        "{} has no <!-- {} --> section",
                        section.file, section.marker
                    )
                });
        assert_current(section.file, &rendered);
    }
}

/// The chart and `koord-webhook manifests` give the same objects for the same settings: with the
/// defaults, and with another namespace, image, gates, failure policies, timeout and exemptions.
/// (The operator re-creates and repairs configurations with the binary's rendering, so the two must
/// agree for a chart install to stay as installed.)
#[test]
fn the_chart_and_the_manifests_command_render_the_same_objects() {
    assert_same_objects(
        &helm_template("koordinator-system", &["createNamespace=true"]),
        &manifests(&[]),
        "defaults",
    );
    let chart = helm_template(
        "team-koord",
        &[
            "createNamespace=true",
            "image.repository=registry.local/koord-webhook",
            "image.tag=dev",
            "featureGates.NodeValidatingWebhook=false",
            "webhooks.failurePolicy.all=Ignore",
            "webhooks.failurePolicy.vpod\\.koordinator\\.sh=Fail",
            "webhooks.timeoutSeconds=5",
            "webhooks.excludeNamespaces={batch,ci}",
            "webhooks.excludeNamespaceLabels={koordinator.sh/exempt,tier=infra}",
            "webhooks.actions.velasticquota\\.koordinator\\.sh=Audit",
            "webhooks.actions.vpod\\.koordinator\\.sh=Audit",
        ],
    );
    let binary = manifests(&[
        "--namespace=team-koord",
        "--image=registry.local/koord-webhook:dev",
        "--feature-gates=NodeValidatingWebhook=false",
        "--failure-policy=all=Ignore",
        "--failure-policy=vpod.koordinator.sh=Fail",
        "--webhook-timeout-seconds=5",
        "--exclude-namespace=batch",
        "--exclude-namespace=ci",
        "--exclude-namespace-label=koordinator.sh/exempt",
        "--exclude-namespace-label=tier=infra",
        "--entry-action=velasticquota.koordinator.sh=Audit",
        "--entry-action=vpod.koordinator.sh=Audit",
    ]);
    assert!(chart.contains("- --exclude-namespace-label=tier=infra"));
    assert!(chart.contains("- --entry-action=vpod.koordinator.sh=Audit"));
    assert_same_objects(&chart, &binary, "settings");

    // Narrowing off: every entry as Koordinator registers it, without conditions.
    let chart = helm_template(
        "koordinator-system",
        &["createNamespace=true", "webhooks.narrowCalls=false"],
    );
    let binary = manifests(&["--narrow-calls=off"]);
    assert!(chart.contains("- --narrow-calls=off") && chart.contains("mpod-update.koordinator.sh"));
    assert!(!chart.contains("matchConditions"));
    assert_same_objects(&chart, &binary, "narrowing off");
    let narrowed = helm_template("koordinator-system", &["createNamespace=true"]);
    assert!(!narrowed.contains("mpod-update.koordinator.sh"));
    assert!(narrowed.contains("name: koord-amplified-node"));

    // A shadow beside koord-manager's webhook: the same objects from both, and none of them
    // Koordinator's (what `shadow_touches_nothing_of_koordinators` checks).
    let chart = helm_template(
        "koord-webhook-shadow",
        &["createNamespace=true", "mode=shadow"],
    );
    let binary = manifests(&["--mode=shadow"]);
    assert!(chart.contains("- --mode=shadow"));
    assert_same_objects(&chart, &binary, "shadow");
    shadow_touches_nothing_of_koordinators(&binary);

    // Caller authentication: the client CA bundle from a ConfigMap or a Secret, mounted whole.
    for (value, flag) in [
        (
            "clientCA.configMap=api-client-ca",
            "--client-ca-configmap=api-client-ca",
        ),
        (
            "clientCA.secret=api-client-ca",
            "--client-ca-secret=api-client-ca",
        ),
    ] {
        let chart = helm_template(
            "koordinator-system",
            &["createNamespace=true", value, "clientCA.key=bundle.pem"],
        );
        let binary = manifests(&[flag, "--client-ca-key=bundle.pem"]);
        assert!(chart.contains("- --client-ca-file=/etc/koord-webhook/client-ca/bundle.pem"));
        assert!(!chart.contains("subPath:"));
        assert_same_objects(&chart, &binary, value);
    }
}

/// Whether an RBAC rule grants reads only.
fn reads_only(rule: &serde_json::Value) -> bool {
    let verbs = rule["verbs"].as_array().unwrap();
    verbs
        .iter()
        .all(|v| ["get", "list", "watch"].contains(&v.as_str().unwrap()))
}

/// A shadow install (`manifests --mode shadow`) owns everything it makes and nothing of
/// Koordinator's: no CRD, no mutating configuration, no object under a Koordinator name; every
/// namespaced object in its own namespace but its reader of Koordinator's ConfigMaps; one
/// validating configuration whose entries all fail open under names of its own, calling its own
/// Service; and RBAC that writes only its configuration, Events and its own namespace's objects.
fn shadow_touches_nothing_of_koordinators(rendered: &str) {
    let objects = objects(rendered);
    for (key, object) in &objects {
        let kind = object["kind"].as_str().unwrap();
        let name = object["metadata"]["name"].as_str().unwrap();
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
        assert_ne!(kind, "CustomResourceDefinition", "{key}");
        assert_ne!(kind, "MutatingWebhookConfiguration", "{key}");
        assert!(
            !name.starts_with("koordinator"),
            "{key}: a Koordinator name"
        );
        match namespace {
            "" | "koord-webhook-shadow" => {}
            "koordinator-system" => {
                assert!(
                    ["Role", "RoleBinding"].contains(&kind) && name == "koord-webhook-shadow",
                    "{key}: only its ConfigMap reader lives beside Koordinator"
                );
                if kind == "Role" {
                    for rule in object["rules"].as_array().unwrap() {
                        assert!(reads_only(rule), "{key}: {rule}");
                    }
                }
            }
            other => panic!("{key}: in namespace {other}"),
        }
    }
    let configuration = &objects["ValidatingWebhookConfiguration//koord-webhook-shadow"];
    let entries = configuration["webhooks"].as_array().unwrap();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    // Every endpoint's entries, the mutating ones among them.
    for wanted in ["mpod-create", "vpod", "melasticquota", "velasticquota"] {
        assert!(
            names.contains(&format!("{wanted}.shadow.koord-webhook.io").as_str()),
            "{wanted} missing from {names:?}"
        );
    }
    for entry in entries {
        assert_eq!(entry["failurePolicy"], "Ignore", "{}", entry["name"]);
        assert_eq!(
            entry["clientConfig"]["service"]["name"],
            "koord-webhook-shadow"
        );
        assert!(entry.get("matchConditions").is_none(), "{}", entry["name"]);
        assert!(
            entry.get("reinvocationPolicy").is_none(),
            "{}",
            entry["name"]
        );
    }
    let role = &objects["ClusterRole//koord-webhook-shadow"];
    for rule in role["rules"].as_array().unwrap() {
        if reads_only(rule) {
            continue;
        }
        let resources = rule["resources"].as_array().unwrap();
        let own_configuration = resources
            == &[serde_json::json!("validatingwebhookconfigurations")]
            && rule["resourceNames"] == serde_json::json!(["koord-webhook-shadow"]);
        let events = resources.iter().all(|r| r == "events");
        assert!(
            own_configuration || events,
            "the shadow's ClusterRole writes {rule}"
        );
    }
    let deployment = &objects["Deployment/koord-webhook-shadow/koord-webhook"];
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--mode=shadow"), "{args}");
}

/// Any other `serve` flag: the chart's `serve:` value and `manifests --serve-flag` give the same
/// Deployment (the flags checked against one table, the binary's own); `extraArgs` and `extraEnv`
/// are added as they are; `manifests` refuses a value `serve` would refuse.
#[test]
fn serve_flags_are_values_of_the_chart_and_flags_of_manifests() {
    let chart = helm_template(
        "koordinator-system",
        &[
            "createNamespace=true",
            "serve.max-amplification-ratio=3",
            "serve.lease-duration=30s",
            "serve.max-request-bytes=8388608",
            "serve.enable-debug-endpoints=true",
            "serve.drain-delay=25s",
        ],
    );
    let binary = manifests(&[
        "--serve-flag=drain-delay=25s",
        "--serve-flag=enable-debug-endpoints=true",
        "--serve-flag=lease-duration=30s",
        "--serve-flag=max-amplification-ratio=3",
        "--serve-flag=max-request-bytes=8388608",
    ]);
    assert!(chart.contains("--max-request-bytes=8388608"), "{chart}");
    // The grace period follows the drain (src/server/shutdown.rs), in both.
    let grace = koord_webhook::server::shutdown::grace_period(Duration::from_secs(25));
    assert!(
        chart.contains(&format!("terminationGracePeriodSeconds: {grace}")),
        "{chart}"
    );
    assert_same_objects(&chart, &binary, "serve flags");

    let extra = helm_template(
        "koordinator-system",
        &[
            "extraArgs={--workers=4}",
            "extraEnv[0].name=KOORD_WEBHOOK_NARROW_HOLD",
            "extraEnv[0].value=60s",
        ],
    );
    assert!(extra.contains("- \"--workers=4\""), "{extra}");
    assert!(extra.contains("name: KOORD_WEBHOOK_NARROW_HOLD"), "{extra}");

    for (flag, message) in [
        ("--serve-flag=lease-duration=soon", "lease-duration"),
        (
            "--serve-flag=cert-mode=external",
            "set from certificates.mode",
        ),
        ("--serve-flag=nope=1", "has no flag --nope"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .args(["manifests", flag])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(message),
            "{flag}: {stderr}"
        );
    }
}

/// What every platform needs from the defaults: no fixed UID or GID, replicas spread over nodes, a
/// ResourceQuota admitting the critical priority class outside kube-system, a PodDisruptionBudget
/// only with more than one replica, and an image pinned by digest when one is given.
#[test]
fn the_chart_defaults_fit_every_platform() {
    let rendered = helm_template("koordinator-system", &["createNamespace=true"]);
    assert!(!rendered.contains("runAsUser") && !rendered.contains("runAsGroup"));
    assert!(
        rendered.contains("podAntiAffinity:")
            && rendered.contains("topologyKey: kubernetes.io/hostname")
    );
    assert!(
        rendered.contains("kind: ResourceQuota") && rendered.contains("scopeName: PriorityClass")
    );
    assert!(rendered.contains("kind: PodDisruptionBudget"));

    let one = helm_template("koordinator-system", &["replicaCount=1"]);
    assert!(
        !one.contains("kind: PodDisruptionBudget"),
        "one replica: no PDB"
    );
    let in_kube_system = helm_template("kube-system", &[]);
    assert!(!in_kube_system.contains("kind: ResourceQuota"));
    let other_class = helm_template("koordinator-system", &["priorityClassName=team-high"]);
    assert!(!other_class.contains("kind: ResourceQuota"));

    let pinned = helm_template(
        "koordinator-system",
        &["image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"],
    );
    assert!(pinned.contains(
        "image: ghcr.io/koord-webhook/koord-webhook@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    ));
    let spread = helm_template(
        "koordinator-system",
        &[
            "topologySpreadConstraints[0].maxSkew=1,topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone,topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        ],
    );
    assert!(
        spread.contains("topologySpreadConstraints:")
            && spread.contains("topology.kubernetes.io/zone")
    );
}

/// `metrics.grafanaDashboard.enabled` renders docs/grafana-dashboard.json as it is, in a ConfigMap
/// with the sidecar's label.
#[test]
fn the_dashboard_ships_in_a_config_map() {
    assert!(!helm_template("koordinator-system", &[]).contains("koord-webhook-dashboard"));
    let rendered = helm_template(
        "koordinator-system",
        &["metrics.grafanaDashboard.enabled=true"],
    );
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let config_map = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "koord-webhook-dashboard")
        .expect("the dashboard ConfigMap");
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: serde_json::Value =
        serde_json::from_str(config_map["data"]["koord-webhook.json"].as_str().unwrap()).unwrap();
    let source: serde_json::Value = serde_json::from_str(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/grafana-dashboard.json"
    )))
    .unwrap();
    assert_eq!(shipped, source);
}

/// Every alert has a runbook_url whose anchor is a section of docs/runbooks.md.
#[test]
fn every_alert_has_a_runbook() {
    let rendered = helm_template(
        "koordinator-system",
        &["metrics.prometheusRule.enabled=true"],
    );
    let runbooks =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/runbooks.md")).unwrap();
    let alerts: Vec<&str> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 6, "{rendered}");
    for alert in alerts {
        let url = format!(
            "runbook_url: https://github.com/koord-webhook/koord-webhook/blob/main/docs/runbooks.md#{}",
            alert.to_lowercase()
        );
        assert!(rendered.contains(&url), "{alert} has no runbook_url");
        assert!(
            runbooks.contains(&format!("\n## {alert}\n")),
            "{alert} has no runbook"
        );
    }
}

/// `helm lint` passes (values.yaml against the schema included) with nothing worse than INFO.
#[test]
fn helm_lint_is_clean() {
    let out = std::process::Command::new(helm())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["lint", "--strict", "charts/koord-webhook"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("[WARNING]") && !text.contains("[ERROR]"),
        "{text}"
    );
}

/// Bad values stop the render with a message rather than installing something else.
#[test]
fn the_chart_refuses_bad_values() {
    for (set, message) in [
        // values.schema.json (src/install/chart_values.rs): a misspelt key, enums, ranges.
        (
            "metrics.serviceMonitr.enabled=true",
            "additional properties 'serviceMonitr' not allowed",
        ),
        (
            "webhooks.timeoutSeconds=31",
            "at '/webhooks/timeoutSeconds': maximum: got 31, want 30",
        ),
        (
            "webhooks.failurePolicy.all=Sometimes",
            "value must be one of 'Fail', 'Ignore'",
        ),
        (
            "webhooks.actions.vpod\\.koordinator\\.sh=Warn",
            "value must be 'Audit'",
        ),
        (
            "replicaCount=0",
            "at '/replicaCount': minimum: got 0, want 1",
        ),
        ("image.digest=latest", "at '/image/digest'"),
        ("mode=dry", "value must be one of 'enforce', 'shadow'"),
        (
            "webhooks.actions.mpod-create\\.koordinator\\.sh=Audit,webhooks.narrowCalls=false",
            "share the rules of /mutate-pod: name them both",
        ),
        (
            "certificates.mode=manual",
            "value must be one of 'self', 'external'",
        ),
        (
            "clientCA.configMap=a,clientCA.secret=b",
            "a configMap or a secret, not both",
        ),
        (
            "serve.cert-mode=external",
            "--cert-mode is set from certificates.mode",
        ),
        (
            "serve.no-such-flag=1",
            "koord-webhook serve has no flag --no-such-flag",
        ),
        (
            "serve.lease-duration={1s,2s}",
            "--lease-duration takes one value",
        ),
        (
            "serve.enable-debug-endpoints=yes",
            "is a switch: true or false",
        ),
        (
            "serve.drain-delay=1500ms",
            "serve.drain-delay: 1500ms: give whole seconds, minutes or hours",
        ),
    ] {
        let out = std::process::Command::new(helm())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "template",
                "koord-webhook",
                "charts/koord-webhook",
                "--set",
                set,
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(message),
            "{set}: {stderr}"
        );
    }
}

/// The chart's version and appVersion are the binary's.
#[test]
fn the_chart_version_is_the_crate_version() {
    let chart = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/koord-webhook/Chart.yaml"),
    )
    .unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        chart.contains(&format!("\nversion: {version}\n")),
        "{chart}"
    );
    assert!(
        chart.contains(&format!("\nappVersion: \"{version}\"\n")),
        "{chart}"
    );
}

/// The chart's `kubeVersion` floor is the oldest version of docs/compatibility.md's matrix, and every
/// version there has its module (`tests/control-plane/kubernetes-<minor>`, or the default module's).
#[test]
fn the_chart_accepts_the_versions_the_matrix_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let chart = std::fs::read_to_string(root.join("charts/koord-webhook/Chart.yaml")).unwrap();
    let floor = chart
        .lines()
        .find_map(|l| l.strip_prefix("kubeVersion: \">="))
        .and_then(|v| {
            v.split('.')
                .take(2)
                .map(str::to_owned)
                .reduce(|a, b| format!("{a}.{b}"))
        })
        .expect("a kubeVersion floor in Chart.yaml");
    let table = std::fs::read_to_string(root.join("docs/compatibility.md")).unwrap();
    let header = table
        .lines()
        .find(|l| l.starts_with("| area (tests) |"))
        .expect("the matrix's header in docs/compatibility.md");
    let minors: Vec<String> = header
        .split('|')
        .skip(2)
        .map(|c| c.trim().split('.').take(2).collect::<Vec<_>>().join("."))
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        minors.first(),
        Some(&floor),
        "{header} against kubeVersion >={floor}"
    );
    let default = std::fs::read_to_string(root.join("tests/control-plane/go.mod")).unwrap();
    for minor in &minors {
        let module = root.join(format!("tests/control-plane/kubernetes-{minor}/go.mod"));
        assert!(
            module.exists() || default.contains(&format!("k8s.io/kubernetes v{minor}.")),
            "docs/compatibility.md tests {minor}, but no module builds it"
        );
    }
}

/// `manifests` with entry settings: the configurations carry them, and so do the Deployment's
/// `serve` flags (so a configuration the operator re-creates has them too); a bad one is exit 1
/// with one line naming the entries there are.
#[test]
fn manifests_take_failure_policy_timeout_and_excluded_namespaces() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .arg("manifests")
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "--failure-policy",
        "vpod.koordinator.sh=Ignore",
        "--webhook-timeout-seconds",
        "5",
        "--exclude-namespace",
        "batch-jobs",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_slice(&out.stdout)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let validating = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .unwrap();
    let vpod = validating["webhooks"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "vpod.koordinator.sh")
        .unwrap();
    assert_eq!(vpod["failurePolicy"], "Ignore");
    assert_eq!(vpod["timeoutSeconds"], 5);
    let excluded = &vpod["namespaceSelector"]["matchExpressions"][0]["values"];
    assert!(
        excluded
            .as_sequence()
            .unwrap()
            .iter()
            .any(|v| v == "batch-jobs"),
        "{excluded:?}"
    );
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let args =
        serde_yaml::to_string(&deployment["spec"]["template"]["spec"]["containers"][0]["args"])
            .unwrap();
    for flag in [
        "--failure-policy=vpod.koordinator.sh=Ignore",
        "--webhook-timeout-seconds=5",
        "--exclude-namespace=batch-jobs",
    ] {
        assert!(args.contains(flag), "{flag} not in {args}");
    }
    let bad = run(&["--failure-policy", "vpods=Ignore"]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("vpod.koordinator.sh"), "{stderr}");

    // An entry in Audit is written with Ignore, whatever its failurePolicy says.
    let out = run(&[
        "--failure-policy=all=Fail",
        "--entry-action=vconfigmap.koordinator.sh=Audit",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let configmap_entry = text
        .split("- admissionReviewVersions")
        .find(|entry| entry.contains("name: vconfigmap.koordinator.sh"))
        .unwrap();
    assert!(
        configmap_entry.contains("failurePolicy: Ignore"),
        "{configmap_entry}"
    );
    let half = run(&[
        "--narrow-calls=off",
        "--entry-action=mpod-create.koordinator.sh=Audit",
    ]);
    assert!(!half.status.success());
    let stderr = String::from_utf8_lossy(&half.stderr);
    assert!(stderr.contains("name them all"), "{stderr}");
}
