//! The admission server's metrics: reviews answered, denied and failed, and their time, per
//! webhook and per plugin.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub webhook: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DenialLabels {
    pub webhook: &'static str,
    pub code: u16,
    /// The rule that refused; empty when the framework did (a body that does not decode).
    pub rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleResultLabels {
    pub webhook: &'static str,
    pub rule: &'static str,
    /// The rule's action (`--rule-action`): Deny, Deny+Audit, Warn, Audit, Warn+Audit, Apply.
    pub action: &'static str,
    /// deny (enforced), would_deny (a shadowed refusal), would_change (a mutation in Audit).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub webhook: &'static str,
    /// decode, internal, timeout or panic.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub webhook: &'static str,
    pub plugin: &'static str,
}

fn latency_histogram() -> Histogram {
    // 25 µs .. ~13 s: admission work is sub-millisecond, the API server gives up at its timeout.
    Histogram::new(exponential_buckets(0.000_025, 2.0, 20))
}

type Latencies<L> = Family<L, Histogram, fn() -> Histogram>;

/// Families are cheap handles: a clone counts into the same metrics.
#[derive(Clone)]
pub struct AdmissionMetrics {
    pub requests: Family<WebhookLabels, Counter>,
    pub denials: Family<DenialLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub request_duration: Latencies<WebhookLabels>,
    pub plugin_duration: Latencies<PluginLabels>,
    pub plugin_panics: Family<PluginLabels, Counter>,
    pub rule_results: Family<RuleResultLabels, Counter>,
}

impl AdmissionMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            denials: Family::default(),
            errors: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            plugin_duration: Family::new_with_constructor(latency_histogram),
            plugin_panics: Family::default(),
            rule_results: Family::default(),
        };
        registry.register(
            "admission_requests",
            "Admission reviews answered",
            metrics.requests.clone(),
        );
        registry.register(
            "admission_denials",
            "Admission reviews denied, by status code",
            metrics.denials.clone(),
        );
        registry.register(
            "admission_errors",
            "Admission reviews that failed: decode, internal, timeout, panic",
            metrics.errors.clone(),
        );
        registry.register(
            "admission_request_duration_seconds",
            "Time to answer one admission review",
            metrics.request_duration.clone(),
        );
        registry.register(
            "admission_plugin_duration_seconds",
            "Time one plugin took on one review",
            metrics.plugin_duration.clone(),
        );
        registry.register(
            "admission_plugin_panics",
            "Plugin runs that panicked",
            metrics.plugin_panics.clone(),
        );
        registry.register(
            "admission_rule_results",
            "Rule refusals and, for rules in Audit, changes not sent, by the rule's action",
            metrics.rule_results.clone(),
        );
        metrics
    }

    pub fn rule_result(
        &self,
        webhook: &'static str,
        rule: &'static str,
        action: &'static str,
        result: &'static str,
    ) {
        self.rule_results
            .get_or_create(&RuleResultLabels {
                webhook,
                rule,
                action,
                result,
            })
            .inc();
    }

    pub fn observe_plugin(&self, webhook: &'static str, plugin: &'static str, took: Duration) {
        self.plugin_duration
            .get_or_create(&PluginLabels { webhook, plugin })
            .observe(took.as_secs_f64());
    }

    pub fn error(&self, webhook: &'static str, kind: &'static str) {
        self.errors
            .get_or_create(&ErrorLabels { webhook, kind })
            .inc();
    }
}
