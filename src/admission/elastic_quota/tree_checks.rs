//! The rules a quota must satisfy within the tree, for CREATE, UPDATE and DELETE.
//!
//! Pure functions of the topology, the quota and a view of the bound pods; the plugin in
//! `validate.rs` runs them on the cache's tree (with its own pending changes laid over it without
//! a ledger: `overlay.rs`), and the cache's tree itself is written only by `cache/quotas.rs`.

use std::collections::BTreeSet;

use crate::apis::ElasticQuota;
use crate::apis::keys::{
    DEFAULT_QUOTA, QUOTA_IS_PARENT, QUOTA_NAMESPACES, QUOTA_PARENT, QUOTA_TREE_ID, ROOT_QUOTA,
    SYSTEM_QUOTA,
};
use crate::cache::quota_topology::{ChildSums, QuotaInfo, QuotaTopology};
use crate::features::{FeatureGates, Gate};
use crate::resources::Resources;

use super::self_checks;

/// The pods the tree rules ask about.
pub trait BoundPods {
    /// Pods (any namespace) labelled with this quota name, sorted by name.
    fn labelled(&self, quota: &str) -> Vec<String>;
    fn any_in_namespaces(&self, namespaces: &[&str]) -> bool;
}

impl BoundPods for crate::cache::Cache {
    fn labelled(&self, quota: &str) -> Vec<String> {
        self.pods_labelled_for_quota(quota)
    }
    fn any_in_namespaces(&self, namespaces: &[&str]) -> bool {
        self.any_pod_in_namespaces(namespaces)
    }
}

/// A namespace of the quota's annotation that another quota already binds: (namespace, owner).
fn bound_elsewhere<'a>(
    topology: &'a QuotaTopology,
    info: &'a QuotaInfo,
) -> Option<(&'a str, &'a str)> {
    info.namespaces.iter().find_map(|ns| {
        let owner = topology.quota_for_namespace(ns)?;
        (owner != info.name).then_some((ns.as_str(), owner))
    })
}

pub fn check_create(
    topology: &QuotaTopology,
    quota: &ElasticQuota,
    gates: &FeatureGates,
    pods: &dyn BoundPods,
) -> Result<QuotaInfo, String> {
    let info = QuotaInfo::from_quota(quota);
    if topology.contains(&info.name) {
        return Err(format!("AddQuota quota already exist:{}", info.name));
    }
    if let Some((ns, other)) = bound_elsewhere(topology, &info) {
        return Err(format!(
            "AddQuota quota {}'s annotation namespace {ns} is already bound to quota {other}",
            info.name
        ));
    }
    self_checks::check(quota)?;
    check_tree(topology, &info, None, gates, pods)?;
    Ok(info)
}

/// The fields whose change can affect the tree.
pub fn relevant_unchanged(old: &ElasticQuota, new: &ElasticQuota) -> bool {
    use crate::apis::meta::{annotation, label};
    [QUOTA_PARENT, QUOTA_IS_PARENT, QUOTA_TREE_ID]
        .iter()
        .all(|k| label(old, k) == label(new, k))
        && annotation(old, QUOTA_NAMESPACES) == annotation(new, QUOTA_NAMESPACES)
        && old.spec == new.spec
}

/// `Ok(None)`: nothing relevant changed, the topology needs no update.
pub fn check_update(
    topology: &QuotaTopology,
    old: &ElasticQuota,
    new: &ElasticQuota,
    gates: &FeatureGates,
    pods: &dyn BoundPods,
) -> Result<Option<QuotaInfo>, String> {
    if relevant_unchanged(old, new) {
        return Ok(None);
    }
    let info = QuotaInfo::from_quota(new);
    let name = info.name.as_str();
    if name == SYSTEM_QUOTA || name == ROOT_QUOTA {
        return Err(format!("invalid quota {name}"));
    }
    if let Some((ns, other)) = bound_elsewhere(topology, &info) {
        return Err(format!(
            "UpdadteQuota, quota {name} update namespaces, but namespace {ns} is already bound to quota {other}"
        ));
    }
    let stored = topology
        .get(name)
        .ok_or_else(|| format!("UpdateQuota quota not exist in quotaInfoMap:{name}"))?;
    self_checks::check(new)?;
    check_tree(topology, &info, Some(stored), gates, pods)?;
    Ok(Some(info))
}

