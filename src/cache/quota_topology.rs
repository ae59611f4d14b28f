//! The ElasticQuota tree as admission sees it.
//!
//! Names are global (Koordinator ignores the namespace). Every quota, every parent a quota names, and
//! the root have a child set, so the structure built from a set of quotas is the same whatever order
//! they arrive in. Fed only by what feeds the cache (files or watch events); admission's own
//! not-yet-seen changes live in the ElasticQuota plugin (`admission/elastic_quota/overlay.rs`).

use crate::apis::meta::{annotation, label};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock, RwLockWriteGuard};

use crate::apis::ElasticQuota;
use crate::apis::keys::{
    QUOTA_ALLOW_LENT_RESOURCE, QUOTA_GUARANTEED, QUOTA_IS_PARENT, QUOTA_NAMESPACES, QUOTA_PARENT,
    QUOTA_TREE_ID, ROOT_QUOTA,
};
use crate::resources::Resources;

pub const QUOTA_IS_ROOT: &str = "quota.scheduling.koordinator.sh/is-root";
pub const QUOTA_ALLOW_FORCE_UPDATE: &str = "quota.scheduling.koordinator.sh/allow-force-update";

/// What the rules read of one quota.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaInfo {
    pub name: String,
    pub namespace: String,
    pub parent: String,
    pub is_parent: bool,
    pub allow_lent_resource: bool,
    pub tree_id: String,
    pub is_root: bool,
    pub allow_force_update: bool,
    pub min: Resources,
    pub max: Resources,
    pub guaranteed: Resources,
    /// Namespaces bound by the `namespaces` annotation.
    pub namespaces: Vec<String>,
}

impl QuotaInfo {
    /// Derives the info; quantities that do not parse count as absent (the validating rules report
    /// them on the object itself).
    pub fn from_quota(quota: &ElasticQuota) -> Self {
        let name = quota.metadata.name.clone().unwrap_or_default();
        let label = |k: &str| label(quota, k);
        let annotation = |k: &str| annotation(quota, k);
        let parent = match label(QUOTA_PARENT).filter(|p| !p.is_empty()) {
            Some(p) => p.to_owned(),
            None if name == ROOT_QUOTA => String::new(),
            None => ROOT_QUOTA.to_owned(),
        };
        Self {
            namespace: quota.metadata.namespace.clone().unwrap_or_default(),
            parent,
            is_parent: label(QUOTA_IS_PARENT) == Some("true"),
            allow_lent_resource: label(QUOTA_ALLOW_LENT_RESOURCE) != Some("false"),
            tree_id: label(QUOTA_TREE_ID).unwrap_or_default().to_owned(),
            is_root: label(QUOTA_IS_ROOT) == Some("true"),
            allow_force_update: label(QUOTA_ALLOW_FORCE_UPDATE) == Some("true"),
            min: Resources::parse(quota.spec.min.as_ref()).unwrap_or_default(),
            max: Resources::parse(quota.spec.max.as_ref()).unwrap_or_default(),
            guaranteed: annotation(QUOTA_GUARANTEED)
                .and_then(|g| Resources::parse_json(g).ok())
                .unwrap_or_default(),
            namespaces: bound_namespaces(quota),
            name,
        }
    }
}

/// The `namespaces` annotation, each name once, in the annotation's order (a conflict names the
/// first); invalid JSON binds nothing. Read under a meter of the text's own allowance, and each
/// name kept once: a forged review repeating one name a million times binds one namespace, not a
/// million copies kept for as long as the quota is.
pub fn bound_namespaces(quota: &ElasticQuota) -> Vec<String> {
    let Some(mut names) = annotation(quota, QUOTA_NAMESPACES)
        .and_then(|v| crate::memory::metered::read_within::<Vec<String>>(v.as_bytes()).ok())
    else {
        return Vec::new();
    };
    let keep: Vec<bool> = {
        let mut seen = std::collections::HashSet::new();
        names.iter().map(|n| seen.insert(n.as_str())).collect()
    };
    let mut keep = keep.into_iter();
    names.retain(|_| keep.next().unwrap_or(false));
    names.shrink_to_fit();
    names
}

