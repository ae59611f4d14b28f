//! The process's Prometheus registry, served as text on `/metrics`: every metric of the process,
//! one file per subsystem (`admission.rs`, `cache.rs`, `operator.rs`, registered under
//! `koord_webhook_`), the label sets they share (`labels.rs`), `koord_webhook_build_info` and the
//! standard `process_*` metrics (`process.rs`). A leaf layer: the subsystems count into it, it
//! imports none of them. Names follow Prometheus conventions: counters end in `_total`,
//! units are in the name, points in time are `_timestamp_seconds`.

use std::sync::Arc;

use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::metrics::admission::AdmissionMetrics;
use crate::metrics::cache::CacheMetrics;
use crate::metrics::operator::OperatorMetrics;
use process::ProcessCollector;

pub mod admission;
pub mod cache;
pub mod labels;
pub mod operator;
mod process;

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
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let ours = registry.sub_registry_with_prefix("koord_webhook");
        ours.register(
            "build",
            "The running build: version of koord-webhook",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let admission = AdmissionMetrics::register(ours);
        let cache = CacheMetrics::register(ours);
        let operator = OperatorMetrics::register(ours);
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

#[cfg(test)]
mod tests {
    /// Every koord-webhook metric the chart's alert rules and the example dashboard query is one
    /// this binary exposes (a rename would otherwise silence an alert).
    #[test]
    fn the_alerts_and_the_dashboard_query_metrics_that_exist() {
        use crate::metrics::admission::{DenialLabels, ErrorLabels, WebhookLabels};
        use crate::metrics::operator::{CertLabels, ConfigurationLabels};
        // A family is announced once it has a sample: one of each kind the queries read.
        let metrics = super::Metrics::new();
        let webhook = "/validate-pod";
        let admission = &metrics.admission;
        admission
            .requests
            .get_or_create(&WebhookLabels { webhook })
            .inc();
        let denial = DenialLabels {
            webhook,
            code: 400,
            rule: "First",
        };
        admission.denials.get_or_create(&denial).inc();
        let error = ErrorLabels {
            webhook,
            kind: "decode",
        };
        admission.errors.get_or_create(&error).inc();
        let duration = admission
            .request_duration
            .get_or_create(&WebhookLabels { webhook });
        duration.observe(0.001);
        let operator = &metrics.operator;
        let certificate = CertLabels { certificate: "ca" };
        operator.cert_not_after.get_or_create(&certificate).set(1);
        operator.cert_rotations.get_or_create(&certificate).inc();
        let configuration = ConfigurationLabels { configuration: "c" };
        operator
            .ca_bundle_in_sync
            .get_or_create(&configuration)
            .set(1);
        let exposition = metrics.encode();
        let root = env!("CARGO_MANIFEST_DIR");
        for file in [
            "charts/koord-webhook/templates/prometheusrule.yaml",
            "docs/grafana-dashboard.json",
        ] {
            let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
            let mut names: Vec<&str> = text
                .match_indices("koord_webhook_")
                .map(|(at, _)| {
                    let rest = &text[at..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    &rest[..end]
                })
                .collect();
            names.sort_unstable();
            names.dedup();
            assert!(names.len() >= 5, "{file} queries {names:?}");
            for name in names {
                let family = ["_total", "_bucket", "_count", "_sum", "_info"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(name);
                assert!(
                    exposition.contains(&format!("# TYPE {family} ")),
                    "{file} queries {name}, which is not exposed"
                );
            }
        }
    }
}