pub fn check_delete(
    topology: &QuotaTopology,
    name: &str,
    pods: &dyn BoundPods,
) -> Result<(), String> {
    if [SYSTEM_QUOTA, ROOT_QUOTA, DEFAULT_QUOTA].contains(&name) {
        return Err(format!("can not delete quotaGroup :{name}"));
    }
    if !topology.contains(name) {
        return Err(format!("not found quota:{name}"));
    }
    let children = topology.children(name).ok_or_else(|| {
        format!("BUG quotaMap and quotaTree information out of sync, losed :{name}")
    })?;
    if !children.is_empty() {
        return Err(format!(
            "delete quota failed, quota {name} has {} child quotas",
            children.len()
        ));
    }
    let bound = pods.labelled(name);
    if !bound.is_empty() {
        let mut shown = bound.iter().take(2).cloned().collect::<Vec<_>>().join(", ");
        if bound.len() > 2 {
            shown.push_str(", ...");
        }
        return Err(format!(
            "delete quota failed, quota {name} has {} child pods: {shown}",
            bound.len()
        ));
    }
    Ok(())
}

const KEY_PREFIX: &str = "failed to check sub and parent group quotaKey, err: ";

fn keys(r: &Resources) -> std::collections::BTreeSet<&str> {
    r.keys().map(String::as_str).collect()
}

/// Which side of the pair is the quota under review: Koordinator names the pair in another order
/// in one message when it checks the quota against its children.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reviewed {
    Child,
    Parent,
}

/// Resource-key rules between a child and its parent.
fn check_keys(
    child: &QuotaInfo,
    parent: &QuotaInfo,
    reviewed: Reviewed,
    gates: &FeatureGates,
) -> Result<(), String> {
    let fail = |what: String| {
        Err(format!(
            "{KEY_PREFIX}checkSubAndParentGroupQuotaKey failed: {what}"
        ))
    };
    let (child_max, parent_max) = (keys(&child.max), keys(&parent.max));
    if gates.enabled(Gate::ElasticQuotaEnableUpdateResourceKey) {
        if !child_max.is_subset(&parent_max) {
            return fail(format!(
                "{}'s max keys are not all included in {}'s",
                child.name, parent.name
            ));
        }
    } else if child_max != parent_max {
        let (first, second) = match reviewed {
            Reviewed::Child => (&parent.name, &child.name),
            Reviewed::Parent => (&child.name, &parent.name),
        };
        return fail(format!(
            "{first}'s max keys are not the same with {second}'s"
        ));
    }
    if !keys(&child.min).is_subset(&keys(&parent.min)) {
        return fail(format!(
            "{}'s min keys are not all included in {}'s",
            child.name, parent.name
        ));
    }
    Ok(())
}

/// The tree rules for `info` (the quota as it would be) against the tree, in Koordinator's order:
/// each step a function below, the first refusal the answer.
fn check_tree(
    topology: &QuotaTopology,
    info: &QuotaInfo,
    stored: Option<&QuotaInfo>,
    gates: &FeatureGates,
    pods: &dyn BoundPods,
) -> Result<(), String> {
    if info.name == ROOT_QUOTA {
        return Ok(());
    }
    let tree = Tree {
        topology,
        info,
        stored,
        children: topology.children(&info.name),
    };
    tree.is_parent_kept_under_children_or_pods(pods)?;
    tree.one_tree_id()?;
    // 3. A leaf directly under the root has nothing more to agree with.
    if info.parent == ROOT_QUOTA && !info.is_parent {
        return Ok(());
    }
    let parent = tree.parent()?;
    tree.resource_keys(parent, gates)?;
    tree.min_sums(parent)?;
    tree.no_cycle(parent)?;
    tree.guarantee(gates)
}

/// One change's view of the tree: the quota as it would be, as stored, and its children.
struct Tree<'a> {
    topology: &'a QuotaTopology,
    info: &'a QuotaInfo,
    stored: Option<&'a QuotaInfo>,
    children: Option<&'a BTreeSet<String>>,
}

