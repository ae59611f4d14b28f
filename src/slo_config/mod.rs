//! The slo-controller ConfigMap (docs/admission.md, /validate-configmap): its five validated keys as types, their field rules, and
//! the node-strategy checks shared by /validate-configmap and /validate-node.

pub mod error;
pub mod go_json;
pub mod network_qos;
pub mod overlap;
pub mod rules;
pub mod types;

use std::collections::BTreeSet;

pub use error::ConfigError;
use serde::Deserialize;
use types::*;

use crate::selectors::{self, Labels};

/// The validated data keys, in the order they are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigKey {
    Colocation,
    ResourceThreshold,
    ResourceQos,
    System,
    CpuBurst,
}

impl ConfigKey {
    pub const CHECK_ORDER: [ConfigKey; 5] = [
        ConfigKey::Colocation,
        ConfigKey::ResourceThreshold,
        ConfigKey::ResourceQos,
        ConfigKey::System,
        ConfigKey::CpuBurst,
    ];

    pub fn data_key(self) -> &'static str {
        match self {
            ConfigKey::Colocation => "colocation-config",
            ConfigKey::ResourceThreshold => "resource-threshold-config",
            ConfigKey::ResourceQos => "resource-qos-config",
            ConfigKey::System => "system-config",
            ConfigKey::CpuBurst => "cpu-burst-config",
        }
    }

    /// The word Koordinator's parse errors use.
    fn parse_name(self) -> &'static str {
        match self {
            ConfigKey::Colocation => "colocation",
            ConfigKey::ResourceThreshold => "resourceThreshold",
            ConfigKey::ResourceQos => "ResourceQOS",
            ConfigKey::System => "System",
            ConfigKey::CpuBurst => "CpuBurst",
        }
    }
}

/// One parsed key.
// Parsed once per admission and dropped with it: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    Colocation(ColocationCfg),
    ResourceThreshold(ResourceThresholdCfg),
    ResourceQos(ResourceQosCfg),
    System(SystemCfg),
    CpuBurst(CpuBurstCfg),
}

fn profiles_of<S>(cfg: &StrategyCfg<S>) -> Vec<&NodeCfgProfile> {
    cfg.node_strategies.iter().map(|n| &n.profile).collect()
}

impl Parsed {
    pub fn parse(key: ConfigKey, text: &str) -> Result<Self, serde_json::Error> {
        Ok(match key {
            ConfigKey::Colocation => Parsed::Colocation(go_json::from_str(text)?),
            ConfigKey::ResourceThreshold => Parsed::ResourceThreshold(go_json::from_str(text)?),
            ConfigKey::ResourceQos => Parsed::ResourceQos(go_json::from_str(text)?),
            ConfigKey::System => {
                let value = go_json::read(text)?;
                Parsed::System(
                    SystemCfg::deserialize(&value)
                        .map_err(|e| quantity_error(&value).unwrap_or(e))?,
                )
            }
            ConfigKey::CpuBurst => Parsed::CpuBurst(go_json::from_str(text)?),
        })
    }

    /// The node strategies' names and selectors, in config order.
    pub fn profiles(&self) -> Vec<&NodeCfgProfile> {
        match self {
            Parsed::Colocation(c) => c.node_configs.iter().map(|n| &n.profile).collect(),
            Parsed::ResourceThreshold(c) => profiles_of(c),
            Parsed::ResourceQos(c) => profiles_of(c),
            Parsed::System(c) => profiles_of(c),
            Parsed::CpuBurst(c) => profiles_of(c),
        }
    }

    fn violations(&self) -> rules::Violations {
        match self {
            Parsed::Colocation(c) => rules::check_colocation(c),
            Parsed::ResourceThreshold(c) => {
                rules::check_key("ResourceThresholdCfg", "ResourceThresholdStrategy", c)
            }
            Parsed::ResourceQos(c) => rules::check_key("ResourceQOSCfg", "ResourceQOSStrategy", c),
            Parsed::System(c) => rules::check_key("SystemCfg", "SystemStrategy", c),
            Parsed::CpuBurst(c) => rules::check_key("CPUBurstCfg", "CPUBurstStrategy", c),
        }
    }
}

