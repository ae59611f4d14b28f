//! Settings of the admission rules that come from flags rather than from the cluster: the flags
//! (`RuleFlags`, flattened into `serve` and `review`, so `review` answers as a served replica with
//! the same flags would) and what they become (`Settings`). A rule's
//! new flag is a field here and a line of `RuleFlags::settings` (docs/recipes.md).

use std::sync::{Arc, OnceLock};

use clap::Args;

use super::actions::{self, Action, RuleActions};
use crate::duration::parse_duration_arg;
use crate::names::{Mode, namespace};

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
        }
    }
}

impl Settings {
    /// With the shadowable rules of the endpoints at `paths` in Audit (`--entry-action`).
    pub fn auditing_endpoints(mut self, paths: &[&str]) -> Self {
        self.actions = self
            .actions
            .with_audited_endpoints(paths, &super::registered_rules());
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

/// Flags of the admission rules, shared by `serve` and `review`.
#[derive(Args, Debug)]
pub struct RuleFlags {
    /// Namespace of the slo-controller ConfigMap (default: koord-webhook's own, as Koordinator's).
    #[arg(long, env = "KOORD_WEBHOOK_CONFIG_NAMESPACE")]
    pub config_namespace: Option<String>,
    /// Name of the slo-controller ConfigMap.
    #[arg(long, env = "KOORD_WEBHOOK_SLO_CONFIG_NAME", default_value = DEFAULT_SLO_CONFIG_NAME)]
    pub slo_config_name: String,
    /// Require a unique `name` on every node strategy of the slo-controller ConfigMap.
    #[arg(long, env = "KOORD_WEBHOOK_NODE_STRATEGY_NAME_NEED_CHECK", default_value_t = false, action = clap::ArgAction::Set)]
    pub node_strategy_name_need_check: bool,
    /// Largest resource amplification ratio a node may carry (at least 1).
    #[arg(long, env = "KOORD_WEBHOOK_MAX_AMPLIFICATION_RATIO", default_value_t = DEFAULT_MAX_AMPLIFICATION_RATIO, value_parser = parse_max_ratio)]
    pub max_amplification_ratio: f64,
    /// Namespace of the ConfigMap of required-label rules (EnablePodEnhancedValidator; default:
    /// koord-webhook's own).
    #[arg(long, env = "KOORD_WEBHOOK_POD_ENHANCED_VALIDATOR_CONFIG_NAMESPACE")]
    pub pod_enhanced_validator_config_namespace: Option<String>,
    /// Name of that ConfigMap.
    #[arg(long, env = "KOORD_WEBHOOK_POD_ENHANCED_VALIDATOR_CONFIG_NAME", default_value = DEFAULT_ENHANCED_VALIDATOR_CONFIG)]
    pub pod_enhanced_validator_config_name: String,
    /// How long a pod quota evaluation admitted may take to be stored: its charge stays in the
    /// quota's child-request that long even before the pod is in the cache; the leader's recount
    /// drops it after (and recounts every half of it).
    #[arg(long, env = "KOORD_WEBHOOK_CHILD_REQUEST_RECOUNT_QUIET", default_value = "60s", value_parser = parse_duration_arg)]
    pub child_request_recount_quiet: std::time::Duration,
    /// `RULE=ACTIONS`: what a rule's finding does instead of being enforced, to try it first.
    /// A validating rule: Deny, Warn, Audit, Warn+Audit or Deny+Audit; a mutating rule: Apply or
    /// Audit (e.g. `ColocationQoSPriority=Warn+Audit`). Repeatable, the last naming a rule wins.
    /// The rules: docs/admission.md.
    #[arg(long = "rule-action", env = "KOORD_WEBHOOK_RULE_ACTIONS", value_delimiter = ',',
          value_name = "RULE=ACTIONS", value_parser = parse_rule_action)]
    pub rule_actions: Vec<(&'static str, Action)>,
    /// The user name koord-webhook's own API requests carry: only it may set or change a quota's
    /// recent-admissions record. Default: `serve` asks the API server at start (a
    /// SelfSubjectReview); `review` and `serve --state` take the installed ServiceAccount's
    /// (system:serviceaccount:NAMESPACE:koord-webhook).
    #[arg(long, env = "KOORD_WEBHOOK_OWN_USER", value_name = "USER")]
    pub own_user: Option<String>,
}

impl RuleFlags {
    pub fn settings(&self) -> Settings {
        self.settings_in(Mode::Enforce)
    }

    /// The settings of a replica of an install of `mode`: Koordinator's ConfigMaps are read where
    /// that install expects them unless the flags say ([`Mode::config_namespace`]).
    pub fn settings_in(&self, mode: Mode) -> Settings {
        let koordinator = || mode.config_namespace().to_owned();
        Settings {
            config_namespace: self.config_namespace.clone().unwrap_or_else(koordinator),
            slo_config_name: self.slo_config_name.clone(),
            node_strategy_name_need_check: self.node_strategy_name_need_check,
            max_amplification_ratio: self.max_amplification_ratio,
            enhanced_validator_config: (
                self.pod_enhanced_validator_config_namespace
                    .clone()
                    .unwrap_or_else(koordinator),
                self.pod_enhanced_validator_config_name.clone(),
            ),
            child_request_window: self.child_request_recount_quiet,
            actions: RuleActions::from_parsed(&self.rule_actions),
            own_user: self
                .own_user
                .clone()
                .map(OwnUser::known)
                .unwrap_or_default(),
        }
    }
}

fn parse_rule_action(text: &str) -> Result<(&'static str, Action), String> {
    actions::parse(text, &super::registered_rules()).map_err(|e| e.to_string())
}

fn parse_max_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!("{text:?} is not a number of at least 1")),
    }
}
