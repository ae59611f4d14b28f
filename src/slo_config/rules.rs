//! The field rules of the ConfigMap keys, one line per field, with the messages and field paths of Go's validator
//! (English translations): `{"ColocationCfg.ColocationStrategy.DegradeTimeMinutes": "DegradeTimeMinutes
//! must be 1 or greater"}`. An unset field is not checked; a field reports its first broken rule only.

use std::collections::BTreeMap;

use super::types::*;

/// Broken rules by field path, sorted as Go prints a map.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Violations {
    path: Vec<String>,
    pub errors: BTreeMap<String, String>,
}

impl Violations {
    /// Checks the fields of `rules` under one more path segment.
    pub fn within(&mut self, segment: impl Into<String>, rules: &dyn Rules) {
        self.path.push(segment.into());
        rules.check(self);
        self.path.pop();
    }

    /// As [`Violations::within`] for an optional (pointer) field: nothing when unset.
    pub fn within_opt<R: Rules>(&mut self, segment: &str, rules: Option<&R>) {
        if let Some(rules) = rules {
            self.within(segment, rules);
        }
    }

    /// Starts the rules of one numeric field.
    pub fn field<N: Into<Number>>(&mut self, name: &'static str, value: Option<N>) -> Field<'_> {
        Field {
            violations: self,
            name,
            value: value.map(|v| v.into().0),
            broken: false,
        }
    }

    fn report(&mut self, name: &str, message: String) {
        let mut key = self.path.join(".");
        key.push('.');
        key.push_str(name);
        self.errors.insert(key, message);
    }
}

/// A numeric field value (integers and floats alike).
pub struct Number(f64);

impl From<i64> for Number {
    fn from(v: i64) -> Self {
        Number(v as f64)
    }
}

impl From<f64> for Number {
    fn from(v: f64) -> Self {
        Number(v)
    }
}

/// The rules of one field, in tag order; the first broken one is reported.
pub struct Field<'a> {
    violations: &'a mut Violations,
    name: &'static str,
    value: Option<f64>,
    broken: bool,
}

impl Field<'_> {
    fn rule(mut self, holds: impl FnOnce(f64) -> bool, message: impl FnOnce() -> String) -> Self {
        if let (false, Some(value)) = (self.broken, self.value)
            && !holds(value)
        {
            self.broken = true;
            let message = format!("{} {}", self.name, message());
            self.violations.report(self.name, message);
        }
        self
    }

    /// `min=n` / `gte=n`.
    pub fn min(self, n: f64) -> Self {
        self.rule(|v| v >= n, || format!("must be {} or greater", bound(n)))
    }

    /// `max=n` / `lte=n`.
    pub fn max(self, n: f64) -> Self {
        self.rule(|v| v <= n, || format!("must be {} or less", bound(n)))
    }

    pub fn range(self, low: f64, high: f64) -> Self {
        self.min(low).max(high)
    }

    /// `gt=n`.
    pub fn gt(self, n: f64) -> Self {
        self.rule(|v| v > n, || format!("must be greater than {}", bound(n)))
    }

    /// `gtfield=Other`: the other field must be set and smaller.
    pub fn gt_field<N: Into<Number>>(self, other: &'static str, value: Option<N>) -> Self {
        let other_value = value.map(|v| v.into().0);
        self.rule(
            |v| other_value.is_some_and(|o| v > o),
            || format!("must be greater than {other}"),
        )
    }

    /// `ltfield=Other`: the other field must be set and larger.
    pub fn lt_field<N: Into<Number>>(self, other: &'static str, value: Option<N>) -> Self {
        let other_value = value.map(|v| v.into().0);
        self.rule(
            |v| other_value.is_some_and(|o| v < o),
            || format!("must be less than {other}"),
        )
    }
}

/// A struct whose fields carry rules.
pub trait Rules {
    fn check(&self, v: &mut Violations);
}

