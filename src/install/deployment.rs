//! Deployment, Service, PodDisruptionBudget and the ResourceQuota that admits its priority class.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceFieldSelector, ResourceQuota,
    ResourceQuotaSpec, ResourceRequirements, ScopeSelector, ScopedResourceSelectorRequirement,
    SeccompProfile, SecretVolumeSource, SecurityContext, Service, ServicePort, ServiceSpec, Volume,
    VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;

use super::options::{ClientCaMount, ClientCaObject, InstallOptions};
use crate::names::{APP_NAME, Mode, SELECTOR_LABEL, app_labels, namespace};

const PORT: i32 = 9443;
const METRICS_PORT: i32 = 8080;
const HEALTH_PORT: i32 = 8081;

fn selector_labels() -> BTreeMap<String, String> {
    [(SELECTOR_LABEL.to_owned(), APP_NAME.to_owned())].into()
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace().to_owned()),
        labels: Some(app_labels()),
        ..Default::default()
    }
}

/// Probes go to the probe port (`--health-bind-address`, plain HTTP), which nothing else can
/// starve and which works when the admission port requires client certificates
/// (`--client-ca-file`). `period` x `failures` is how long a replica that stopped answering keeps
/// its place.
fn probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("health".to_owned()),
            scheme: Some("HTTP".to_owned()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                api_version: None,
            }),
            ..Default::default()
        }),
        value: None,
    }
}

fn quantities(cpu: &str, memory: &str) -> BTreeMap<String, Quantity> {
    [
        ("cpu".to_owned(), Quantity(cpu.to_owned())),
        ("memory".to_owned(), Quantity(memory.to_owned())),
    ]
    .into()
}

pub fn deployment(options: &InstallOptions) -> Deployment {
    let client_ca_volume = client_ca_volume(options);
    let container = container(options, client_ca_volume.as_ref());
    Deployment {
        metadata: meta(APP_NAME),
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(selector_labels()),
                match_expressions: None,
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(app_labels()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(APP_NAME.to_owned()),
                    containers: vec![container],
                    // Non-root by the image's numeric USER (65532) and runAsNonRoot, with no fixed
                    // UID or GID: OpenShift's restricted SCC assigns its own.
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_owned(),
                            localhost_profile: None,
                        }),
                        ..Default::default()
                    }),
                    // Longer than the drain, the Lease's release and requests in flight.
                    termination_grace_period_seconds: Some(
                        options.termination_grace_period_seconds,
                    ),
                    priority_class_name: Some(CRITICAL_PRIORITY_CLASS.to_owned()),
                    affinity: Some(spread_over_nodes()),
                    volumes: client_ca_volume.map(|v| vec![v]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// `serve`'s arguments: the port, the gates and entry policy, the client CA, then `--serve-flag`s.
fn args(options: &InstallOptions) -> Vec<String> {
    let mut args = vec!["serve".to_owned(), format!("--port={PORT}")];
    let overrides = options.gates.overrides();
    if !overrides.is_empty() {
        args.push(format!("--feature-gates={overrides}"));
    }
    args.extend(options.target.policy.args());
    if let Some(ca) = &options.client_ca {
        args.push(format!("--client-ca-file={}", ca.file()));
    }
    args.extend(options.serve_args.iter().cloned());
    args
}

/// The client CA's volume, when callers are authenticated. Mounted whole (no subPath), so the
/// kubelet's updates reach the file and the replica re-reads it.
fn client_ca_volume(options: &InstallOptions) -> Option<Volume> {
    options.client_ca.as_ref().map(|ca| {
        let items = Some(vec![KeyToPath {
            key: ca.key.clone(),
            path: ca.key.clone(),
            mode: None,
        }]);
        Volume {
            name: "client-ca".to_owned(),
            config_map: match &ca.object {
                ClientCaObject::ConfigMap(name) => Some(ConfigMapVolumeSource {
                    name: name.clone(),
                    items: items.clone(),
                    ..Default::default()
                }),
                ClientCaObject::Secret(_) => None,
            },
            secret: match &ca.object {
                ClientCaObject::Secret(name) => Some(SecretVolumeSource {
                    secret_name: Some(name.clone()),
                    items,
                    ..Default::default()
                }),
                ClientCaObject::ConfigMap(_) => None,
            },
            ..Default::default()
        }
    })
}

/// The one container: ports, environment, probes, resources, a locked-down security context.
fn container(options: &InstallOptions, client_ca_volume: Option<&Volume>) -> Container {
    Container {
        name: APP_NAME.to_owned(),
        image: Some(options.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        args: Some(args(options)),
        ports: Some(vec![
            ContainerPort {
                name: Some("https".to_owned()),
                container_port: PORT,
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            },
            // The plain-HTTP operations port (`--metrics-bind-address`, default :8080): /metrics.
            ContainerPort {
                name: Some("metrics".to_owned()),
                container_port: METRICS_PORT,
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            },
            // The probes' own port (`--health-bind-address`, default :8081).
            ContainerPort {
                name: Some("health".to_owned()),
                container_port: HEALTH_PORT,
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            },
        ]),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            EnvVar {
                name: "RUST_LOG".to_owned(),
                value: Some("info".to_owned()),
                value_from: None,
            },
            // The memory reviews may take once decoded is derived from the limit.
            EnvVar {
                name: "KOORD_WEBHOOK_MEMORY_LIMIT".to_owned(),
                value: None,
                value_from: Some(EnvVarSource {
                    resource_field_ref: Some(ResourceFieldSelector {
                        container_name: Some("koord-webhook".to_owned()),
                        resource: "limits.memory".to_owned(),
                        divisor: None,
                    }),
                    ..Default::default()
                }),
            },
        ]),
        // Restarted after 30 s without an answer; out of the Service after about 4 s: with
        // failurePolicy Fail, every call the API server sends a hung replica fails after its
        // timeout, so it must leave the endpoints quickly.
        liveness_probe: Some(probe("/healthz", 10, 3)),
        readiness_probe: Some(probe("/readyz", 2, 2)),
        resources: Some(ResourceRequirements {
            requests: Some(quantities("100m", "128Mi")),
            limits: Some(quantities("1", "384Mi")),
            claims: None,
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            ..Default::default()
        }),
        volume_mounts: client_ca_volume.map(|v| {
            vec![VolumeMount {
                name: v.name.clone(),
                mount_path: ClientCaMount::DIR.to_owned(),
                read_only: Some(true),
                ..Default::default()
            }]
        }),
        ..Default::default()
    }
}

