//! /validate-configmap plugins (slo-controller-config).

use k8s_openapi::api::core::v1::ConfigMap;

use super::chain::Validator;

pub fn validators() -> Vec<Box<dyn Validator<ConfigMap>>> {
    vec![]
}
