//! Least-privilege RBAC.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::ObjectMeta;

use crate::names::{
    APP_NAME, CA_ADOPTION_RECORD, KOORDINATOR_CA_SECRET, LEASE, Mode, QUOTA_LEDGER, SECRET_CA,
    SECRET_TLS, app_labels, namespace,
};

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(app_labels()),
        ..Default::default()
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        resource_names: (!names.is_empty()).then(|| strings(names)),
        non_resource_urls: None,
    }
}

const READ: &[&str] = &["get", "list", "watch"];

pub fn service_account() -> ServiceAccount {
    ServiceAccount {
        metadata: meta(APP_NAME, Some(namespace())),
        ..Default::default()
    }
}

pub fn cluster_role(mode: Mode) -> ClusterRole {
    let configurations: Vec<&str> = mode.configurations().iter().map(|(_, n)| *n).collect();
    let kinds: &[&str] = match mode {
        Mode::Enforce => &[
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations",
        ],
        Mode::Shadow => &["validatingwebhookconfigurations"],
    };
    let mut rules = vec![
        // The cache: cluster-wide reads of the kinds admission consults.
        rule(&["scheduling.sigs.k8s.io"], &["elasticquotas"], READ, &[]),
        rule(
            &["quota.koordinator.sh"],
            &["elasticquotaprofiles"],
            READ,
            &[],
        ),
        rule(&["scheduling.koordinator.sh"], &["reservations"], READ, &[]),
        rule(
            &["config.koordinator.sh"],
            &["clustercolocationprofiles"],
            READ,
            &[],
        ),
        rule(&[""], &["namespaces", "nodes", "pods"], READ, &[]),
        rule(&["scheduling.k8s.io"], &["priorityclasses"], READ, &[]),
        // Events about its webhook configurations: cluster-scoped objects, so their Events
        // live in the `default` namespace.
        rule(
            &["", "events.k8s.io"],
            &["events"],
            &["create", "patch"],
            &[],
        ),
        // Its own webhook configurations only: watched by name, created when missing by
        // server-side apply (authorised with the name), their caBundles kept up to date.
        rule(
            &["admissionregistration.k8s.io"],
            kinds,
            &["get", "list", "watch", "create", "update", "patch"],
            &configurations,
        ),
    ];
    // Quota evaluation writes the child-request annotation; a shadow writes nothing of
    // Koordinator's (and the API server would refuse it if it tried).
    if mode == Mode::Enforce {
        let quota_writes = rule(
            &["scheduling.sigs.k8s.io"],
            &["elasticquotas"],
            &["patch", "update"],
            &[],
        );
        rules.insert(1, quota_writes);
    }
    ClusterRole {
        metadata: meta(mode.cluster_scoped_name(), None),
        rules: Some(rules),
        aggregation_rule: None,
    }
}

fn subject() -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".to_owned(),
        name: APP_NAME.to_owned(),
        namespace: Some(namespace().to_owned()),
        api_group: None,
    }]
}

pub fn cluster_role_binding(mode: Mode) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(mode.cluster_scoped_name(), None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: mode.cluster_scoped_name().to_owned(),
        },
        subjects: Some(subject()),
    }
}

pub fn role(mode: Mode) -> Role {
    let mut rules = vec![
        // Its two Secrets only. Secrets are written by server-side apply, whose create is
        // authorised with the object's name, so create is limited by name too.
        rule(
            &[""],
            &["secrets"],
            &["get", "list", "watch", "create", "update", "patch"],
            &[SECRET_TLS, SECRET_CA],
        ),
    ];
    // The SLO and enhanced-validator ConfigMaps live here, and its own two.
    rules.extend(config_map_reads(&[QUOTA_LEDGER, CA_ADOPTION_RECORD]));
    rules.extend([
        // The ElasticQuota ledger and the record of a CA taken over, created by server-side
        // apply.
        rule(
            &[""],
            &["configmaps"],
            &["create", "update", "patch"],
            &[QUOTA_LEDGER, CA_ADOPTION_RECORD],
        ),
        // The API-server probe (`ledger/probe.rs`): dry-run applies of one ElasticQuota name in
        // this namespace, never stored; an apply's create is authorised with the name.
        rule(
            &["scheduling.sigs.k8s.io"],
            &["elasticquotas"],
            &["create", "patch"],
            &[crate::names::PROBE_NAME],
        ),
        // The Lease: created by the first replica (a plain create, which RBAC cannot limit by
        // name), then renewed by name.
        rule(&["coordination.k8s.io"], &["leases"], &["create"], &[]),
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "update", "patch"],
            &[LEASE],
        ),
        rule(
            &["", "events.k8s.io"],
            &["events"],
            &["create", "patch"],
            &[],
        ),
    ]);
    // koord-manager's webhook Secret, read once on first start to take over its CA; a shadow has
    // a CA of its own.
    if mode == Mode::Enforce {
        rules.insert(
            1,
            rule(&[""], &["secrets"], &["get"], &[KOORDINATOR_CA_SECRET]),
        );
    }
    Role {
        metadata: meta(APP_NAME, Some(namespace())),
        rules: Some(rules),
    }
}

/// Reads of the ConfigMaps the rules read (list and watch cannot be limited by name; get is, to
/// the SLO and enhanced-validator ones and `more`).
fn config_map_reads(more: &[&str]) -> [PolicyRule; 2] {
    let mut named = vec![
        crate::admission::settings::DEFAULT_SLO_CONFIG_NAME,
        crate::admission::settings::DEFAULT_ENHANCED_VALIDATOR_CONFIG,
    ];
    named.extend(more);
    [
        rule(&[""], &["configmaps"], &["list", "watch"], &[]),
        rule(&[""], &["configmaps"], &["get"], &named),
    ]
}

/// A shadow's reads of Koordinator's ConfigMaps (the SLO and enhanced-validator ones) in the
/// namespace they live in (`--config-namespace`, Koordinator's by default), which is not its own:
/// a Role and RoleBinding of its own name there. None when enforcing (they live in its namespace,
/// which [`role`] covers).
pub fn config_reader(mode: Mode, config_namespace: &str) -> Option<(Role, RoleBinding)> {
    if mode == Mode::Enforce {
        return None;
    }
    let name = mode.cluster_scoped_name();
    let role = Role {
        metadata: meta(name, Some(config_namespace)),
        rules: Some(config_map_reads(&[]).to_vec()),
    };
    let binding = RoleBinding {
        metadata: meta(name, Some(config_namespace)),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "Role".to_owned(),
            name: name.to_owned(),
        },
        subjects: Some(subject()),
    };
    Some((role, binding))
}

pub fn role_binding() -> RoleBinding {
    RoleBinding {
        metadata: meta(APP_NAME, Some(namespace())),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "Role".to_owned(),
            name: APP_NAME.to_owned(),
        },
        subjects: Some(subject()),
    }
}
