//! What every request of a server shares: the cache, the gates, the metrics, the flag-given
//! settings and the outside services (ports) plugins may use.

use std::sync::Arc;

use kube::core::admission::Operation;

use super::ports::{
    Dice, FindingSink, LedgerStore, PodReachGuard, ProbeSecrets, QuotaStore, SystemDice,
};
use super::settings::Settings;
use crate::cache::Cache;
use crate::features::FeatureGates;
use crate::metrics::Metrics;

/// What every request of a server shares.
pub struct Env {
    pub cache: Cache,
    pub gates: FeatureGates,
    pub metrics: Metrics,
    pub services: Services,
    pub settings: Settings,
}

/// Outside systems some plugins write to. Absent in `review` and `serve --state`.
#[derive(Clone, Default)]
pub struct Services {
    /// Where quota evaluation records what it admitted on each ElasticQuota.
    pub quota_store: Option<Arc<dyn QuotaStore>>,
    /// The record through which replicas admit ElasticQuota changes one at a time.
    pub quota_ledger: Option<Arc<dyn LedgerStore>>,
    /// What API-server probes are signed with (the serving pair's key; `ledger/probe.rs`).
    pub probe_secrets: Option<Arc<dyn ProbeSecrets>>,
    /// Wakes the replica's prober: a change came from a caller no proof names while another is
    /// proven (the API server calling from a new address, or a forger).
    pub probe_nudge: Option<Arc<tokio::sync::Notify>>,
    /// Where narrowed pod entries are widened before a change needs them (cluster mode with
    /// `--narrow-calls=on`).
    pub pod_reach: Option<Arc<dyn PodReachGuard>>,
    /// The random source of colocation profile probabilities (default: the system's).
    pub dice: Option<Arc<dyn Dice>>,
    /// Where shadowed refusals are reported as Events (`--would-deny-events`).
    pub findings: Option<Arc<dyn FindingSink>>,
}

impl Services {
    pub fn dice(&self) -> &dyn Dice {
        match &self.dice {
            Some(dice) => dice.as_ref(),
            None => &SystemDice,
        }
    }
}

/// Who a request is about, for its log span and its response.
pub struct Head {
    pub uid: String,
    pub operation: Operation,
    pub namespace: Option<String>,
    pub name: String,
}