/// The replicas' priority class: admission is part of the control plane's availability.
pub const CRITICAL_PRIORITY_CLASS: &str = "system-cluster-critical";

/// Replicas preferably on different nodes: a node drained or lost takes one, not both (with
/// `failurePolicy: Fail`, losing both fails every call). Preferred, so one node still runs two.
fn spread_over_nodes() -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(LabelSelector {
                            match_labels: Some(selector_labels()),
                            match_expressions: None,
                        }),
                        topology_key: "kubernetes.io/hostname".to_owned(),
                        ..Default::default()
                    },
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The name of the ResourceQuota that admits the critical priority class.
pub const CRITICAL_PODS_QUOTA: &str = "koord-webhook-critical-pods";

/// Admits pods of the critical priority class in the release namespace: clusters that keep
/// `system-cluster-critical` to `kube-system` (GKE's default admission configuration) refuse such
/// pods elsewhere unless a ResourceQuota scoped to the class allows them.
pub fn critical_pods_quota() -> ResourceQuota {
    ResourceQuota {
        metadata: meta(CRITICAL_PODS_QUOTA),
        spec: Some(ResourceQuotaSpec {
            hard: Some([("pods".to_owned(), Quantity("10".to_owned()))].into()),
            scope_selector: Some(ScopeSelector {
                match_expressions: Some(vec![ScopedResourceSelectorRequirement {
                    operator: "In".to_owned(),
                    scope_name: "PriorityClass".to_owned(),
                    values: Some(vec![CRITICAL_PRIORITY_CLASS.to_owned()]),
                }]),
            }),
            scopes: None,
        }),
        status: None,
    }
}

/// The component label of the admission Service: a migration applies everything else first
/// (`kubectl apply -l 'app.kubernetes.io/component!=webhook-service'`), then the Service.
pub const SERVICE_COMPONENT: &str = "webhook-service";

pub fn service(mode: Mode) -> Service {
    let mut metadata = meta(mode.service_name());
    if let Some(labels) = metadata.labels.as_mut() {
        labels.insert(
            "app.kubernetes.io/component".to_owned(),
            SERVICE_COMPONENT.to_owned(),
        );
    }
    Service {
        metadata,
        spec: Some(ServiceSpec {
            selector: Some(selector_labels()),
            ports: Some(vec![ServicePort {
                name: Some("https".to_owned()),
                port: 443,
                target_port: Some(IntOrString::String("https".to_owned())),
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

pub fn pod_disruption_budget() -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(APP_NAME),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels()),
                match_expressions: None,
            }),
            ..Default::default()
        }),
        status: None,
    }
}
