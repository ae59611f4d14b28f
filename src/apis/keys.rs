//! Label and annotation names the webhooks read and write.

/// Prefix of every ElasticQuota label and annotation.
pub const QUOTA_PREFIX: &str = "quota.scheduling.koordinator.sh/";

pub const QUOTA_PARENT: &str = "quota.scheduling.koordinator.sh/parent";
pub const QUOTA_IS_PARENT: &str = "quota.scheduling.koordinator.sh/is-parent";
pub const QUOTA_ALLOW_LENT_RESOURCE: &str = "quota.scheduling.koordinator.sh/allow-lent-resource";
pub const QUOTA_NAME: &str = "quota.scheduling.koordinator.sh/name";
pub const QUOTA_TREE_ID: &str = "quota.scheduling.koordinator.sh/tree-id";
pub const QUOTA_NAMESPACES: &str = "quota.scheduling.koordinator.sh/namespaces";
/// The token of an API-server probe (`admission/elastic_quota/ledger/probe.rs`).
pub const PROBE_ANNOTATION: &str = "koord-webhook.koordinator.sh/api-server-probe";
pub const QUOTA_GUARANTEED: &str = "quota.scheduling.koordinator.sh/guaranteed";
/// What the quota's admitted pods request, as Koordinator's quota admission records it.
pub const CHILD_REQUEST: &str = "quota.scheduling.koordinator.sh/child-request";
/// How much of the quota pods may request (its max when absent or empty).
pub const ADMISSION_LIMIT: &str = "quota.scheduling.koordinator.sh/admission";

/// Prefix of koord-webhook's own annotations.
pub const OWN_PREFIX: &str = "koord-webhook/";
/// A quota's recent admissions, written by pod admission and the recount (koord-webhook's own).
pub const QUOTA_RECENT_ADMISSIONS: &str = "koord-webhook/child-request-recent";

pub const ROOT_QUOTA: &str = "koordinator-root-quota";
pub const SYSTEM_QUOTA: &str = "koordinator-system-quota";
pub const DEFAULT_QUOTA: &str = "koordinator-default-quota";

pub const QOS_CLASS_LABEL: &str = "koordinator.sh/qosClass";
pub const PRIORITY_LABEL: &str = "koordinator.sh/priority";
pub const PRIORITY_CLASS_LABEL: &str = "koordinator.sh/priority-class";
pub const SLO_CONFIGMAP_TYPE_LABEL: &str = "koordinator.sh/configmap-type";
pub const MUTATING_UPDATE_LABEL: &str = "pod.koordinator.sh/mutating-update";

pub const AMPLIFICATION_RATIO: &str = "node.koordinator.sh/resource-amplification-ratio";
pub const RAW_ALLOCATABLE: &str = "node.koordinator.sh/raw-allocatable";
pub const RAW_CAPACITY: &str = "node.koordinator.sh/raw-capacity";

pub const SKIP_UPDATE_RESOURCES: &str = "config.koordinator.sh/skip-update-resources";
pub const EXTENDED_RESOURCE_SPEC: &str = "node.koordinator.sh/extended-resource-spec";
pub const RESERVATION_AFFINITY: &str = "scheduling.koordinator.sh/reservation-affinity";
pub const SKIP_ENHANCED_VALIDATION: &str = "pod.koordinator.sh/skip-enhanced-validation";

pub const BATCH_CPU: &str = "kubernetes.io/batch-cpu";
pub const BATCH_MEMORY: &str = "kubernetes.io/batch-memory";
pub const MID_CPU: &str = "kubernetes.io/mid-cpu";
pub const MID_MEMORY: &str = "kubernetes.io/mid-memory";

pub const GPU: &str = "koordinator.sh/gpu";
pub const GPU_CORE: &str = "koordinator.sh/gpu-core";
pub const GPU_MEMORY: &str = "koordinator.sh/gpu-memory";
pub const GPU_MEMORY_RATIO: &str = "koordinator.sh/gpu-memory-ratio";
pub const GPU_SHARED: &str = "koordinator.sh/gpu.shared";
pub const NPU_CORE: &str = "huawei.com/npu-core";
