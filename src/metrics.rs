//! Prometheus metrics, served as text on `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    /// ca or serving.
    pub certificate: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigurationLabels {
    pub configuration: &'static str,
}

fn latency_histogram() -> Histogram {
    // 25 µs .. ~13 s: admission work is sub-millisecond, the API server gives up at its timeout.
    Histogram::new(exponential_buckets(0.000_025, 2.0, 20))
}

/// Every metric of the process. Families are cheap handles and the registry is shared: a clone
/// counts into the same metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub requests: Family<WebhookLabels, Counter>,
    pub denials: Family<DenialLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub request_duration: Family<WebhookLabels, Histogram, fn() -> Histogram>,
    pub plugin_duration: Family<PluginLabels, Histogram, fn() -> Histogram>,
    pub plugin_panics: Family<PluginLabels, Counter>,
    pub cache_objects: Family<KindLabels, Gauge>,
    pub cert_not_after: Family<CertLabels, Gauge>,
    pub cert_rotations: Family<CertLabels, Counter>,
    pub ca_rotation_phase: Gauge,
    pub ca_bundle_in_sync: Family<ConfigurationLabels, Gauge>,
    pub leader: Gauge,
    pub watch_restarts: Family<KindLabels, Counter>,
    pub writes: Family<KindLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("koord_webhook");
        let requests = Family::<WebhookLabels, Counter>::default();
        let denials = Family::<DenialLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let request_duration = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        let plugin_duration = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        let plugin_panics = Family::<PluginLabels, Counter>::default();
        let cache_objects = Family::<KindLabels, Gauge>::default();
        registry.register(
            "admission_requests",
            "Admission reviews answered",
            requests.clone(),
        );
        registry.register(
            "admission_denials",
            "Admission reviews denied, by status code",
            denials.clone(),
        );
        registry.register(
            "admission_errors",
            "Admission reviews that failed: decode, internal, timeout, panic",
            errors.clone(),
        );
        registry.register(
            "admission_request_duration_seconds",
            "Time to answer one admission review",
            request_duration.clone(),
        );
        registry.register(
            "admission_plugin_duration_seconds",
            "Time one plugin took on one review",
            plugin_duration.clone(),
        );
        registry.register(
            "admission_plugin_panics",
            "Plugin runs that panicked",
            plugin_panics.clone(),
        );
        registry.register(
            "cache_objects",
            "Objects in the in-memory cache, by kind",
            cache_objects.clone(),
        );
        let cert_not_after = Family::<CertLabels, Gauge>::default();
        let cert_rotations = Family::<CertLabels, Counter>::default();
        let ca_rotation_phase = Gauge::default();
        let ca_bundle_in_sync = Family::<ConfigurationLabels, Gauge>::default();
        let leader = Gauge::default();
        let watch_restarts = Family::<KindLabels, Counter>::default();
        let writes = Family::<KindLabels, Counter>::default();
        registry.register(
            "certificate_not_after_seconds",
            "notAfter of the CA and of the serving certificate, as Unix seconds",
            cert_not_after.clone(),
        );
        registry.register(
            "certificate_rotations",
            "Certificates issued, by kind",
            cert_rotations.clone(),
        );
        registry.register(
            "ca_rotation_phase",
            "CA rotation phase: 0 stable, 1 publishing both CAs, 2 draining the old CA",
            ca_rotation_phase.clone(),
        );
        registry.register(
            "ca_bundle_in_sync",
            "Whether every entry of the configuration carries the expected caBundle (1) or not (0)",
            ca_bundle_in_sync.clone(),
        );
        registry.register(
            "leader",
            "Whether this replica holds the Lease and writes (1) or only serves (0)",
            leader.clone(),
        );
        registry.register(
            "watch_restarts",
            "Watches that broke and resumed, by kind",
            watch_restarts.clone(),
        );
        registry.register(
            "cluster_writes",
            "Writes to the API server by this replica, by kind",
            writes.clone(),
        );
        Self {
            cert_not_after,
            cert_rotations,
            ca_rotation_phase,
            ca_bundle_in_sync,
            leader,
            watch_restarts,
            writes,
            registry: Arc::new(registry),
            requests,
            denials,
            errors,
            request_duration,
            plugin_duration,
            plugin_panics,
            cache_objects,
        }
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

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