/// The error of a `totalNetworkBandwidth` of `system-config` that is not a quantity. Go reports a
/// field's own decoding error (a `resource.Quantity`'s) at once, and a plain type mismatch only at
/// the end, so the quantity's error is the one Koordinator shows when a config has both.
fn quantity_error(value: &serde_json::Value) -> Option<serde_json::Error> {
    let nodes = value.get("nodeStrategies").and_then(|n| n.as_array());
    let strategies = std::iter::once(value.get("clusterStrategy"))
        .chain(nodes.into_iter().flatten().map(Some))
        .flatten();
    strategies
        .filter_map(|s| s.get("totalNetworkBandwidth"))
        .find_map(|q| GoQuantity::deserialize(q).err())
}

/// `system-config` as the check of `resource-qos-config` reads it (its network QoS totals).
/// Koordinator parses it with the QoS key: absent, it is empty text, which does not parse; `null`
/// leaves no system config, and then network QoS is not checked at all.
#[derive(Debug, Clone, PartialEq)]
pub enum SystemForQos {
    Parsed(SystemCfg),
    Null,
    /// The parser's error.
    Unreadable(String),
}

impl SystemForQos {
    pub fn read(text: Option<&str>) -> Self {
        let text = text.unwrap_or_default();
        if go_json::read(text).is_ok_and(|v| v.is_null()) {
            return SystemForQos::Null;
        }
        match Parsed::parse(ConfigKey::System, text) {
            Ok(Parsed::System(s)) => SystemForQos::Parsed(s),
            Ok(_) => SystemForQos::Null,
            Err(e) => SystemForQos::Unreadable(e.to_string()),
        }
    }
}

/// What a key's check needs besides its text.
pub struct CheckEnv<'a> {
    /// `namespace/name` of the ConfigMap, for parse errors.
    pub config_map: &'a str,
    pub name_need_check: bool,
    /// `system-config` of the same ConfigMap (network QoS totals).
    pub system: &'a SystemForQos,
}

/// The checks of one key, in order: parse, node selectors, field rules, names, overlap.
pub fn check_key(key: ConfigKey, text: &str, env: &CheckEnv<'_>) -> Result<Parsed, ConfigError> {
    let parse_failed = |key: ConfigKey, e: &dyn std::fmt::Display| {
        ConfigError::ParseConfigFail(format!(
            "Failed to parse {} config in configmap {}, err: {e}",
            key.parse_name(),
            env.config_map
        ))
    };
    let parsed = Parsed::parse(key, text).map_err(|e| parse_failed(key, &e))?;
    // The QoS key's check reads the system config right after its own text.
    let system = match (&parsed, env.system) {
        (Parsed::ResourceQos(_), SystemForQos::Unreadable(e)) => {
            return Err(parse_failed(ConfigKey::System, e));
        }
        (_, SystemForQos::Parsed(s)) => Some(s),
        _ => None,
    };
    let config = key.data_key();
    let profiles = parsed.profiles();
    for profile in &profiles {
        let selector = profile
            .node_selector
            .as_ref()
            .filter(|s| !selectors::is_empty(s));
        let Some(selector) = selector else {
            return Err(ConfigError::ConfigParamInvalid(format!(
                "nodeConfigs NodeSelector must not empty error! configType: {config},nodeConfig name:{}",
                profile.name
            )));
        };
        if let Some(e) = selectors::kubernetes::as_selector_error(selector) {
            return Err(ConfigError::ConfigParamInvalid(format!(
                "failed to parse node selector {},configType: {config},nodeConfig name:{}, err: {e}",
                selectors::kubernetes::go_string(selector),
                profile.name
            )));
        }
    }
    let violations = parsed.violations();
    if !violations.errors.is_empty() {
        return Err(ConfigError::FieldsInvalid(violations.errors));
    }
    if let Parsed::ResourceQos(qos) = &parsed {
        network_qos::check(qos, system).map_err(ConfigError::Plain)?;
    }
    if env.name_need_check {
        let mut seen = BTreeSet::new();
        for profile in &profiles {
            if profile.name.is_empty() {
                return Err(ConfigError::ConfigParamInvalid(format!(
                    "nodeConfig Name need! configType:{config}"
                )));
            }
            if !seen.insert(profile.name.as_str()) {
                return Err(ConfigError::ConfigParamInvalid(format!(
                    "nodeConfig Name confilict, configType:{config},nodeConfig Name:{}! ",
                    profile.name
                )));
            }
        }
    }
    let overlap = overlap::first_overlap(&profiles).map_err(|e| {
        ConfigError::ConfigParamInvalid(format!(
            "nodeStrategies of {config}: checking {} strategies for overlapping node selectors needs \
             more than {} label comparisons; use fewer strategies, fewer expressions or fewer values \
             per expression",
            e.strategies,
            overlap::MAX_SELECTOR_STEPS
        ))
    })?;
    if let Some(strategies) = overlap {
        return Err(ConfigError::NodeStrategiesOverlap {
            config: config.to_owned(),
            strategies,
        });
    }
    Ok(parsed)
}

