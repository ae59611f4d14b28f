//! The flags of the admission rules (`RuleFlags`, flattened into `serve`, `review` and `audit`, so
//! `review` and `audit` answer as a served replica with the same flags would) and the [`Settings`] they make.

use clap::Args;

use super::actions::{self, Action, RuleActions};
use super::registry::registered_rules;
use super::settings::{
    DEFAULT_ENHANCED_VALIDATOR_CONFIG, DEFAULT_MAX_AMPLIFICATION_RATIO, DEFAULT_SLO_CONFIG_NAME,
    OwnUser, Settings,
};
use crate::duration::parse_duration_arg;
use crate::names::Mode;

/// Flags of the admission rules, shared by `serve`, `review` and `audit`.
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
    /// The longest `ttl` a new Reservation may ask for (e.g. `72h`); a longer one, or `0` (never
    /// expires), is refused. Default: no limit, as Koordinator.
    #[arg(long, env = "KOORD_WEBHOOK_MAX_RESERVATION_TTL", value_name = "DURATION", value_parser = parse_duration_arg)]
    pub max_reservation_ttl: Option<std::time::Duration>,
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
            max_reservation_ttl: self.max_reservation_ttl,
        }
    }
}

fn parse_rule_action(text: &str) -> Result<(&'static str, Action), String> {
    actions::parse(text, &registered_rules()).map_err(|e| e.to_string())
}

fn parse_max_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!("{text:?} is not a number of at least 1")),
    }
}
