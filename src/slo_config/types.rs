//! The slo-controller-config data keys as Rust types: the fields the webhook validates, plus the node
//! strategy profile (name and selector). Unknown fields are ignored, as Go's decoder does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;

use crate::resources::Qty;

/// Name and selector of one node strategy.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeCfgProfile {
    #[serde(default)]
    pub name: String,
    pub node_selector: Option<LabelSelector>,
}

/// A node strategy: the profile and the strategy fields inline.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
pub struct NodeStrategy<S> {
    #[serde(flatten)]
    pub profile: NodeCfgProfile,
    #[serde(flatten)]
    pub strategy: S,
}

/// `colocation-config`: the cluster strategy inline at the top level, node overrides in `nodeConfigs`.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ColocationCfg {
    #[serde(flatten)]
    pub strategy: ColocationStrategy,
    #[serde(default)]
    pub node_configs: Vec<NodeStrategy<ColocationStrategy>>,
}

#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ColocationStrategy {
    pub enable: Option<bool>,
    pub metric_aggregate_duration_seconds: Option<i64>,
    pub metric_report_interval_seconds: Option<i64>,
    #[serde(rename = "cpuReclaimThresholdPercent")]
    pub cpu_reclaim_threshold_percent: Option<i64>,
    pub memory_reclaim_threshold_percent: Option<i64>,
    pub degrade_time_minutes: Option<i64>,
    pub update_time_threshold_seconds: Option<i64>,
    pub resource_diff_threshold: Option<f64>,
    #[serde(rename = "midCPUThresholdPercent")]
    pub mid_cpu_threshold_percent: Option<i64>,
    pub mid_memory_threshold_percent: Option<i64>,
    pub mid_unallocated_percent: Option<i64>,
    #[serde(rename = "midStaticCPUReservedPercent")]
    pub mid_static_cpu_reserved_percent: Option<i64>,
    pub mid_static_memory_reserved_percent: Option<i64>,
    #[serde(rename = "batchCPUThresholdPercent")]
    pub batch_cpu_threshold_percent: Option<i64>,
    pub batch_memory_threshold_percent: Option<i64>,
}

/// The shape of every key but colocation: a cluster strategy and node strategies.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StrategyCfg<S> {
    pub cluster_strategy: Option<S>,
    #[serde(default = "Vec::new")]
    pub node_strategies: Vec<NodeStrategy<S>>,
}

impl<S> Default for StrategyCfg<S> {
    fn default() -> Self {
        Self {
            cluster_strategy: None,
            node_strategies: Vec::new(),
        }
    }
}

pub type ResourceThresholdCfg = StrategyCfg<ResourceThresholdStrategy>;
pub type ResourceQosCfg = StrategyCfg<ResourceQosStrategy>;
pub type CpuBurstCfg = StrategyCfg<CpuBurstStrategy>;
pub type SystemCfg = StrategyCfg<SystemStrategy>;

#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceThresholdStrategy {
    pub enable: Option<bool>,
    #[serde(rename = "cpuSuppressThresholdPercent")]
    pub cpu_suppress_threshold_percent: Option<i64>,
    #[serde(rename = "cpuSuppressMinPercent")]
    pub cpu_suppress_min_percent: Option<i64>,
    #[serde(rename = "cpuEvictBEUsageThresholdPercent")]
    pub cpu_evict_be_usage_threshold_percent: Option<i64>,
    pub memory_evict_threshold_percent: Option<i64>,
    pub memory_evict_lower_percent: Option<i64>,
    pub memory_allocatable_evict_threshold_percent: Option<i64>,
    pub memory_allocatable_evict_lower_percent: Option<i64>,
    #[serde(rename = "cpuEvictBESatisfactionUpperPercent")]
    pub cpu_evict_be_satisfaction_upper_percent: Option<i64>,
    #[serde(rename = "cpuEvictBESatisfactionLowerPercent")]
    pub cpu_evict_be_satisfaction_lower_percent: Option<i64>,
    pub cpu_evict_threshold_percent: Option<i64>,
    pub cpu_evict_lower_percent: Option<i64>,
    pub cpu_allocatable_evict_threshold_percent: Option<i64>,
    pub cpu_allocatable_evict_lower_percent: Option<i64>,
    pub cpu_evict_time_window_seconds: Option<i64>,
    pub allocatable_evict_priority_threshold: Option<i64>,
}

