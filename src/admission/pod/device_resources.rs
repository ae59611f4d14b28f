//! GPU requests in the forms the device scheduler understands: a whole `koordinator.sh/gpu`
//! becomes gpu-core and gpu-memory-ratio, and every GPU container gets a `gpu.shared` count.

use std::collections::BTreeMap;

use crate::admission::pod::object::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Mutator, Step};
use crate::admission::outcome::Rejection;
use crate::apis::keys::{GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU_SHARED};
use crate::features::{FeatureGates, Gate};
use crate::resources::{Format, Qty};

const GPU_RESOURCES: [&str; 5] = [GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU_SHARED];

pub struct NormaliseDeviceResources;

impl Mutator<Pod> for NormaliseDeviceResources {
    fn name(&self) -> &'static str {
        "DeviceResourceSpec"
    }

    fn enabled(&self, gates: &FeatureGates) -> bool {
        !gates.enabled(Gate::DisableDeviceResourceSpec)
    }

    fn mutate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>, pod: &'a mut Pod) -> Step<'a> {
        if !matches!(ctx.operation(), Operation::Create) {
            return Ok(()).into();
        }
        let mut result = Ok(());
        for c in pod.spec.iter_mut().flat_map(|s| s.containers.iter_mut()) {
            if let Err(e) = normalise(c) {
                result = Err(Rejection::internal(e));
                break;
            }
        }
        result.into()
    }
}

fn units(list: &BTreeMap<String, Quantity>, name: &str) -> Result<Option<i128>, String> {
    list.get(name)
        .map(|q| {
            Qty::try_from(q)
                .map(|q| q.units_ceil())
                .map_err(|e| e.to_string())
        })
        .transpose()
}

fn count(n: i128) -> Quantity {
    Qty::from_milli(n * 1000, Format::DecimalSI).to_quantity()
}

/// `shared` for a value: hundreds of percent mean that many GPUs, anything else one.
fn shares(value: i128) -> i128 {
    if value > 100 && value % 100 == 0 {
        value / 100
    } else {
        1
    }
}

pub fn normalise(c: &mut Container) -> Result<(), String> {
    let Some(resources) = c.resources.as_mut() else {
        return Ok(());
    };
    let has_gpu = |l: &Option<BTreeMap<String, Quantity>>| {
        l.as_ref()
            .is_some_and(|l| GPU_RESOURCES.iter().any(|r| l.contains_key(*r)))
    };
    if !has_gpu(&resources.requests) && !has_gpu(&resources.limits) {
        return Ok(());
    }
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    let had_shared = requests.contains_key(GPU_SHARED);
    let gpu = units(requests, GPU)?;
    if gpu.is_none() && had_shared {
        return Ok(());
    }
    // Koordinator writes into a missing limits map and crashes; we create it.
    let limits = resources.limits.get_or_insert_with(BTreeMap::new);
    if let Some(gpu) = gpu {
        for list in [&mut *requests, &mut *limits] {
            list.insert(GPU_CORE.to_owned(), count(gpu));
            list.insert(GPU_MEMORY_RATIO.to_owned(), count(gpu));
            list.remove(GPU);
        }
    }
    if !had_shared {
        let shared = match (
            units(requests, GPU_MEMORY_RATIO)?,
            units(requests, GPU_CORE)?,
        ) {
            (Some(ratio), _) => shares(ratio),
            (None, Some(core)) => shares(core),
            (None, None) => 1,
        };
        requests.insert(GPU_SHARED.to_owned(), count(shared));
        limits.insert(GPU_SHARED.to_owned(), count(shared));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container(resources: serde_json::Value) -> Container {
        serde_json::from_value(json!({"name": "c", "resources": resources})).unwrap()
    }

    fn resources(c: &Container) -> serde_json::Value {
        serde_json::to_value(c.resources.as_ref().unwrap()).unwrap()
    }

    #[test]
    fn whole_gpus_become_core_ratio_and_shares() {
        let mut c = container(
            json!({"requests": {"koordinator.sh/gpu": "200"}, "limits": {"koordinator.sh/gpu": "200"}}),
        );
        normalise(&mut c).unwrap();
        let expected = json!({"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200", "koordinator.sh/gpu.shared": "2"});
        assert_eq!(
            resources(&c),
            json!({"requests": expected, "limits": expected})
        );
    }

    #[test]
    fn shares_from_ratio_then_core_and_limits_created() {
        let mut c = container(
            json!({"requests": {"koordinator.sh/gpu-core": "300", "koordinator.sh/gpu-memory-ratio": "50"}}),
        );
        normalise(&mut c).unwrap();
        assert_eq!(
            resources(&c)["limits"],
            json!({"koordinator.sh/gpu.shared": "1"})
        );
        let mut c = container(json!({"requests": {"koordinator.sh/gpu-core": "300"}}));
        normalise(&mut c).unwrap();
        assert_eq!(resources(&c)["requests"]["koordinator.sh/gpu.shared"], "3");
        // Already shared, or no GPU at all: untouched.
        let mut c = container(
            json!({"requests": {"koordinator.sh/gpu.shared": "2", "koordinator.sh/gpu-core": "100"}}),
        );
        let before = c.clone();
        normalise(&mut c).unwrap();
        assert_eq!(c, before);
        let mut c = container(json!({"requests": {"cpu": "1"}}));
        let before = c.clone();
        normalise(&mut c).unwrap();
        assert_eq!(c, before);
    }
}