impl Rules for ColocationStrategy {
    fn check(&self, v: &mut Violations) {
        v.field(
            "MetricAggregateDurationSeconds",
            self.metric_aggregate_duration_seconds,
        )
        .min(1.0);
        v.field(
            "MetricReportIntervalSeconds",
            self.metric_report_interval_seconds,
        )
        .min(1.0);
        v.field(
            "CPUReclaimThresholdPercent",
            self.cpu_reclaim_threshold_percent,
        )
        .min(0.0);
        v.field(
            "MemoryReclaimThresholdPercent",
            self.memory_reclaim_threshold_percent,
        )
        .min(0.0);
        v.field("DegradeTimeMinutes", self.degrade_time_minutes)
            .min(1.0);
        v.field(
            "UpdateTimeThresholdSeconds",
            self.update_time_threshold_seconds,
        )
        .min(1.0);
        v.field("ResourceDiffThreshold", self.resource_diff_threshold)
            .gt(0.0)
            .max(1.0);
        v.field("MidCPUThresholdPercent", self.mid_cpu_threshold_percent)
            .range(0.0, 100.0);
        v.field(
            "MidMemoryThresholdPercent",
            self.mid_memory_threshold_percent,
        )
        .range(0.0, 100.0);
        v.field("MidUnallocatedPercent", self.mid_unallocated_percent)
            .range(0.0, 100.0);
        v.field(
            "MidStaticCPUReservedPercent",
            self.mid_static_cpu_reserved_percent,
        )
        .range(0.0, 100.0);
        v.field(
            "MidStaticMemoryReservedPercent",
            self.mid_static_memory_reserved_percent,
        )
        .range(0.0, 100.0);
        v.field("BatchCPUThresholdPercent", self.batch_cpu_threshold_percent)
            .min(0.0);
        v.field(
            "BatchMemoryThresholdPercent",
            self.batch_memory_threshold_percent,
        )
        .min(0.0);
    }
}

impl Rules for ResourceThresholdStrategy {
    fn check(&self, v: &mut Violations) {
        let s = self;
        v.field(
            "CPUSuppressThresholdPercent",
            s.cpu_suppress_threshold_percent,
        )
        .range(0.0, 100.0);
        v.field("CPUSuppressMinPercent", s.cpu_suppress_min_percent)
            .range(0.0, 100.0);
        v.field(
            "CPUEvictBEUsageThresholdPercent",
            s.cpu_evict_be_usage_threshold_percent,
        )
        .range(0.0, 100.0);
        v.field(
            "MemoryEvictThresholdPercent",
            s.memory_evict_threshold_percent,
        )
        .range(0.0, 100.0)
        .gt_field("MemoryEvictLowerPercent", s.memory_evict_lower_percent);
        v.field("MemoryEvictLowerPercent", s.memory_evict_lower_percent)
            .range(0.0, 100.0)
            .lt_field(
                "MemoryEvictThresholdPercent",
                s.memory_evict_threshold_percent,
            );
        v.field(
            "MemoryAllocatableEvictThresholdPercent",
            s.memory_allocatable_evict_threshold_percent,
        )
        .min(0.0)
        .gt_field(
            "MemoryAllocatableEvictLowerPercent",
            s.memory_allocatable_evict_lower_percent,
        );
        v.field(
            "MemoryAllocatableEvictLowerPercent",
            s.memory_allocatable_evict_lower_percent,
        )
        .min(0.0)
        .lt_field(
            "MemoryAllocatableEvictThresholdPercent",
            s.memory_allocatable_evict_threshold_percent,
        );
        v.field(
            "CPUEvictBESatisfactionUpperPercent",
            s.cpu_evict_be_satisfaction_upper_percent,
        )
        .range(0.0, 100.0)
        .gt_field(
            "CPUEvictBESatisfactionLowerPercent",
            s.cpu_evict_be_satisfaction_lower_percent,
        );
        v.field(
            "CPUEvictBESatisfactionLowerPercent",
            s.cpu_evict_be_satisfaction_lower_percent,
        )
        .range(0.0, 100.0)
        .lt_field(
            "CPUEvictBESatisfactionUpperPercent",
            s.cpu_evict_be_satisfaction_upper_percent,
        );
        v.field("CPUEvictThresholdPercent", s.cpu_evict_threshold_percent)
            .range(0.0, 100.0)
            .gt_field("CPUEvictLowerPercent", s.cpu_evict_lower_percent);
        v.field("CPUEvictLowerPercent", s.cpu_evict_lower_percent)
            .range(0.0, 100.0)
            .lt_field("CPUEvictThresholdPercent", s.cpu_evict_threshold_percent);
        v.field(
            "CPUAllocatableEvictThresholdPercent",
            s.cpu_allocatable_evict_threshold_percent,
        )
        .min(0.0)
        .gt_field(
            "CPUAllocatableEvictLowerPercent",
            s.cpu_allocatable_evict_lower_percent,
        );
        v.field(
            "CPUAllocatableEvictLowerPercent",
            s.cpu_allocatable_evict_lower_percent,
        )
        .min(0.0)
        .lt_field(
            "CPUAllocatableEvictThresholdPercent",
            s.cpu_allocatable_evict_threshold_percent,
        );
        v.field("CPUEvictTimeWindowSeconds", s.cpu_evict_time_window_seconds)
            .gt(0.0);
        v.field(
            "AllocatableEvictPriorityThreshold",
            s.allocatable_evict_priority_threshold,
        )
        .range(0.0, 7999.0);
    }
}