/// One QoS class per field; `cgroupRoot` is the root cgroup's settings.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQosStrategy {
    pub lsr_class: Option<ResourceQos>,
    pub ls_class: Option<ResourceQos>,
    pub be_class: Option<ResourceQos>,
    pub system_class: Option<ResourceQos>,
    pub cgroup_root: Option<ResourceQos>,
}

#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
pub struct ResourceQos {
    #[serde(rename = "cpuQOS")]
    pub cpu_qos: Option<CpuQos>,
    #[serde(rename = "memoryQOS")]
    pub memory_qos: Option<MemoryQos>,
    #[serde(rename = "resctrlQOS")]
    pub resctrl_qos: Option<ResctrlQos>,
    #[serde(rename = "networkQOS")]
    pub network_qos: Option<NetworkQos>,
}

#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuQos {
    pub enable: Option<bool>,
    pub group_identity: Option<i64>,
    pub sched_idle: Option<i64>,
}

#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryQos {
    pub enable: Option<bool>,
    pub min_limit_percent: Option<i64>,
    pub low_limit_percent: Option<i64>,
    pub throttling_percent: Option<i64>,
    pub wmark_ratio: Option<i64>,
    pub wmark_scale_permill: Option<i64>,
    pub wmark_min_adj: Option<i64>,
    pub priority_enable: Option<i64>,
    pub priority: Option<i64>,
    pub oom_kill_group: Option<i64>,
    pub page_cache_limit_percent: Option<i64>,
}

#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResctrlQos {
    pub enable: Option<bool>,
    #[serde(rename = "catRangeStartPercent")]
    pub cat_range_start_percent: Option<i64>,
    #[serde(rename = "catRangeEndPercent")]
    pub cat_range_end_percent: Option<i64>,
    #[serde(rename = "mbaPercent")]
    pub mba_percent: Option<i64>,
}

/// Bandwidth requests and limits: an integer percentage or a quantity string.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkQos {
    pub enable: Option<bool>,
    pub ingress_request: Option<IntOrString>,
    pub ingress_limit: Option<IntOrString>,
    pub egress_request: Option<IntOrString>,
    pub egress_limit: Option<IntOrString>,
}

#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuBurstStrategy {
    #[serde(flatten)]
    pub config: CpuBurstConfig,
    pub share_pool_threshold_percent: Option<i64>,
}

#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuBurstConfig {
    pub policy: Option<String>,
    #[serde(rename = "cpuBurstPercent")]
    pub cpu_burst_percent: Option<i64>,
    #[serde(rename = "cfsQuotaBurstPercent")]
    pub cfs_quota_burst_percent: Option<i64>,
    #[serde(rename = "cfsQuotaBurstPeriodSeconds")]
    pub cfs_quota_burst_period_seconds: Option<i64>,
}

#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SystemStrategy {
    pub min_free_kbytes_factor: Option<i64>,
    pub watermark_scale_factor: Option<i64>,
    #[serde(rename = "memcgReapBackGround")]
    pub memcg_reap_back_ground: Option<i64>,
    pub page_cache_limit_enabled: Option<i64>,
    pub total_network_bandwidth: Option<GoQuantity>,
}

/// A `resource.Quantity` as Go decodes one from JSON: a string (spaces trimmed) or the raw JSON of any
/// other value, in Kubernetes' quantity syntax; `null` is zero. Anything else refuses the whole
/// config, in Kubernetes' words.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GoQuantity(pub Qty);

impl<'de> Deserialize<'de> for GoQuantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Go hands the value's raw JSON to `UnmarshalJSON`, which unquotes a string.
        let text = match serde_json::Value::deserialize(d)? {
            serde_json::Value::Null => return Ok(Self::default()),
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        };
        text.parse::<Qty>()
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}
