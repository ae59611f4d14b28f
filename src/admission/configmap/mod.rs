//! /validate-configmap plugins (slo-controller-config).

use k8s_openapi::api::core::v1::ConfigMap;

use super::chain::Validator;

mod slo_config;

pub fn validators() -> Vec<Box<dyn Validator<ConfigMap>>> {
    vec![Box::new(slo_config::SloConfigCheck)]
}
