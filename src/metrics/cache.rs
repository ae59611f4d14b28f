//! The cache's metrics: what it holds, and how often its watches broke.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::labels::KindLabels;

#[derive(Clone)]
pub struct CacheMetrics {
    pub objects: Family<KindLabels, Gauge>,
    pub watch_restarts: Family<KindLabels, Counter>,
    /// Objects left out of the cache because they do not decode (`lenient.rs`).
    pub unreadable_objects: Family<KindLabels, Counter>,
}

impl CacheMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            objects: Family::default(),
            watch_restarts: Family::default(),
            unreadable_objects: Family::default(),
        };
        registry.register(
            "cache_objects",
            "Objects in the in-memory cache, by kind",
            metrics.objects.clone(),
        );
        registry.register(
            "watch_restarts",
            "Watches that broke and resumed, by kind",
            metrics.watch_restarts.clone(),
        );
        registry.register(
            "cache_unreadable_objects",
            "Object versions left out of the cache because they do not decode, by kind",
            metrics.unreadable_objects.clone(),
        );
        metrics
    }
}