impl<'a> Tree<'a> {
    fn name(&self) -> &'a str {
        self.info.name.as_str()
    }

    fn children(&self) -> impl Iterator<Item = &'a String> + use<'a> {
        self.children.into_iter().flatten()
    }

    /// 1. is-parent may not flip under children or bound pods.
    fn is_parent_kept_under_children_or_pods(&self, pods: &dyn BoundPods) -> Result<(), String> {
        let (name, info) = (self.name(), self.info);
        let Some(old) = self.stored.filter(|old| old.is_parent != info.is_parent) else {
            return Ok(());
        };
        if old.is_parent && self.children.map_or(0, |c| c.len()) > 0 {
            return Err(format!(
                "quota has children, isParent is forbidden to modify as false, quotaName:{name}"
            ));
        }
        if !old.is_parent {
            let mut namespaces: Vec<&str> = old.namespaces.iter().map(String::as_str).collect();
            namespaces.push(name);
            if !pods.labelled(name).is_empty() || pods.any_in_namespaces(&namespaces) {
                return Err(format!(
                    "quota has bound pods, isParent is forbidden to modify as true, quotaName: {name}"
                ));
            }
        }
        Ok(())
    }

    /// 2. One tree id across a tree: unchanged, the parent's, every child's.
    fn one_tree_id(&self) -> Result<(), String> {
        let (name, info, topology) = (self.name(), self.info, self.topology);
        if let Some(old) = self.stored.filter(|old| old.tree_id != info.tree_id) {
            return Err(format!(
                "{name} tree id changed [{}] vs [{}]",
                old.tree_id, info.tree_id
            ));
        }
        let parent = (info.parent != ROOT_QUOTA)
            .then(|| topology.get(&info.parent))
            .flatten();
        if let Some(parent) = parent.filter(|p| p.tree_id != info.tree_id) {
            return Err(format!(
                "{name} tree id is different from parent {}, [{}] vs [{}]",
                parent.name, info.tree_id, parent.tree_id
            ));
        }
        for child in self.children().filter_map(|c| topology.get(c)) {
            if child.tree_id != info.tree_id {
                return Err(format!(
                    "{name} tree id is different from child {}, [{}] vs [{}]",
                    child.name, info.tree_id, child.tree_id
                ));
            }
        }
        Ok(())
    }

    /// 4. The parent (none under the root) must exist and be a parent.
    fn parent(&self) -> Result<Option<&'a QuotaInfo>, String> {
        let (name, topology) = (self.name(), self.topology);
        let p = &self.info.parent;
        if p == ROOT_QUOTA {
            return Ok(None);
        }
        let parent = topology.get(p).ok_or_else(|| {
            format!("{name} has parentName {p} but not find parentInfo in quotaInfoMap")
        })?;
        if topology.children(p).is_none() {
            return Err(format!(
                "{name} has parentName {p} but not find parentInfo in quotaHierarchyInfo"
            ));
        }
        if !parent.is_parent {
            return Err(format!(
                "{name} has parentName {p} but the parentQuotaInfo's IsParent is false"
            ));
        }
        Ok(Some(parent))
    }

    /// 5. Resource keys against the parent and every child.
    fn resource_keys(
        &self,
        parent: Option<&QuotaInfo>,
        gates: &FeatureGates,
    ) -> Result<(), String> {
        if let Some(parent) = parent {
            check_keys(self.info, parent, Reviewed::Child, gates)?;
        }
        for child_name in self.children() {
            let child = self.topology.get(child_name).ok_or_else(|| {
                format!("{KEY_PREFIX}internal error: quotaInfoMap and quotaTree information out of sync, losed :{child_name}")
            })?;
            check_keys(child, self.info, Reviewed::Parent, gates)?;
        }
        Ok(())
    }

    /// 6. The children's min fits in the parent's min: its siblings' with it in its parent's, its
    ///    own children's in its own.
    fn min_sums(&self, parent: Option<&QuotaInfo>) -> Result<(), String> {
        let (name, info, topology) = (self.name(), self.info, self.topology);
        if info.allow_force_update || info.is_root {
            return Ok(());
        }
        if let Some(parent) = parent {
            let mut sum = children_sum(topology, &parent.name, |s| &s.min);
            if let Some(old) = self.stored.filter(|old| old.parent == parent.name) {
                sum.sub(&old.min);
            }
            sum.add(&info.min);
            if !sum.le_completely(&parent.min) {
                return Err(format!(
                    "checkMinQuotaSum all brothers' MinQuota > parent MinQuota, parent: {}",
                    parent.name
                ));
            }
        }
        if !children_sum(topology, name, |s| &s.min).le_completely(&info.min) {
            return Err(format!(
                "checkMinQuotaSum all children's MinQuota > current MinQuota, current: {name}"
            ));
        }
        Ok(())
    }

    /// 7. Unlike Koordinator, which has no such check: the parent must not be the quota itself or
    ///    one of its descendants (a cycle breaks every sum up the tree). Checked after
    ///    Koordinator's own checks, so that a change Koordinator refuses gets Koordinator's message.
    fn no_cycle(&self, parent: Option<&QuotaInfo>) -> Result<(), String> {
        match parent {
            Some(parent) if creates_cycle(self.topology, self.name(), &parent.name) => {
                Err(format!(
                    "{} has parentName {} which would make the quota tree a cycle",
                    self.name(),
                    parent.name
                ))
            }
            _ => Ok(()),
        }
    }

    /// 8. Guaranteed capacity up the tree.
    fn guarantee(&self, gates: &FeatureGates) -> Result<(), String> {
        let info = self.info;
        if gates.enabled(Gate::ElasticQuotaGuaranteeUsage)
            && !info.allow_force_update
            && !info.tree_id.is_empty()
            && !info.is_root
            && !info.min.le_completely(&info.guaranteed)
        {
            check_guarantee(self.topology, info)?;
        }
        Ok(())
    }
}

