//! Least-privilege RBAC.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::ObjectMeta;

use crate::names::{
    APP_NAME, CA_ADOPTION_RECORD, KOORDINATOR_CA_SECRET, LEASE, MUTATING_CONFIGURATION,
    QUOTA_LEDGER, SECRET_CA, SECRET_TLS, VALIDATING_CONFIGURATION, app_labels, namespace,
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

pub fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(APP_NAME, None),
        rules: Some(vec![
            // The cache: cluster-wide reads of the kinds admission consults.
            rule(&["scheduling.sigs.k8s.io"], &["elasticquotas"], READ, &[]),
            // Quota evaluation writes the child-request annotation.
            rule(
                &["scheduling.sigs.k8s.io"],
                &["elasticquotas"],
                &["patch", "update"],
                &[],
            ),
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
            // Its own two webhook configurations only: watched by name, created when missing by
            // server-side apply (authorised with the name), their caBundles kept up to date.
            rule(
                &["admissionregistration.k8s.io"],
                &[
                    "mutatingwebhookconfigurations",
                    "validatingwebhookconfigurations",
                ],
                &["get", "list", "watch", "create", "update", "patch"],
                &[MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION],
            ),
        ]),
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

pub fn cluster_role_binding() -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(APP_NAME, None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: APP_NAME.to_owned(),
        },
        subjects: Some(subject()),
    }
}

pub fn role() -> Role {
    Role {
        metadata: meta(APP_NAME, Some(namespace())),
        rules: Some(vec![
            // Its two Secrets only. Secrets are written by server-side apply, whose create is
            // authorised with the object's name, so create is limited by name too.
            rule(
                &[""],
                &["secrets"],
                &["get", "list", "watch", "create", "update", "patch"],
                &[SECRET_TLS, SECRET_CA],
            ),
            // koord-manager's webhook Secret, read once on first start to take over its CA.
            rule(&[""], &["secrets"], &["get"], &[KOORDINATOR_CA_SECRET]),
            // The SLO and enhanced-validator ConfigMaps live here (list and watch cannot be limited
            // by name; get of the two is what the cache reads).
            rule(&[""], &["configmaps"], &["list", "watch"], &[]),
            rule(
                &[""],
                &["configmaps"],
                &["get"],
                &[
                    crate::admission::settings::DEFAULT_SLO_CONFIG_NAME,
                    crate::admission::settings::DEFAULT_ENHANCED_VALIDATOR_CONFIG,
                    QUOTA_LEDGER,
                    CA_ADOPTION_RECORD,
                ],
            ),
            // The ElasticQuota ledger and the record of a CA taken over, created by server-side
            // apply.
            rule(
                &[""],
                &["configmaps"],
                &["create", "update", "patch"],
                &[QUOTA_LEDGER, CA_ADOPTION_RECORD],
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
        ]),
    }
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