/// The quota tree beside the ElasticQuota store: written with it by their one writer
/// (`quotas.rs`: the watch's events and the files' quotas), read by the quota rules (which lay
/// their own pending changes over it: `overlay.rs`, the ledger). Never held across an await.
pub type SharedTopology = Arc<RwLock<QuotaTopology>>;

/// A panic elsewhere must not take the quota webhooks down with a poisoned lock.
pub(crate) fn write_topology(topology: &SharedTopology) -> RwLockWriteGuard<'_, QuotaTopology> {
    topology.write().unwrap_or_else(|p| p.into_inner())
}

#[derive(Clone, Debug, Eq)]
pub struct QuotaTopology {
    /// Counts the changes, so a copy can tell whether it still matches (not part of equality).
    generation: u64,
    infos: BTreeMap<String, QuotaInfo>,
    children: BTreeMap<String, BTreeSet<String>>,
    /// Namespace -> quotas binding it; the first in name order wins.
    namespaces: BTreeMap<String, BTreeSet<String>>,
    /// Parent -> sums over its children, kept as children come and go so that validating one quota
    /// costs the depth of the tree, not the number of its siblings.
    sums: BTreeMap<String, ChildSums>,
    /// Quotas the cluster has that do not decode (the watch sets them aside): by name. Not part of
    /// the tree: the rules refuse changes that would have to count them (`unreadable_near`).
    unreadable: BTreeMap<String, UnreadableQuota>,
}

/// A quota that does not decode, as its metadata tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableQuota {
    pub namespace: String,
    /// Its parent label (empty when it has none).
    pub parent: String,
    pub error: String,
}

/// Running sums over the children of one parent, zeros dropped.
#[derive(Clone, Debug, Default)]
pub struct ChildSums {
    pub min: Resources,
    pub guaranteed: Resources,
}

impl ChildSums {
    fn milli(&self) -> [BTreeMap<&str, i128>; 2] {
        [&self.min, &self.guaranteed]
            .map(|r| r.iter().map(|(k, q)| (k.as_str(), q.milli())).collect())
    }

    fn add(&mut self, info: &QuotaInfo) {
        self.min.add(&info.min);
        self.guaranteed.add(&info.guaranteed);
        self.drop_zeros();
    }

    fn sub(&mut self, info: &QuotaInfo) {
        self.min.sub(&info.min);
        self.guaranteed.sub(&info.guaranteed);
        self.drop_zeros();
    }

    fn drop_zeros(&mut self) {
        self.min = std::mem::take(&mut self.min).without_zeros();
        self.guaranteed = std::mem::take(&mut self.guaranteed).without_zeros();
    }

    fn is_empty(&self) -> bool {
        self.min.is_empty() && self.guaranteed.is_empty()
    }
}

/// Sums compare by value: the format of a running sum depends on the order of its terms.
impl PartialEq for ChildSums {
    fn eq(&self, other: &Self) -> bool {
        self.milli() == other.milli()
    }
}

impl Eq for ChildSums {}

impl PartialEq for QuotaTopology {
    fn eq(&self, other: &Self) -> bool {
        self.infos == other.infos
            && self.children == other.children
            && self.namespaces == other.namespaces
            && self.sums == other.sums
    }
}

impl Default for QuotaTopology {
    fn default() -> Self {
        Self {
            generation: 0,
            infos: BTreeMap::new(),
            children: BTreeMap::from([(ROOT_QUOTA.to_owned(), BTreeSet::new())]),
            namespaces: BTreeMap::new(),
            sums: BTreeMap::new(),
            unreadable: BTreeMap::new(),
        }
    }
}

