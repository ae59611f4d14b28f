//! Settings of the admission rules that come from flags rather than from the cluster (`Settings`;
//! the flags that make them are `rule_flags.rs`). A rule's new setting is a field here, its flag a
//! field of `RuleFlags` and a line of `RuleFlags::settings_in` (docs/recipes.md).

use std::sync::{Arc, OnceLock};

use super::actions::{self, RuleActions};
use crate::names::namespace;

#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Namespace of the slo-controller ConfigMap (`--config-namespace`).
    pub config_namespace: String,
    /// Name of the slo-controller ConfigMap (`--slo-config-name`).
    pub slo_config_name: String,
    /// Every node strategy must carry a unique name (`--node-strategy-name-need-check`).
    pub node_strategy_name_need_check: bool,
    /// Upper bound of a node's amplification ratios (`--max-amplification-ratio`).
    pub max_amplification_ratio: f64,
    /// Namespace and name of the pod enhanced-validator ConfigMap.
    pub enhanced_validator_config: (String, String),
    /// How long an admitted pod may take to reach the cache: quota evaluation keeps its admission
    /// that long in the recent-admissions record (`--child-request-recount-quiet`).
    pub child_request_window: std::time::Duration,
    /// What each rule's finding does (`--rule-action`; every rule enforces by default).
    pub actions: RuleActions,
    /// The user koord-webhook's own writes carry (`--own-user`, or learned from the API server).
    pub own_user: OwnUser,
    /// The longest `ttl` a new Reservation may ask for (`--max-reservation-ttl`; none: no limit).
    pub max_reservation_ttl: Option<std::time::Duration>,
}

/// The user name the API server gives the replicas' own requests: only that user may write
/// koord-webhook's bookkeeping on a quota (`elastic_quota/own_annotations.rs`). Known from the
/// start (`--own-user`, or the installed ServiceAccount's name where no API server is asked), or
/// learned once a replica has asked the API server (a SelfSubjectReview), shared by every copy of
/// the settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OwnUser(Arc<OnceLock<String>>);

impl OwnUser {
    pub fn known(name: impl Into<String>) -> Self {
        let user = Self::default();
        user.learn(name.into());
        user
    }

    /// The name, once known.
    pub fn get(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }

    /// Records the name; a second call changes nothing (a replica's user does not change).
    pub fn learn(&self, name: String) {
        let _ = self.0.set(name);
    }
}

/// The default of [`Settings::child_request_window`]: the API server's own request timeout.
pub const DEFAULT_CHILD_REQUEST_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

pub const DEFAULT_SLO_CONFIG_NAME: &str = "slo-controller-config";
pub const DEFAULT_MAX_AMPLIFICATION_RATIO: f64 = 5.0;
pub const DEFAULT_ENHANCED_VALIDATOR_CONFIG: &str = "pod-enhanced-validator-config";

impl Default for Settings {
    fn default() -> Self {
        Self {
            config_namespace: namespace().to_owned(),
            slo_config_name: DEFAULT_SLO_CONFIG_NAME.to_owned(),
            node_strategy_name_need_check: false,
            max_amplification_ratio: DEFAULT_MAX_AMPLIFICATION_RATIO,
            enhanced_validator_config: (
                namespace().to_owned(),
                DEFAULT_ENHANCED_VALIDATOR_CONFIG.to_owned(),
            ),
            child_request_window: DEFAULT_CHILD_REQUEST_WINDOW,
            actions: RuleActions::default(),
            own_user: OwnUser::known(crate::names::service_account_user()),
            max_reservation_ttl: None,
        }
    }
}

impl Settings {
    /// With the shadowable rules (of `rules`, the registered ones) of the endpoints at `paths` in
    /// Audit (`--entry-action`).
    pub fn auditing_endpoints(mut self, paths: &[&str], rules: &[actions::Rule]) -> Self {
        self.actions = self.actions.with_audited_endpoints(paths, rules);
        self
    }

    /// Whether `namespace/name` is the slo-controller ConfigMap.
    pub fn is_slo_config(&self, namespace: &str, name: &str) -> bool {
        namespace == self.config_namespace && name == self.slo_config_name
    }

    /// The ConfigMaps the rules read, as namespace and name, each once: all the cache watches of
    /// ConfigMaps (one watch per name, so a namespace's other ConfigMaps are never held).
    pub fn config_maps(&self) -> Vec<(String, String)> {
        let mut all = vec![
            (self.config_namespace.clone(), self.slo_config_name.clone()),
            self.enhanced_validator_config.clone(),
        ];
        all.sort();
        all.dedup();
        all
    }
}
