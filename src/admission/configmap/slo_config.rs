//! The slo-controller ConfigMap must hold valid strategies whose node selectors neither
//! overlap nor both match a node of the cluster. Only keys that are new or changed are checked, so an
//! invalid value already stored does not block unrelated edits.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::offload;
use crate::admission::outcome::{PluginResult, Rejection};
use crate::cache::Cache;
use crate::slo_config::{self, CheckEnv, ConfigKey, SystemForQos};

pub struct SloConfigCheck;

impl Validator<ConfigMap> for SloConfigCheck {
    fn name(&self) -> &'static str {
        "SLOControllerConfigCheck"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, ConfigMap>) -> Step<'a> {
        match Input::of(ctx) {
            // What the API server stores at most: a larger one is forged, and its JSON read as
            // trees would cost tens of times its text (a 7.9 MB `[[0],...]` took 326 MiB).
            Some(input) if input.data_bytes() > MAX_CONFIG_MAP_DATA => {
                Err(Rejection::invalid(format!(
                    "data: Too long: must have at most {MAX_CONFIG_MAP_DATA} bytes (the API \
                     server's limit on a ConfigMap)"
                )))
                .into()
            }
            // Parsing and the overlap checks cost up to the documented limits: off the async worker.
            Some(input) => Step::Pending(Box::pin(offload::heavy(move || check(input)))),
            None => Ok(()).into(),
        }
    }
}

/// The most data a ConfigMap may hold (the API server's `MaxSecretSize`, which it applies to
/// ConfigMaps too): 1 MiB.
pub const MAX_CONFIG_MAP_DATA: usize = 1024 * 1024;

/// What the check reads, owned so that it can run on the blocking pool.
struct Input {
    config_map_name: String,
    data: BTreeMap<String, String>,
    /// The stored data on UPDATE; `None` on CREATE (every key is checked).
    old_data: Option<BTreeMap<String, String>>,
    name_need_check: bool,
    cache: Cache,
}

impl Input {
    /// The bytes of the data's keys and values, as the API server counts them.
    fn data_bytes(&self) -> usize {
        self.data.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// `None` when the request is not a CREATE or UPDATE of the slo-controller ConfigMap.
    fn of(ctx: &Ctx<'_, ConfigMap>) -> Option<Self> {
        if matches!(ctx.operation(), Operation::Delete | Operation::Connect) {
            return None;
        }
        let config_map = ctx.object()?;
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
            return None;
        }
        let creating = matches!(ctx.operation(), Operation::Create);
        Some(Self {
            config_map_name: format!("{namespace}/{name}"),
            data: config_map.data.clone().unwrap_or_default(),
            old_data: if creating {
                None
            } else {
                Some(
                    ctx.old_object()
                        .and_then(|o| o.data.clone())
                        .unwrap_or_default(),
                )
            },
            name_need_check: ctx.settings.node_strategy_name_need_check,
            cache: ctx.cache.clone(),
        })
    }
}

fn check(input: Input) -> PluginResult {
    let data = &input.data;
    // Network QoS totals come from the same ConfigMap's system-config.
    let system = SystemForQos::read(data.get(ConfigKey::System.data_key()).map(String::as_str));
    let env = CheckEnv {
        config_map: &input.config_map_name,
        name_need_check: input.name_need_check,
        system: &system,
    };

    let mut checked = Vec::new();
    for key in ConfigKey::CHECK_ORDER {
        let Some(text) = data.get(key.data_key()).filter(|t| !t.is_empty()) else {
            continue;
        };
        let unchanged = input
            .old_data
            .as_ref()
            .is_some_and(|o| o.get(key.data_key()) == Some(text));
        if unchanged {
            continue;
        }
        let parsed = slo_config::check_key(key, text, &env)
            .map_err(|e| Rejection::invalid(e.to_string()))?;
        checked.push((key, parsed));
    }

    if checked.iter().any(|(_, p)| p.profiles().len() > 1) {
        slo_config::cluster_conflict(&checked, &input.cache.node_labels())
            .map_err(|e| Rejection::invalid(e.to_string()))?;
    }
    Ok(())
}