impl QuotaTopology {
    pub fn from_quotas<'a>(quotas: impl IntoIterator<Item = &'a ElasticQuota>) -> Self {
        let mut topology = Self::default();
        for quota in quotas {
            topology.upsert(QuotaInfo::from_quota(quota));
        }
        topology
    }

    /// Inserts a quota as the cluster has it (the watch), or replaces it and moves it under its
    /// (possibly new) parent.
    pub fn upsert(&mut self, info: QuotaInfo) {
        // A relist brings every quota again: one that did not change keeps its entries (no
        // reallocated keys), and copies of the tree stay current.
        if self.infos.get(&info.name) == Some(&info) {
            return;
        }
        self.generation += 1;
        self.apply(info);
    }

    /// Removes a quota the cluster no longer has (the watch).
    pub fn remove(&mut self, name: &str) -> Option<QuotaInfo> {
        self.generation += 1;
        self.unlink(name)
    }

    /// Records quota `name` as not decoding (`Some`), or as decoding or gone again (`None`).
    pub fn set_unreadable(&mut self, name: &str, unreadable: Option<UnreadableQuota>) {
        if self.unreadable.get(name) == unreadable.as_ref() {
            return;
        }
        // Copies (the overlay's) tell by the generation whether they still match.
        self.generation += 1;
        match unreadable {
            Some(u) => {
                self.unreadable.insert(name.to_owned(), u);
            }
            None => {
                self.unreadable.remove(name);
            }
        }
    }

    /// Whether quota `name` is recorded as not decoding.
    pub fn is_unreadable(&self, name: &str) -> bool {
        self.unreadable.contains_key(name)
    }

    /// Keeps only the unreadable quotas `keep` names (after a relist: the others are gone).
    pub fn retain_unreadable(&mut self, keep: impl Fn(&str) -> bool) {
        let before = self.unreadable.len();
        self.unreadable.retain(|name, _| keep(name));
        if self.unreadable.len() != before {
            self.generation += 1;
        }
    }

    /// An unreadable quota a change of `quota` under `parents` would have to count: one of the
    /// parents itself, a sibling (a child of a parent) or a child of `quota`.
    pub fn unreadable_near(
        &self,
        quota: &str,
        parents: &[&str],
    ) -> Option<(&str, &UnreadableQuota)> {
        let parents: Vec<&str> = parents
            .iter()
            .copied()
            .filter(|p| !p.is_empty() && *p != ROOT_QUOTA)
            .collect();
        self.unreadable
            .iter()
            .find(|(name, u)| {
                name.as_str() != quota
                    && (parents.contains(&name.as_str())
                        || parents.contains(&u.parent.as_str())
                        || u.parent == quota)
            })
            .map(|(name, u)| (name.as_str(), u))
    }

    /// Changes so far: equal generations of one topology and its copy mean equal contents.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn apply(&mut self, info: QuotaInfo) {
        self.unlink(&info.name.clone());
        self.children.entry(info.name.clone()).or_default();
        if !info.parent.is_empty() {
            self.children
                .entry(info.parent.clone())
                .or_default()
                .insert(info.name.clone());
            let sums = self.sums.entry(info.parent.clone()).or_default();
            sums.add(&info);
            if sums.is_empty() {
                self.sums.remove(&info.parent);
            }
        }
        for ns in &info.namespaces {
            self.namespaces
                .entry(ns.clone())
                .or_default()
                .insert(info.name.clone());
        }
        self.infos.insert(info.name.clone(), info);
    }

    /// Takes a quota out; its children keep their (now dangling) parent, as a rebuild would.
    fn unlink(&mut self, name: &str) -> Option<QuotaInfo> {
        let info = self.infos.remove(name)?;
        if let Some(sums) = self.sums.get_mut(&info.parent) {
            sums.sub(&info);
            if sums.is_empty() {
                self.sums.remove(&info.parent);
            }
        }
        if let Some(siblings) = self.children.get_mut(&info.parent) {
            siblings.remove(name);
            if siblings.is_empty()
                && info.parent != ROOT_QUOTA
                && !self.infos.contains_key(&info.parent)
            {
                self.children.remove(&info.parent);
            }
        }
        if self.children.get(name).is_some_and(BTreeSet::is_empty) {
            self.children.remove(name);
        }
        for ns in &info.namespaces {
            if let Some(bound) = self.namespaces.get_mut(ns) {
                bound.remove(name);
                if bound.is_empty() {
                    self.namespaces.remove(ns);
                }
            }
        }
        Some(info)
    }

    pub fn get(&self, name: &str) -> Option<&QuotaInfo> {
        self.infos.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.infos.contains_key(name)
    }

    /// The child set, if the name has one (every known quota, the root, and named parents).
    pub fn children(&self, name: &str) -> Option<&BTreeSet<String>> {
        self.children.get(name)
    }

    /// Sums of min and guaranteed over the children of `name` (zero when it has none).
    pub fn child_sums(&self, name: &str) -> Option<&ChildSums> {
        self.sums.get(name)
    }

    /// The quota a namespace is bound to by annotation, if any.
    pub fn quota_for_namespace(&self, namespace: &str) -> Option<&str> {
        self.namespaces
            .get(namespace)
            .and_then(|b| b.first())
            .map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.infos.len()
    }

    pub fn is_empty(&self) -> bool {
        self.infos.is_empty()
    }

    pub fn infos(&self) -> impl Iterator<Item = &QuotaInfo> {
        self.infos.values()
    }

    pub fn hierarchy(&self) -> &BTreeMap<String, BTreeSet<String>> {
        &self.children
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    /// A quota named `name` in namespace `ns` under `parent`.
    pub(crate) fn quota(name: &str, parent: Option<&str>) -> ElasticQuota {
        ElasticQuota {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: parent.map(|p| [(QUOTA_PARENT.to_owned(), p.to_owned())].into()),
                ..Default::default()
            },
            spec: Default::default(),
            status: None,
        }
    }

    #[test]
    fn arrival_order_does_not_matter() {
        let a = quota("a", None);
        let b = quota("b", Some("a"));
        let c = quota("c", Some("b"));
        let one = QuotaTopology::from_quotas([&a, &b, &c]);
        let other = QuotaTopology::from_quotas([&c, &b, &a]);
        assert_eq!(one, other);
        assert_eq!(
            one.children(ROOT_QUOTA).unwrap().iter().collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(one.children("b").unwrap().iter().collect::<Vec<_>>(), ["c"]);
        assert!(one.children("c").unwrap().is_empty());
    }

    #[test]
    fn moves_and_removals_match_a_rebuild() {
        let (a, b, c) = (quota("a", None), quota("b", None), quota("c", Some("a")));
        let mut live = QuotaTopology::from_quotas([&a, &b, &c]);
        let moved = quota("c", Some("b"));
        live.upsert(QuotaInfo::from_quota(&moved));
        assert_eq!(live, QuotaTopology::from_quotas([&a, &b, &moved]));
        live.remove("b");
        assert_eq!(live, QuotaTopology::from_quotas([&a, &moved]));
        assert!(
            live.children("b").unwrap().contains("c"),
            "the orphan keeps its parent's child set"
        );
    }

    #[test]
    fn namespaces_bind_to_the_first_quota_by_name() {
        let mut q = quota("z", None);
        q.metadata.annotations =
            Some([(QUOTA_NAMESPACES.to_owned(), r#"["team-a"]"#.to_owned())].into());
        let mut p = quota("m", None);
        p.metadata.annotations = q.metadata.annotations.clone();
        let topology = QuotaTopology::from_quotas([&q, &p]);
        assert_eq!(topology.quota_for_namespace("team-a"), Some("m"));
        assert_eq!(topology.quota_for_namespace("team-b"), None);
    }

    #[test]
    fn each_bound_namespace_is_kept_once_in_the_annotations_order() {
        let mut q = quota("q", None);
        let with = |q: &mut ElasticQuota, text: String| {
            q.metadata.annotations = Some([(QUOTA_NAMESPACES.to_owned(), text)].into());
        };
        with(&mut q, r#"["b","a","b","c","a"]"#.to_owned());
        assert_eq!(bound_namespaces(&q), ["b", "a", "c"]);
        with(&mut q, "not json".to_owned());
        assert!(bound_namespaces(&q).is_empty());
        // A million copies of one name keep one.
        with(&mut q, format!("[{}\"x\"]", "\"x\",".repeat(1_000_000)));
        let names = bound_namespaces(&q);
        assert_eq!(names, ["x"]);
        assert_eq!(names.capacity(), 1);
    }
}