/// The first node (in name order) that several strategies of one of `checked` match, checked node by
/// node; refused before any work when it would cost more than [`overlap::MAX_SELECTOR_STEPS`] for a
/// key.
pub fn cluster_conflict(
    checked: &[(ConfigKey, Parsed)],
    nodes: &[(String, Labels)],
) -> Result<(), ConfigError> {
    for (key, parsed) in checked {
        overlap::within_budget(&parsed.profiles(), Some(nodes.len())).map_err(|e| {
            ConfigError::ConfigParamInvalid(format!(
                "nodeStrategies of {}: checking {} strategies against the cluster's {} nodes needs \
                 more than {} label comparisons; use fewer strategies or smaller node selectors",
                key.data_key(),
                e.strategies,
                nodes.len(),
                overlap::MAX_SELECTOR_STEPS
            ))
        })?;
    }
    for (node, labels) in nodes {
        for (key, parsed) in checked {
            if let Some(conflict) = node_conflict(*key, parsed, node, labels) {
                return Err(conflict);
            }
        }
    }
    Ok(())
}

/// The conflict a node's labels cause when several strategies of a key match it.
pub fn node_conflict(
    key: ConfigKey,
    parsed: &Parsed,
    node: &str,
    labels: &Labels,
) -> Option<ConfigError> {
    let profiles = parsed.profiles();
    if profiles.len() < 2 {
        return None;
    }
    let strategies = overlap::matching(&profiles, labels);
    (strategies.len() > 1).then(|| ConfigError::ExistNodeConfict {
        config: key.data_key().to_owned(),
        strategies,
        example_nodes: vec![node.to_owned()],
    })
}

/// Every key that parses and whose node selectors are all usable, for checks that skip the rest
/// ("force parse": Koordinator leaves out a key whose checker does not initialise).
pub fn parse_leniently(
    data: &std::collections::BTreeMap<String, String>,
) -> Vec<(ConfigKey, Parsed)> {
    ConfigKey::CHECK_ORDER
        .into_iter()
        .filter_map(|key| {
            let text = data.get(key.data_key()).filter(|t| !t.is_empty())?;
            let parsed = Parsed::parse(key, text).ok()?;
            let usable = parsed.profiles().iter().all(|p| {
                p.node_selector.as_ref().is_some_and(|s| {
                    !selectors::is_empty(s) && selectors::kubernetes::as_selector_error(s).is_none()
                })
            });
            usable.then_some((key, parsed))
        })
        .collect()
}

#[cfg(test)]
mod tests;
