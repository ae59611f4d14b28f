//! Pod entries. A pod needs `/mutate-pod` or `/validate-pod` when it carries something Koordinator
//! reads (a `koordinator.sh` label or annotation key, an extended resource, on UPDATE a changed
//! priority), or when the cluster makes it relevant: a ClusterColocationProfile selects it
//! (`mpod-create`), or its namespace resolves to a parent quota (`vpod`). The first part is the
//! pod's own and never goes stale; the second is a [`Reach`] the operator derives from its cache
//! and widens before a change that needs more is stored (docs/narrowing.md, "Pods").

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use super::calls::{Calls, Condition};
use super::cel::{Meta, Var, exists, has_key, is_literal, literal};
use crate::apis::keys::{DEFAULT_QUOTA, QOS_CLASS_LABEL};
use crate::apis::{ClusterColocationProfile, ElasticQuota};
use crate::cache::quota_topology::QuotaInfo;
use crate::features::{FeatureGates, Gate};
use crate::selectors;

/// Beyond the pod's own markers, which requests a pod entry is sent: every one, or those matching
/// one of a set of terms (for `mpod-create` CEL expressions of profile selectors, for `vpod`
/// namespace names). Ordered by coverage: `Every` covers everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reach {
    #[default]
    Every,
    Only(BTreeSet<String>),
}

/// Above this many terms (or this much expression text) a pod entry is written wide: wider, never
/// narrower, and bounded in what the API server evaluates per request.
pub const MAX_TERMS: usize = 256;
const MAX_EXPRESSION: usize = 32 * 1024;

impl Reach {
    pub fn nothing() -> Self {
        Reach::Only(BTreeSet::new())
    }

    /// Whether every request `other` names is named here.
    pub fn covers(&self, other: &Reach) -> bool {
        match (self, other) {
            (Reach::Every, _) => true,
            (Reach::Only(_), Reach::Every) => false,
            (Reach::Only(mine), Reach::Only(theirs)) => theirs.is_subset(mine),
        }
    }

    /// Both together.
    pub fn union(self, other: Reach) -> Reach {
        match (self, other) {
            (Reach::Only(mut a), Reach::Only(b)) => {
                a.extend(b);
                Reach::Only(a)
            }
            _ => Reach::Every,
        }
    }

    fn bounded(self) -> Reach {
        match self {
            Reach::Only(terms) if terms.len() > MAX_TERMS => Reach::Every,
            other => other,
        }
    }
}

/// The reach of both pod entries, as the leader writes them (manifests and chart: [`Reach::Every`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodReach {
    /// `mpod-create`: the selectors of the profiles.
    pub create: Reach,
    /// `vpod`: the namespaces resolving to a parent quota.
    pub validate: Reach,
}

/// Which pod entry a reach belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodEntry {
    Create,
    Validate,
}

/// What one ClusterColocationProfile adds to `mpod-create`'s reach: its pod selector (the
/// namespaceSelector is not read: the API server gives match conditions no namespace object, so a
/// profile counts for every namespace, wider). A selector that matches every pod, or that a CEL
/// literal cannot hold, makes it every request; a malformed one matches nothing (the rule skips it).
pub fn profile_reach(profile: &ClusterColocationProfile) -> Reach {
    let Some(selector) = profile.spec.selector.as_ref() else {
        return Reach::Every;
    };
    if selectors::validate(selector).is_err() {
        return Reach::nothing();
    }
    match selector_expression(selector) {
        Some(expression) => Reach::Only(BTreeSet::from([expression])),
        None => Reach::Every,
    }
}

/// What one ElasticQuota adds to `vpod`'s reach: for a parent quota, every namespace a pod could
/// resolve to it by (its own name, and the namespaces it binds), whatever other quota might take
/// precedence (wider, and a function of this quota alone, so a stale view of the others cannot
/// narrow it). The default quota as a parent concerns every namespace.
pub fn quota_reach(quota: &ElasticQuota) -> Reach {
    let info = QuotaInfo::from_quota(quota);
    if !info.is_parent {
        return Reach::nothing();
    }
    if info.name == DEFAULT_QUOTA {
        return Reach::Every;
    }
    let names = std::iter::once(info.name).chain(info.namespaces);
    let mut terms = BTreeSet::new();
    for name in names {
        if !is_literal(&name) {
            return Reach::Every;
        }
        terms.insert(name);
    }
    Reach::Only(terms)
}

/// `mpod-create`'s reach from every profile the cache holds.
pub fn create_reach<'a>(profiles: impl IntoIterator<Item = &'a ClusterColocationProfile>) -> Reach {
    profiles
        .into_iter()
        .map(profile_reach)
        .fold(Reach::nothing(), Reach::union)
        .bounded()
}

/// `vpod`'s reach from every quota the cache holds.
pub fn validate_reach<'a>(quotas: impl IntoIterator<Item = &'a ElasticQuota>) -> Reach {
    quotas
        .into_iter()
        .map(quota_reach)
        .fold(Reach::nothing(), Reach::union)
        .bounded()
}

/// Whether the gates make every pod relevant to the entry whatever the cache holds.
pub fn every_pod(entry: PodEntry, gates: &FeatureGates) -> bool {
    match entry {
        // The tree of a pod's quota (by label, namespace or default) decides its node affinity.
        PodEntry::Create => gates.enabled(Gate::MultiQuotaTree),
        // Every pod counts against a quota (the default one at least); the enhanced validator's
        // rules are a ConfigMap's.
        PodEntry::Validate => {
            gates.enabled(Gate::EnableQuotaAdmission)
                || gates.enabled(Gate::EnablePodEnhancedValidator)
        }
    }
}