impl Rules for ResourceQosStrategy {
    fn check(&self, v: &mut Violations) {
        v.within_opt("LSRClass", self.lsr_class.as_ref());
        v.within_opt("LSClass", self.ls_class.as_ref());
        v.within_opt("BEClass", self.be_class.as_ref());
        v.within_opt("SystemClass", self.system_class.as_ref());
        v.within_opt("CgroupRoot", self.cgroup_root.as_ref());
    }
}

impl Rules for ResourceQos {
    fn check(&self, v: &mut Violations) {
        // The QoS settings are embedded in a `...Cfg` holder, hence the doubled segment.
        v.within_opt(
            "CPUQOS",
            self.cpu_qos
                .as_ref()
                .map(|q| Embedded("CPUQOS", q))
                .as_ref(),
        );
        v.within_opt(
            "MemoryQOS",
            self.memory_qos
                .as_ref()
                .map(|q| Embedded("MemoryQOS", q))
                .as_ref(),
        );
        v.within_opt(
            "ResctrlQOS",
            self.resctrl_qos
                .as_ref()
                .map(|q| Embedded("ResctrlQOS", q))
                .as_ref(),
        );
    }
}

impl Rules for CpuQos {
    fn check(&self, v: &mut Violations) {
        v.field("GroupIdentity", self.group_identity)
            .range(-1.0, 2.0);
        v.field("SchedIdle", self.sched_idle).range(0.0, 1.0);
    }
}

impl Rules for MemoryQos {
    fn check(&self, v: &mut Violations) {
        v.field("MinLimitPercent", self.min_limit_percent)
            .range(0.0, 100.0);
        v.field("LowLimitPercent", self.low_limit_percent)
            .range(0.0, 100.0);
        v.field("ThrottlingPercent", self.throttling_percent)
            .range(0.0, 100.0);
        v.field("WmarkRatio", self.wmark_ratio).range(0.0, 100.0);
        v.field("WmarkScalePermill", self.wmark_scale_permill)
            .range(1.0, 1000.0);
        v.field("WmarkMinAdj", self.wmark_min_adj)
            .range(-25.0, 50.0);
        v.field("PriorityEnable", self.priority_enable)
            .range(0.0, 1.0);
        v.field("Priority", self.priority).range(0.0, 12.0);
        v.field("OomKillGroup", self.oom_kill_group).range(0.0, 1.0);
        v.field("PageCacheLimitPercent", self.page_cache_limit_percent)
            .range(0.0, 100.0);
    }
}

