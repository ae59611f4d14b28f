//! The chain behind each endpoint of the table, and every rule of every endpoint by name (what
//! `--rule-action` and the settings may name): a new endpoint's chain is built here
//! (`build_endpoint`); a new rule is registered in its folder's `mod.rs`, which this reads.

use super::actions;
use super::endpoint::{Endpoint, TypedEndpoint};
use super::{colocation_profile, configmap, elastic_quota, node, patch, pod, reservation};
use crate::entries::{ENDPOINTS, EndpointName, EndpointSpec};

/// Every rule of every endpoint, whatever the gates, by name (a rule on two endpoints, as the
/// colocation profile's on pods and Reservations, once): what `--rule-action` may name.
pub fn registered_rules() -> Vec<actions::Rule> {
    let mut rules: Vec<actions::Rule> = Vec::new();
    for spec in ENDPOINTS {
        for (name, shadowable) in build_endpoint(spec).rules() {
            match rules.iter_mut().find(|r| r.name == name) {
                Some(rule) => rule.webhooks.push(spec.path),
                None => rules.push(actions::Rule {
                    name,
                    kind: spec.kind,
                    shadowable,
                    webhooks: vec![spec.path],
                }),
            }
        }
    }
    rules
}

/// The chain behind each endpoint of the table: an exhaustive match, so a new [`EndpointName`]
/// does not build until it has one.
pub(super) fn build_endpoint(spec: &'static EndpointSpec) -> Endpoint {
    match spec.endpoint {
        EndpointName::MutatePod => Endpoint::Pod(
            TypedEndpoint::mutating_with_differ(spec, pod::mutators(), patch::pod::diff)
                .requiring_object(),
        ),
        EndpointName::ValidatePod => {
            Endpoint::Pod(TypedEndpoint::validating(spec, pod::validators()))
        }
        EndpointName::MutateElasticQuota => Endpoint::ElasticQuota(
            TypedEndpoint::mutating(spec, elastic_quota::mutators()).requiring_object(),
        ),
        EndpointName::ValidateElasticQuota => {
            Endpoint::ElasticQuota(TypedEndpoint::validating(spec, elastic_quota::validators()))
        }
        EndpointName::MutateNodeStatus => {
            Endpoint::Node(TypedEndpoint::mutating(spec, node::status_mutators()))
        }
        EndpointName::ValidateNode => {
            Endpoint::Node(TypedEndpoint::validating(spec, node::validators()))
        }
        EndpointName::MutateReservation => {
            Endpoint::Reservation(TypedEndpoint::mutating(spec, reservation::mutators()))
        }
        EndpointName::ValidateColocationProfile => Endpoint::ColocationProfile(
            TypedEndpoint::validating(spec, colocation_profile::validators()),
        ),
        EndpointName::ValidateConfigMap => {
            Endpoint::ConfigMap(TypedEndpoint::validating(spec, configmap::validators()))
        }
    }
}