/// The entry's calls under these gates and this reach.
pub fn calls(entry: PodEntry, gates: &FeatureGates, reach: &Reach) -> Calls {
    let Reach::Only(terms) = reach else {
        return Calls::All;
    };
    if every_pod(entry, gates) {
        return Calls::All;
    }
    // The cheap parts first: `||` stops at the first true one, and most pods an entry is sent
    // carry the QoS label (every pod a profile mutated, on `vpod`) or match a profile's selector,
    // which are key lookups; the scans over every key and container come last. The QoS label is
    // among the keys the scans look for, so the expression is the same set of pods.
    let mut parts = vec![qos_labelled()];
    match entry {
        PodEntry::Create => parts.extend(terms.iter().cloned()),
        PodEntry::Validate if !terms.is_empty() => parts.push(in_namespaces(terms)),
        PodEntry::Validate => {}
    }
    parts.push(markers(entry));
    let expression = parts.join(" || ");
    if expression.len() > MAX_EXPRESSION {
        return Calls::All;
    }
    let name = match entry {
        PodEntry::Create => "koord-pod-create",
        PodEntry::Validate => "koord-pod-rules",
    };
    Calls::When(vec![Condition { name, expression }])
}

/// What the pod itself carries that a rule reads.
fn markers(entry: PodEntry) -> String {
    let mut parts = vec![
        koordinator_key(Var::Object, Meta::Labels),
        koordinator_key(Var::Object, Meta::Annotations),
        extended_resources("containers"),
        extended_resources("initContainers"),
    ];
    if entry == PodEntry::Validate {
        // On UPDATE a key taken away is a change too (the QoS class, the preemptible label), and
        // so is the priority (the priority class is derived from it).
        let update = [
            koordinator_key(Var::OldObject, Meta::Labels),
            koordinator_key(Var::OldObject, Meta::Annotations),
            priority_changed(),
        ];
        parts.push(format!(
            "(request.operation == 'UPDATE' && ({}))",
            update.join(" || ")
        ));
    }
    parts.join(" || ")
}

/// The pod carries Koordinator's QoS label: one key lookup.
fn qos_labelled() -> String {
    format!(
        "(has(object.metadata) && {})",
        has_key(Var::Object, Meta::Labels, QOS_CLASS_LABEL)
    )
}

/// A key of the map names Koordinator (`koordinator.sh/…`, `quota.scheduling.koordinator.sh/…`,
/// `node.koordinator.sh/…`, …).
fn koordinator_key(var: Var, meta: Meta) -> String {
    let map = format!("{}.metadata.{}", var.name(), meta.field());
    format!(
        "(has({}.metadata) && has({map}) && {})",
        var.name(),
        exists(&map, "k", "k.contains('koordinator.sh')")
    )
}

/// A container of the list requests or limits a resource with a `/` in its name: batch and mid
/// resources, Koordinator's devices, any vendor's (wider than the rules, never narrower). Plain
/// `cpu`, `memory`, `ephemeral-storage` and `hugepages-*` have none.
fn extended_resources(list: &str) -> String {
    let named = |field: &str| {
        let map = format!("c.resources.{field}");
        format!("(has({map}) && {})", exists(&map, "r", "r.contains('/')"))
    };
    let path = format!("object.spec.{list}");
    let container = format!(
        "has(c.resources) && ({} || {})",
        named("requests"),
        named("limits")
    );
    format!(
        "(has(object.spec) && has({path}) && {})",
        exists(&path, "c", &container)
    )
}

fn priority_changed() -> String {
    let has = |v: &str| format!("(has({v}.spec) && has({v}.spec.priority))");
    let (new, old) = (has("object"), has("oldObject"));
    format!(
        "({new} != {old} || ({new} && {old} && object.spec.priority != oldObject.spec.priority))"
    )
}

fn in_namespaces(names: &BTreeSet<String>) -> String {
    let list: Vec<String> = names.iter().map(|n| literal(n)).collect();
    let list = format!("[{}]", list.join(", "));
    format!(
        "(has(request.namespace) && request.namespace in {list}) || (has(object.metadata) && has(object.metadata.namespace) && object.metadata.namespace in {list})"
    )
}

/// A label selector as a CEL expression over `object.metadata.labels`, as `selectors::matches`
/// reads it; `None` when a key or value would need escaping, or the selector matches everything.
fn selector_expression(selector: &LabelSelector) -> Option<String> {
    if selectors::is_empty(selector) {
        return None;
    }
    let labels = "object.metadata.labels";
    let value_in = |key: &str, values: &[String]| -> Option<String> {
        let values: Vec<String> = values
            .iter()
            .map(|v| is_literal(v).then(|| literal(v)))
            .collect::<Option<_>>()?;
        Some(format!(
            "({} && {labels}[{}] in [{}])",
            present(key)?,
            literal(key),
            values.join(", ")
        ))
    };
    let mut terms = Vec::new();
    for (key, value) in selector.match_labels.iter().flatten() {
        terms.push(value_in(key, std::slice::from_ref(value))?);
    }
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default();
        terms.push(match req.operator.as_str() {
            "In" => value_in(&req.key, values)?,
            "NotIn" => format!("!{}", value_in(&req.key, values)?),
            "Exists" => present(&req.key)?,
            "DoesNotExist" => format!("!{}", present(&req.key)?),
            _ => return None,
        });
    }
    Some(format!("({})", terms.join(" && ")))
}

/// `key` is among the object's labels.
fn present(key: &str) -> Option<String> {
    is_literal(key).then(|| {
        format!(
            "(has(object.metadata) && {})",
            has_key(Var::Object, Meta::Labels, key)
        )
    })
}
