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

/// Which install this process belongs to (`--mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// In front of Koordinator's objects under Koordinator's names: a drop-in for koord-manager's
    /// webhook, which it replaces (docs/migration.md).
    #[default]
    Enforce,
    /// Beside koord-manager's webhook, to try koord-webhook first: its own namespace, names and CA,
    /// one validating configuration, every rule in Audit, `failurePolicy: Ignore`, and no write to
    /// anything of Koordinator's (docs/migration.md, "Step 0: a trial beside koord-manager").
    Shadow,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }

    /// Where the install lives unless told otherwise.
    pub fn default_namespace(self) -> &'static str {
        match self {
            Mode::Enforce => DEFAULT_NAMESPACE,
            Mode::Shadow => SHADOW,
        }
    }

    /// `--namespace` when given, else [`Mode::default_namespace`].
    pub fn namespace_or(self, given: Option<&str>) -> &str {
        given.unwrap_or(self.default_namespace())
    }
}

/// The shadow install's name for everything cluster-wide it owns (its configuration, Service,
/// ClusterRole) and its default namespace.
pub const SHADOW: &str = "koord-webhook-shadow";

/// The names an install of each mode gives what it owns.
impl Mode {
    /// The Service the webhook configuration points at.
    pub fn service_name(self) -> &'static str {
        match self {
            Mode::Enforce => SERVICE_NAME,
            Mode::Shadow => SHADOW,
        }
    }

    /// The mutating configuration the install keeps: none in a shadow (its validating entries see
    /// the object koord-manager's mutation made, which is what a trial compares with).
    pub fn mutating_configuration(self) -> Option<&'static str> {
        match self {
            Mode::Enforce => Some(MUTATING_CONFIGURATION),
            Mode::Shadow => None,
        }
    }

    /// The validating configuration the install keeps (a shadow's holds every entry).
    pub fn validating_configuration(self) -> &'static str {
        match self {
            Mode::Enforce => VALIDATING_CONFIGURATION,
            Mode::Shadow => SHADOW,
        }
    }

    /// The configurations the install keeps, as (kind, name).
    pub fn configurations(self) -> Vec<(&'static str, &'static str)> {
        let mutating = self
            .mutating_configuration()
            .map(|name| ("MutatingWebhookConfiguration", name));
        mutating
            .into_iter()
            .chain([(
                "ValidatingWebhookConfiguration",
                self.validating_configuration(),
            )])
            .collect()
    }

    /// Where Koordinator's ConfigMaps the rules read live unless `--config-namespace` says: the
    /// install's own namespace when enforcing (it replaces koord-manager's webhook there),
    /// Koordinator's default one in a shadow (which lives in a namespace of its own).
    pub fn config_namespace(self) -> &'static str {
        match self {
            Mode::Enforce => namespace(),
            Mode::Shadow => DEFAULT_NAMESPACE,
        }
    }

    /// The ClusterRole and ClusterRoleBinding's name.
    pub fn cluster_scoped_name(self) -> &'static str {
        match self {
            Mode::Enforce => APP_NAME,
            Mode::Shadow => SHADOW,
        }
    }

    /// An entry's name as the install registers it: the table's (Koordinator's) when enforcing;
    /// in a shadow its first label under [`SHADOW_ENTRY_DOMAIN`], so the API server's webhook
    /// metrics (labelled by entry name) keep koord-manager's calls and the shadow's apart.
    pub fn entry_name(self, table_name: &str) -> String {
        match self {
            Mode::Enforce => table_name.to_owned(),
            Mode::Shadow => {
                let first = table_name.split('.').next().unwrap_or(table_name);
                format!("{first}.{SHADOW_ENTRY_DOMAIN}")
            }
        }
    }
}

/// The domain of a shadow's entry names.
pub const SHADOW_ENTRY_DOMAIN: &str = "shadow.koord-webhook.io";
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
/// The ElasticQuota every API-server probe names, in this namespace; never stored (a dry run:
/// `admission/elastic_quota/ledger/probe.rs`).
pub const PROBE_NAME: &str = "koord-webhook-probe";

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
