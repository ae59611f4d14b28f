//! (gate ValidatePodDeviceResource) GPU requests that the device scheduler can honour.

use std::collections::BTreeMap;

use crate::admission::pod::object::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::apis::keys::{GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU_SHARED, NPU_CORE};
use crate::features::{FeatureGates, Gate};
use crate::kubernetes_errors::aggregate;
use crate::resources::Qty;

const FIELD: &str = "pod.spec.containers[*].resources.requests";

pub struct DeviceResourceRules;

impl Validator<Pod> for DeviceResourceRules {
    fn name(&self) -> &'static str {
        "DeviceResource"
    }

    fn enabled(&self, gates: &FeatureGates) -> bool {
        gates.enabled(Gate::ValidatePodDeviceResource)
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        if !matches!(ctx.operation(), Operation::Create | Operation::Update) {
            return Ok(()).into();
        }
        let mut errors = Vec::new();
        for c in ctx
            .object()
            .iter()
            .filter_map(|p| p.spec.as_ref())
            .flat_map(|s| &s.containers)
        {
            let empty = BTreeMap::new();
            let requests = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .unwrap_or(&empty);
            if let Some(e) = check_container(requests) {
                errors.push(e);
            }
        }
        match aggregate(errors) {
            Some(message) => Err(Rejection::invalid(message)).into(),
            None => Ok(()).into(),
        }
    }
}

fn value(requests: &BTreeMap<String, Quantity>, name: &str) -> Option<i128> {
    requests
        .get(name)
        .map(|q| Qty::try_from(q).map_or(0, |q| q.units_ceil()))
}

pub fn check_container(requests: &BTreeMap<String, Quantity>) -> Option<String> {
    let (gpu, shared) = (value(requests, GPU), value(requests, GPU_SHARED));
    if gpu.is_some() && shared.is_some() {
        return Some(format!(
            "{FIELD}: Forbidden: Forbidden declare GPU and GPU share at same time"
        ));
    }
    if let Some(g) = gpu {
        if g == 0 {
            return Some(format!(
                "{FIELD}: Invalid value: \"0\": the requested GPU must be greater than zero"
            ));
        }
        if g > 100 && g % 100 != 0 {
            return Some(format!(
                "{FIELD}: Invalid value: \"{g}\": the requested GPU must be percentage of 100"
            ));
        }
    }
    let s = shared?;
    if s == 0 {
        return Some(format!(
            "{FIELD}: Invalid value: \"0\": the requested GPU must be greater than zero"
        ));
    }
    if value(requests, NPU_CORE).unwrap_or(0) != 0 {
        return None;
    }
    let memory = value(requests, GPU_MEMORY).unwrap_or(0);
    let ratio = value(requests, GPU_MEMORY_RATIO).unwrap_or(0);
    let core = value(requests, GPU_CORE).unwrap_or(0);
    match (memory, ratio) {
        (0, 0) => {
            return Some(format!(
                "{FIELD}: Forbidden: GPU memory and GPU memory ratio all is zero"
            ));
        }
        (m, r) if m != 0 && r != 0 => {
            return Some(format!(
                "{FIELD}: Forbidden: declare GPU memory and GPU memory ratio at same time"
            ));
        }
        _ => {}
    }
    if core % s != 0 {
        return Some(format!(
            "{FIELD}: Invalid value: \"{core}\": the requested gpuCore must multiple of shared"
        ));
    }
    if ratio % s != 0 {
        return Some(format!(
            "{FIELD}: Invalid value: \"{ratio}\": the requested gpuMemoryRatio must multiple of shared"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    }

    #[test]
    fn each_rule_and_message() {
        let f = FIELD;
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<String>);
        let cases: &[Case] = &[
            (
                &[(GPU, "1"), (GPU_SHARED, "1")],
                Some(format!(
                    "{f}: Forbidden: Forbidden declare GPU and GPU share at same time"
                )),
            ),
            (
                &[(GPU, "0")],
                Some(format!(
                    "{f}: Invalid value: \"0\": the requested GPU must be greater than zero"
                )),
            ),
            (
                &[(GPU, "150")],
                Some(format!(
                    "{f}: Invalid value: \"150\": the requested GPU must be percentage of 100"
                )),
            ),
            (&[(GPU, "50")], None),
            (&[(GPU, "200")], None),
            (
                &[(GPU_SHARED, "0")],
                Some(format!(
                    "{f}: Invalid value: \"0\": the requested GPU must be greater than zero"
                )),
            ),
            (&[(GPU_SHARED, "1"), (NPU_CORE, "1")], None),
            (
                &[(GPU_SHARED, "1")],
                Some(format!(
                    "{f}: Forbidden: GPU memory and GPU memory ratio all is zero"
                )),
            ),
            (
                &[
                    (GPU_SHARED, "1"),
                    (GPU_MEMORY, "1Gi"),
                    (GPU_MEMORY_RATIO, "50"),
                ],
                Some(format!(
                    "{f}: Forbidden: declare GPU memory and GPU memory ratio at same time"
                )),
            ),
            (
                &[(GPU_SHARED, "2"), (GPU_CORE, "3"), (GPU_MEMORY, "1Gi")],
                Some(format!(
                    "{f}: Invalid value: \"3\": the requested gpuCore must multiple of shared"
                )),
            ),
            (
                &[(GPU_SHARED, "2"), (GPU_CORE, "4"), (GPU_MEMORY_RATIO, "5")],
                Some(format!(
                    "{f}: Invalid value: \"5\": the requested gpuMemoryRatio must multiple of shared"
                )),
            ),
            (
                &[
                    (GPU_SHARED, "2"),
                    (GPU_CORE, "200"),
                    (GPU_MEMORY_RATIO, "200"),
                ],
                None,
            ),
        ];
        for (requests, expected) in cases {
            assert_eq!(check_container(&req(requests)), *expected, "{requests:?}");
        }
    }
}
