//! Label and annotation names the webhooks read and write (spec/admission.md section 11).

/// Prefix of every ElasticQuota label and annotation.
pub const QUOTA_PREFIX: &str = "quota.scheduling.koordinator.sh/";

pub const QUOTA_PARENT: &str = "quota.scheduling.koordinator.sh/parent";
pub const QUOTA_IS_PARENT: &str = "quota.scheduling.koordinator.sh/is-parent";
pub const QUOTA_ALLOW_LENT_RESOURCE: &str = "quota.scheduling.koordinator.sh/allow-lent-resource";
pub const QUOTA_NAME: &str = "quota.scheduling.koordinator.sh/name";
pub const QUOTA_TREE_ID: &str = "quota.scheduling.koordinator.sh/tree-id";
pub const QUOTA_NAMESPACES: &str = "quota.scheduling.koordinator.sh/namespaces";

pub const ROOT_QUOTA: &str = "koordinator-root-quota";
pub const SYSTEM_QUOTA: &str = "koordinator-system-quota";
pub const DEFAULT_QUOTA: &str = "koordinator-default-quota";

pub const QOS_CLASS_LABEL: &str = "koordinator.sh/qosClass";
pub const PRIORITY_LABEL: &str = "koordinator.sh/priority";
pub const PRIORITY_CLASS_LABEL: &str = "koordinator.sh/priority-class";
pub const SLO_CONFIGMAP_TYPE_LABEL: &str = "koordinator.sh/configmap-type";
pub const MUTATING_UPDATE_LABEL: &str = "pod.koordinator.sh/mutating-update";
