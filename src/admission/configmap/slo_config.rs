//! Spec 9: the slo-controller ConfigMap must hold valid strategies whose node selectors neither
//! overlap nor both match a node of the cluster. Only keys that are new or changed are checked, so an
//! invalid value already stored does not block unrelated edits.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::{PluginResult, Rejection};
use crate::slo_config::{self, CheckEnv, ConfigKey, Parsed};

pub struct SloConfigCheck;

impl Validator<ConfigMap> for SloConfigCheck {
    fn name(&self) -> &'static str {
        "SLOControllerConfigCheck"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, ConfigMap>) -> Step<'a> {
        check(ctx).into()
    }
}

fn check(ctx: &Ctx<'_, ConfigMap>) -> PluginResult {
    if matches!(ctx.operation(), Operation::Delete | Operation::Connect) {
        return Ok(());
    }
    let Some(config_map) = ctx.object() else {
        return Ok(());
    };
    let namespace = config_map
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(ctx.request.namespace.as_deref().unwrap_or_default());
    let name = config_map
        .metadata
        .name
        .as_deref()
        .unwrap_or(&ctx.request.name);
    if !ctx.settings.is_slo_config(namespace, name) {
        return Ok(());
    }
    let empty = Default::default();
    let data = config_map.data.as_ref().unwrap_or(&empty);
    let old_data = ctx.old_object().and_then(|o| o.data.as_ref());
    let creating = matches!(ctx.operation(), Operation::Create);

    // Network QoS totals come from the same ConfigMap's system-config, when it parses.
    let system = data.get(ConfigKey::System.data_key()).and_then(|t| {
        match Parsed::parse(ConfigKey::System, t) {
            Ok(Parsed::System(s)) => Some(s),
            _ => None,
        }
    });
    let config_map_name = format!("{namespace}/{name}");
    let env = CheckEnv {
        config_map: &config_map_name,
        name_need_check: ctx.settings.node_strategy_name_need_check,
        system: system.as_ref(),
    };

    let mut checked = Vec::new();
    for key in ConfigKey::CHECK_ORDER {
        let Some(text) = data.get(key.data_key()).filter(|t| !t.is_empty()) else {
            continue;
        };
        let unchanged = old_data.and_then(|o| o.get(key.data_key())) == Some(text);
        if !creating && unchanged {
            continue;
        }
        let parsed = slo_config::check_key(key, text, &env)
            .map_err(|e| Rejection::invalid(e.to_string()))?;
        checked.push((key, parsed));
    }

    if checked.iter().any(|(_, p)| p.profiles().len() > 1) {
        for (node, labels) in ctx.cache.node_labels() {
            for (key, parsed) in &checked {
                if let Some(conflict) = slo_config::node_conflict(*key, parsed, &node, &labels) {
                    return Err(Rejection::invalid(conflict.to_string()));
                }
            }
        }
    }
    Ok(())
}
