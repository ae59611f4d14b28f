//! The process's Prometheus registry, served as text on `/metrics`. Each subsystem's metrics live
//! with it and register themselves here: `admission/metrics.rs`, `cache/metrics.rs`,
//! `controller/metrics.rs`.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::registry::Registry;

use crate::admission::metrics::AdmissionMetrics;
use crate::cache::metrics::CacheMetrics;
use crate::controller::metrics::OperatorMetrics;

/// By kind of object (cache contents, watches, writes).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// Every metric of the process. The registry is shared: a clone counts into the same metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub admission: AdmissionMetrics,
    pub cache: CacheMetrics,
    pub operator: OperatorMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("koord_webhook");
        let admission = AdmissionMetrics::register(&mut registry);
        let cache = CacheMetrics::register(&mut registry);
        let operator = OperatorMetrics::register(&mut registry);
        Self {
            registry: Arc::new(registry),
            admission,
            cache,
            operator,
        }
    }

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