/// A running sum over the children of `parent`, from the topology.
fn children_sum(
    topology: &QuotaTopology,
    parent: &str,
    field: fn(&ChildSums) -> &Resources,
) -> Resources {
    topology
        .child_sums(parent)
        .map(|s| field(s).clone())
        .unwrap_or_default()
}

/// Whether making `parent` the parent of `name` closes a loop.
fn creates_cycle(topology: &QuotaTopology, name: &str, parent: &str) -> bool {
    let mut current = parent;
    for _ in 0..=topology.len() {
        if current == name {
            return true;
        }
        match topology.get(current) {
            Some(info) if !info.parent.is_empty() && info.parent != ROOT_QUOTA => {
                current = &info.parent
            }
            _ => return false,
        }
    }
    true
}

/// Walks up from the quota: each ancestor must be able to guarantee what its children need. The
/// root of the forest (the quota whose parent is the root quota) cannot guarantee anything more:
/// reaching it is a refusal naming the quota below it, as Koordinator's walk does.
fn check_guarantee(topology: &QuotaTopology, info: &QuotaInfo) -> Result<(), String> {
    let mut need = info.min.clone();
    need.max_with(&info.guaranteed);
    let mut child = info.name.clone();
    let mut parent_name = info.parent.clone();
    // The depth bound protects against a cycle introduced by bad data.
    for _ in 0..=topology.len() {
        if parent_name.is_empty() || parent_name == ROOT_QUOTA {
            return Err(format!(
                "tree root quota {child} can't guarantee for min {}",
                info.name
            ));
        }
        let Some(parent) = topology.get(&parent_name) else {
            return Err(format!("parent {parent_name} not found {}", info.name));
        };
        // The siblings' guarantees: all children's, less the one on the way up.
        let mut total = children_sum(topology, &parent.name, |s| &s.guaranteed);
        if let Some(on_path) = topology.get(&child).filter(|c| c.parent == parent.name) {
            total.sub(&on_path.guaranteed);
        }
        total.add(&need);
        let mut new_parent = parent.min.clone();
        new_parent.max_with(&total);
        if new_parent.le_completely(&parent.guaranteed) {
            return Ok(());
        }
        need = new_parent;
        child = parent.name.clone();
        parent_name = parent.parent.clone();
    }
    Ok(())
}
