//! The operator's metrics: certificates and their rotation, the caBundle of the webhook
//! configurations, leadership, and the writes this replica made.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::metrics::labels::KindLabels;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    /// ca or serving.
    pub certificate: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigurationLabels {
    pub configuration: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecountPartLabels {
    /// `pass` (start to last write), `compute` (the pass's own work, without its writes) or
    /// `pod_index_lock` (how long it held the pod index, which the pod watch waits for).
    pub part: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassStepLabels {
    /// `certificates`, `webhook_configurations` or `ca_rotation`.
    pub step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    /// `proven` (answered and written into the ledger's record), `unanswered` (no replica's
    /// answer in the API server's response), `unpublished` (answered, the record not written) or
    /// `ambiguous` (answers naming several addresses: the probe replayed by something it was sent
    /// to; nothing written).
    pub outcome: &'static str,
}

#[derive(Clone)]
pub struct OperatorMetrics {
    pub cert_not_after: Family<CertLabels, Gauge>,
    pub cert_rotations: Family<CertLabels, Counter>,
    pub ca_rotation_phase: Gauge,
    pub ca_bundle_in_sync: Family<ConfigurationLabels, Gauge>,
    pub leader: Gauge,
    pub writes: Family<KindLabels, Counter>,
    pub recount_last: Family<RecountPartLabels, Gauge<f64, AtomicU64>>,
    pub recount_passes: Counter,
    pub pass_failures: Family<PassStepLabels, Counter>,
    pub api_server_probes: Family<ProbeLabels, Counter>,
}

impl OperatorMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            cert_not_after: Family::default(),
            cert_rotations: Family::default(),
            ca_rotation_phase: Gauge::default(),
            ca_bundle_in_sync: Family::default(),
            leader: Gauge::default(),
            writes: Family::default(),
            recount_last: Family::default(),
            recount_passes: Counter::default(),
            pass_failures: Family::default(),
            api_server_probes: Family::default(),
        };
        registry.register(
            "certificate_expiration_timestamp_seconds",
            "notAfter of the CA and of the serving certificate, as Unix seconds",
            metrics.cert_not_after.clone(),
        );
        registry.register(
            "certificate_rotations",
            "Certificates issued, by kind",
            metrics.cert_rotations.clone(),
        );
        registry.register(
            "ca_rotation_phase",
            "CA rotation phase: 0 stable, 1 publishing both CAs, 2 draining the old CA",
            metrics.ca_rotation_phase.clone(),
        );
        registry.register(
            "ca_bundle_in_sync",
            "Whether every entry of the configuration carries the expected caBundle (1) or not (0)",
            metrics.ca_bundle_in_sync.clone(),
        );
        registry.register(
            "leader",
            "Whether this replica holds the Lease and writes (1) or only serves (0)",
            metrics.leader.clone(),
        );
        registry.register(
            "cluster_writes",
            "Writes to the API server by this replica, by kind",
            metrics.writes.clone(),
        );
        registry.register(
            "child_request_recount_last_seconds",
            "The leader's last child-request recount: its duration, its own work and its hold of the pod index",
            metrics.recount_last.clone(),
        );
        registry.register(
            "child_request_recounts",
            "child-request recount passes run by this replica as leader",
            metrics.recount_passes.clone(),
        );
        registry.register(
            "leader_pass_failures",
            "Leader passes that stopped at a step, by step (the log names the object and the action)",
            metrics.pass_failures.clone(),
        );
        registry.register(
            "api_server_probes",
            "This replica's probes of the API server's address for the ElasticQuota ledger, by outcome",
            metrics.api_server_probes.clone(),
        );
        metrics
    }
}
