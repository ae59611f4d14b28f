//! (gate MultiQuotaTree) A pod whose quota belongs to a quota tree is kept on that tree's
//! nodes: the node selector of the tree's ElasticQuotaProfile joins every required node-affinity term.

use crate::apis::meta::label;
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};

use crate::admission::pod::object::Pod;
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Mutator, Step};
use crate::apis::ElasticQuotaProfile;
use crate::apis::keys::{QUOTA_NAME, QUOTA_TREE_ID};
use crate::features::{FeatureGates, Gate};

pub struct MultiQuotaTreeAffinity;

impl Mutator<Pod> for MultiQuotaTreeAffinity {
    fn name(&self) -> &'static str {
        "MultiQuotaTreeAffinity"
    }

    fn enabled(&self, gates: &FeatureGates) -> bool {
        gates.enabled(Gate::MultiQuotaTree)
    }

    fn mutate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>, pod: &'a mut Pod) -> Step<'a> {
        if matches!(ctx.operation(), Operation::Create) {
            let namespace = super::object::pod_namespace(pod, ctx.request.namespace.as_deref());
            if let Some(requirements) = tree_requirements(ctx, pod, namespace) {
                add_requirements(pod, requirements);
            }
        }
        Ok(()).into()
    }
}

/// The node requirements of the pod's quota tree, if it has one with a profile.
fn tree_requirements(
    ctx: &Ctx<'_, Pod>,
    pod: &Pod,
    namespace: &str,
) -> Option<Vec<NodeSelectorRequirement>> {
    let quota_name = label(pod, QUOTA_NAME)
        .filter(|q| !q.is_empty())
        .unwrap_or(namespace);
    let tree_id = {
        let topology = ctx.cache.topology();
        let info = topology.get(quota_name).or_else(|| {
            topology
                .quota_for_namespace(namespace)
                .and_then(|q| topology.get(q))
        })?;
        Some(info.tree_id.clone()).filter(|t| !t.is_empty())?
    };
    let mut profiles: Vec<_> = ctx
        .cache
        .elastic_quota_profiles
        .state()
        .into_iter()
        .filter(|p| label(p.as_ref(), QUOTA_TREE_ID) == Some(tree_id.as_str()))
        .collect();
    profiles.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let profile: &ElasticQuotaProfile = profiles.first()?;
    let selector = &profile.spec.node_selector;
    let mut requirements: Vec<NodeSelectorRequirement> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| NodeSelectorRequirement {
            key: k.clone(),
            operator: "In".to_owned(),
            values: Some(vec![v.clone()]),
        })
        .collect();
    requirements.extend(selector.match_expressions.iter().flatten().map(|e| {
        NodeSelectorRequirement {
            key: e.key.clone(),
            operator: e.operator.clone(),
            values: e.values.clone(),
        }
    }));
    Some(requirements)
}

/// Appends the requirements to every required term, or makes the first term of them.
fn add_requirements(pod: &mut Pod, requirements: Vec<NodeSelectorRequirement>) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    let required = spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm {
            match_expressions: Some(requirements),
            match_fields: None,
        });
        return;
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .extend(requirements.iter().cloned());
    }
}
