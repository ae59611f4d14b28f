//! Who koord-webhook is in a cluster: the names of the objects it runs as and manages. The install
//! manifests, the operator, the admission settings and the CLI all read them here, so that a name
//! changes in one place (and Koordinator's own names stay, for a drop-in migration).

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Where the replicas, their Secrets, Lease and ConfigMaps live unless told otherwise (Koordinator's).
pub const DEFAULT_NAMESPACE: &str = "koordinator-system";

static NAMESPACE: OnceLock<String> = OnceLock::new();

/// The namespace of koord-webhook's own objects: set once at start (`serve` from its Pod's
/// namespace, `manifests`/`status`/`uninstall` from `--namespace`), else [`DEFAULT_NAMESPACE`]. One
/// value per process rather than a parameter threaded through every writer: everything the process
/// names lives there and it cannot change while the process runs.
pub fn namespace() -> &'static str {
    NAMESPACE.get().map_or(DEFAULT_NAMESPACE, String::as_str)
}

/// Sets [`namespace`]; the first call wins (a second one with another value is a bug, reported).
pub fn set_namespace(namespace: &str) -> Result<(), String> {
    let set = NAMESPACE.get_or_init(|| namespace.to_owned());
    if set == namespace {
        Ok(())
    } else {
        Err(format!("namespace already set to {set}, not {namespace}"))
    }
}

/// An RFC 1123 label: a namespace name, or one part of a DNS subdomain.
pub fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

/// A namespace name as the API server accepts it (an RFC 1123 label).
pub fn parse_namespace(text: &str) -> Result<String, String> {
    if is_dns_label(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a namespace name (lower-case letters, digits and '-', at most 63)"
        ))
    }
}
pub const APP_NAME: &str = "koord-webhook";

/// The user name the API server gives the replicas' requests: their ServiceAccount's (the chart
/// and `manifests` name it after the app, in the install's namespace).
pub fn service_account_user() -> String {
    format!("system:serviceaccount:{}:{APP_NAME}", namespace())
}
/// The Service the webhook configurations point at (Koordinator's name).
pub const SERVICE_NAME: &str = "koordinator-webhook-service";
/// The label that selects the replicas (Deployment, Service, PodDisruptionBudget).
pub const SELECTOR_LABEL: &str = "app.kubernetes.io/name";

/// The webhook configurations (Koordinator's names).
pub const MUTATING_CONFIGURATION: &str = "koordinator-mutating-webhook-configuration";
pub const VALIDATING_CONFIGURATION: &str = "koordinator-validating-webhook-configuration";

/// The serving pair and the CA bundle the replicas serve.
pub const SECRET_TLS: &str = "webhook-tls";
/// The CA (and, during a rotation, the previous one).
pub const SECRET_CA: &str = "webhook-ca";
/// koord-manager's webhook Secret, whose CA koord-webhook takes over on first start (certs::adopt).
pub const KOORDINATOR_CA_SECRET: &str = "koordinator-webhook-certs";
/// Records that koord-manager's CA was taken over, so that it is taken over once per installation
/// (deleting our Secrets after a key leak must not bring the same CA back). Removed by `uninstall`.
pub const CA_ADOPTION_RECORD: &str = "koord-webhook-ca-adoption";
/// The leader election Lease.
pub const LEASE: &str = "koord-webhook";
/// The ConfigMap through which replicas admit ElasticQuota changes one at a time.
pub const QUOTA_LEDGER: &str = "koord-webhook-quota-ledger";

/// The field manager of the operator's writes, and the managed-by label of what it creates.
pub const FIELD_MANAGER: &str = "koord-webhook";

/// Create and replace parameters naming [`FIELD_MANAGER`], so every write of the operator shows as
/// koord-webhook's in `managedFields`.
pub fn post_params() -> kube::api::PostParams {
    kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    }
}
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "koord-webhook");

/// `SELECTOR_LABEL=APP_NAME`, as a label selector string.
pub fn selector() -> String {
    format!("{SELECTOR_LABEL}={APP_NAME}")
}

/// The labels of every object the install creates.
pub fn app_labels() -> BTreeMap<String, String> {
    [
        (SELECTOR_LABEL.to_owned(), APP_NAME.to_owned()),
        (
            "app.kubernetes.io/part-of".to_owned(),
            "koordinator".to_owned(),
        ),
    ]
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_rfc_1123_labels() {
        for good in ["koordinator-system", "a", "team-1"] {
            assert_eq!(parse_namespace(good).as_deref(), Ok(good));
        }
        for bad in ["", "Koord", "-a", "a-", "a_b", "a.b", &"x".repeat(64)] {
            assert!(parse_namespace(bad).is_err(), "{bad:?} accepted");
        }
    }
}