impl Rules for ResctrlQos {
    fn check(&self, v: &mut Violations) {
        let s = self;
        v.field("CATRangeStartPercent", s.cat_range_start_percent)
            .range(0.0, 100.0)
            .lt_field("CATRangeEndPercent", s.cat_range_end_percent);
        v.field("CATRangeEndPercent", s.cat_range_end_percent)
            .range(0.0, 100.0)
            .gt_field("CATRangeStartPercent", s.cat_range_start_percent);
        v.field("MBAPercent", s.mba_percent).range(0.0, 100.0);
    }
}

impl Rules for CpuBurstStrategy {
    fn check(&self, v: &mut Violations) {
        v.within("CPUBurstConfig", &self.config);
        v.field(
            "SharePoolThresholdPercent",
            self.share_pool_threshold_percent,
        )
        .range(0.0, 100.0);
    }
}

impl Rules for CpuBurstConfig {
    fn check(&self, v: &mut Violations) {
        v.field("CPUBurstPercent", self.cpu_burst_percent)
            .range(1.0, 10000.0);
        v.field("CFSQuotaBurstPercent", self.cfs_quota_burst_percent)
            .min(100.0);
        v.field(
            "CFSQuotaBurstPeriodSeconds",
            self.cfs_quota_burst_period_seconds,
        )
        .min(-1.0);
    }
}

impl Rules for SystemStrategy {
    fn check(&self, v: &mut Violations) {
        v.field("MinFreeKbytesFactor", self.min_free_kbytes_factor)
            .gt(0.0);
        v.field("WatermarkScaleFactor", self.watermark_scale_factor)
            .gt(0.0)
            .max(400.0);
        v.field("MemcgReapBackGround", self.memcg_reap_back_ground)
            .range(0.0, 1.0);
        v.field("PageCacheLimitEnabled", self.page_cache_limit_enabled)
            .range(0.0, 1.0);
    }
}

/// A struct embedded under its own type name (Go's anonymous fields show in the path).
pub struct Embedded<'a>(&'static str, &'a dyn Rules);

impl Rules for Embedded<'_> {
    fn check(&self, v: &mut Violations) {
        v.within(self.0, self.1);
    }
}

/// The rules of a whole key: the cluster strategy and every node strategy.
pub fn check_key<S: Rules>(root: &str, embedded: &str, cfg: &StrategyCfg<S>) -> Violations {
    let mut v = Violations::default();
    v.path.push(root.to_owned());
    v.within_opt("ClusterStrategy", cfg.cluster_strategy.as_ref());
    for (i, node) in cfg.node_strategies.iter().enumerate() {
        v.path.push(format!("NodeStrategies[{i}]"));
        v.within(embedded, &node.strategy);
        v.path.pop();
    }
    v
}

/// The rules of `colocation-config`.
pub fn check_colocation(cfg: &ColocationCfg) -> Violations {
    let mut v = Violations::default();
    v.path.push("ColocationCfg".to_owned());
    v.within("ColocationStrategy", &cfg.strategy);
    for (i, node) in cfg.node_configs.iter().enumerate() {
        v.path.push(format!("NodeConfigs[{i}]"));
        v.within("ColocationStrategy", &node.strategy);
        v.path.pop();
    }
    v
}
/// A rule's bound as Koordinator's validator messages print it (English number formatting): whole
/// numbers grouped by thousands (`7,999`), others as written.
pub(super) fn bound(n: f64) -> String {
    if n.fract() != 0.0 || n.abs() >= 1e15 {
        return n.to_string();
    }
    let digits = (n.abs() as u64).to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0.0 {
        grouped.push('-');
    }
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(d);
    }
    grouped
}
