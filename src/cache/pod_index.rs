//! The cache's pods: for each, only what the quota rules ask (namespace, name, quota label, and what
//! it charges its quota, for the leader's recount of `child-request`).
//!
//! A cluster has far more pods than anything else, and a reflector store keeps a whole ObjectMeta
//! per pod (about 1.4 KiB even slimmed, mostly the label map's node). This index keeps a key, an
//! interned quota name and an interned charge (pods of one workload share theirs): about a tenth of
//! that (bench/RESULTS.md, scale).

use crate::apis::meta::label;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use crate::apis::keys::QUOTA_NAME;
use crate::resources::Resources;

/// (namespace, name)
type PodKey = (Box<str>, Box<str>);

/// Charged pods that share a namespace, a quota label and a charge.
#[derive(Debug, Clone)]
pub struct ChargeGroup {
    pub namespace: String,
    pub label: Option<Arc<str>>,
    pub charge: Arc<Resources>,
    pub pods: usize,
}

/// One pod as the index takes it in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IndexedPod {
    pub namespace: String,
    pub name: String,
    /// Its `quota.scheduling.koordinator.sh/name` label.
    pub quota_label: Option<String>,
    /// What it charges its quota by quota evaluation's rule; `None`: nothing (it ended, or was
    /// deleted past its grace period, or its requests do not parse).
    pub charged: Option<Resources>,
}

impl IndexedPod {
    /// From metadata alone (state files): no charge known.
    pub fn from_meta(pod: &PartialObjectMeta<Pod>) -> Self {
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            quota_label: label(pod, QUOTA_NAME).map(str::to_owned),
            charged: None,
        }
    }
}

/// What charges are interned by: their canonical JSON text.
fn charge_key(charge: &Resources) -> String {
    serde_json::to_string(&charge.to_quantities()).unwrap_or_default()
}

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    quota: Option<Arc<str>>,
    charged: Option<Arc<Resources>>,
    /// The relist that last brought it (0: a watch event or a file).
    epoch: u32,
}

#[derive(Default)]
struct Pods {
    by_key: HashMap<PodKey, Entry>,
    /// The charged pods counted by namespace, quota label and charge, kept as pods come and go:
    /// the recount copies these (a group per workload and quota, not per pod) instead of walking
    /// every pod while the watch waits.
    groups: HashMap<GroupKey, ChargeGroup>,
    /// Quota names shared by every pod that names them.
    quota_names: HashSet<Arc<str>>,
    /// Charges shared by every pod that has the same (by their JSON text).
    charges: HashMap<String, Arc<Resources>>,
    /// The relist in progress, if any: the pods it brings carry this epoch, and at its end the
    /// others are dropped (applied in place: never a second map of every pod).
    relisting: Option<u32>,
    epochs: u32,
}

/// A group's namespace and the addresses of its interned label and charge.
type GroupKey = (Box<str>, usize, usize);

fn group_key(namespace: &str, entry: &Entry) -> Option<GroupKey> {
    let charge = entry.charged.as_ref()?;
    let label = entry
        .quota
        .as_ref()
        .map_or(0, |q| Arc::as_ptr(q) as *const u8 as usize);
    Some((namespace.into(), label, Arc::as_ptr(charge) as usize))
}

/// Counts `entry` into its group, or out of it.
fn count(groups: &mut HashMap<GroupKey, ChargeGroup>, namespace: &str, entry: &Entry, add: bool) {
    let (Some(key), Some(charge)) = (group_key(namespace, entry), &entry.charged) else {
        return;
    };
    if add {
        groups
            .entry(key)
            .or_insert_with(|| ChargeGroup {
                namespace: namespace.to_owned(),
                label: entry.quota.clone(),
                charge: charge.clone(),
                pods: 0,
            })
            .pods += 1;
    } else if let Some(group) = groups.get_mut(&key) {
        group.pods -= 1;
        if group.pods == 0 {
            groups.remove(&key);
        }
    }
}

impl Pods {
    fn put(&mut self, key: PodKey, entry: Entry) {
        count(&mut self.groups, &key.0, &entry, true);
        let namespace = key.0.clone();
        if let Some(old) = self.by_key.insert(key, entry) {
            count(&mut self.groups, &namespace, &old, false);
        }
    }

    fn take(&mut self, key: &PodKey) {
        if let Some(old) = self.by_key.remove(key) {
            count(&mut self.groups, &key.0, &old, false);
        }
    }

    fn entry(&mut self, pod: &IndexedPod) -> (PodKey, Entry) {
        let key = (pod.namespace.as_str().into(), pod.name.as_str().into());
        let quota = pod
            .quota_label
            .as_deref()
            .map(|name| match self.quota_names.get(name) {
                Some(shared) => shared.clone(),
                None => {
                    let shared: Arc<str> = name.into();
                    self.quota_names.insert(shared.clone());
                    shared
                }
            });
        let charged = pod.charged.as_ref().map(|charge| {
            self.charges
                .entry(charge_key(charge))
                .or_insert_with(|| Arc::new(charge.clone()))
                .clone()
        });
        let epoch = self.relisting.unwrap_or(0);
        (
            key,
            Entry {
                quota,
                charged,
                epoch,
            },
        )
    }
}

/// Shared by the cache's reader and writer.
pub struct PodIndex {
    pods: RwLock<Pods>,
    ready: watch::Sender<bool>,
}

impl Default for PodIndex {
    fn default() -> Self {
        Self {
            pods: RwLock::default(),
            ready: watch::Sender::new(false),
        }
    }
}

impl PodIndex {
    // A panic while holding the lock leaves the map whole (every update is one insert or remove).
    fn read(&self) -> RwLockReadGuard<'_, Pods> {
        self.pods.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Pods> {
        self.pods.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds or replaces one pod (a state file, or a watch's Apply).
    pub fn upsert(&self, pod: &IndexedPod) {
        let mut pods = self.write();
        let (key, quota) = pods.entry(pod);
        pods.put(key, quota);
    }

    /// Follows a watch: a relist is applied in place, and at its end the pods it did not bring are
    /// dropped (never a second map of every pod).
    pub fn apply(&self, event: &Event<IndexedPod>) {
        let mut pods = self.write();
        match event {
            Event::Apply(pod) => {
                let (key, quota) = pods.entry(pod);
                pods.put(key, quota);
            }
            Event::Delete(pod) => {
                let (key, _) = pods.entry(pod);
                pods.take(&key);
            }
            Event::Init => {
                pods.epochs = pods.epochs.wrapping_add(1).max(1);
                pods.relisting = Some(pods.epochs);
            }
            Event::InitApply(pod) => {
                let (key, quota) = pods.entry(pod);
                pods.put(key, quota);
            }
            Event::InitDone => {
                if let Some(epoch) = pods.relisting.take() {
                    let Pods { by_key, groups, .. } = &mut *pods;
                    by_key.retain(|(namespace, _), e| {
                        let keep = e.epoch == epoch;
                        e.epoch = 0;
                        if !keep {
                            count(groups, namespace, e, false);
                        }
                        keep
                    });
                    groups.shrink_to_fit();
                    pods.by_key.shrink_to_fit();
                    let named: HashSet<Arc<str>> = pods
                        .by_key
                        .values()
                        .filter_map(|e| e.quota.clone())
                        .collect();
                    pods.quota_names = named;
                    let charges = pods.by_key.values().filter_map(|e| e.charged.clone());
                    let charges = charges.map(|c| (charge_key(&c), c)).collect();
                    pods.charges = charges;
                }
                drop(pods);
                self.ready.send_replace(true);
            }
        }
    }

    /// Marks the index complete without a watch (a state loaded from files).
    pub fn mark_ready(&self) {
        self.ready.send_replace(true);
    }

    /// Waits for the first complete list.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as `self`, so this cannot fail while we borrow it.
        let _ = ready.wait_for(|r| *r).await;
    }

    pub fn len(&self) -> usize {
        self.read().by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Names of pods (any namespace) labelled with this quota, sorted.
    pub fn labelled_for_quota(&self, quota: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .read()
            .by_key
            .iter()
            .filter(|(_, e)| e.quota.as_deref() == Some(quota))
            .map(|((_, name), _)| name.to_string())
            .collect();
        names.sort();
        names
    }

    /// The charged pods, grouped by namespace, quota label and charge: what the leader's recount
    /// adds up. The groups are kept as pods come and go, so the lock is held for a copy of them (a
    /// group per workload and quota), with no walk over every pod, no quota lookup and no sum.
    pub fn charge_groups(&self) -> Vec<ChargeGroup> {
        self.read().groups.values().cloned().collect()
    }

    /// The quota label of this pod if the index has it and it charges its quota (`Some(None)`: no
    /// label), `None` if it is not here or charges nothing.
    pub fn charging_label(&self, namespace: &str, name: &str) -> Option<Option<Arc<str>>> {
        let key: PodKey = (namespace.into(), name.into());
        let pods = self.read();
        let entry = pods.by_key.get(&key)?;
        entry.charged.as_ref()?;
        Some(entry.quota.clone())
    }

    /// Whether any pod lives in one of these namespaces.
    pub fn any_in_namespaces(&self, namespaces: &[&str]) -> bool {
        self.read()
            .by_key
            .keys()
            .any(|(ns, _)| namespaces.contains(&&**ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, quota: Option<&str>) -> IndexedPod {
        IndexedPod {
            namespace: ns.into(),
            name: name.into(),
            quota_label: quota.map(str::to_owned),
            charged: Some(Resources::parse_json(r#"{"cpu":"1"}"#).unwrap()),
        }
    }

    #[test]
    fn answers_the_quota_questions_and_follows_updates() {
        let index = PodIndex::default();
        index.upsert(&pod("a", "p2", Some("q1")));
        index.upsert(&pod("b", "p1", Some("q1")));
        index.upsert(&pod("b", "p3", None));
        assert_eq!(index.labelled_for_quota("q1"), ["p1", "p2"]);
        assert!(index.any_in_namespaces(&["x", "b"]));
        assert!(!index.any_in_namespaces(&["x"]));
        // Relabelled, then deleted.
        index.apply(&Event::Apply(pod("a", "p2", Some("q2"))));
        assert_eq!(index.labelled_for_quota("q1"), ["p1"]);
        index.apply(&Event::Delete(pod("b", "p1", Some("q1"))));
        assert!(index.labelled_for_quota("q1").is_empty());
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn charges_are_grouped_and_shared_between_pods() {
        let index = PodIndex::default();
        index.upsert(&pod("a", "p1", Some("q")));
        index.upsert(&pod("b", "p2", Some("q")));
        index.upsert(&pod("b", "p3", None));
        index.upsert(&IndexedPod {
            charged: None,
            ..pod("b", "ended", Some("q"))
        });
        let mut groups = index.charge_groups();
        groups.sort_by(|a, b| a.namespace.cmp(&b.namespace).then(a.label.cmp(&b.label)));
        let seen: Vec<_> = groups
            .iter()
            .map(|g| (g.namespace.as_str(), g.label.as_deref(), g.pods))
            .collect();
        assert_eq!(
            seen,
            [("a", Some("q"), 1), ("b", None, 1), ("b", Some("q"), 1)],
            "grouped by namespace and label; the pod that charges nothing is not there"
        );
        assert!(groups.iter().all(|g| g.charge.describe() == "cpu=1"));
        assert_eq!(index.charging_label("b", "p2"), Some(Some("q".into())));
        assert_eq!(index.charging_label("b", "p3"), Some(None));
        assert_eq!(index.charging_label("b", "ended"), None, "charges nothing");
        assert_eq!(index.charging_label("b", "gone"), None);
        index.upsert(&pod("b", "p4", Some("q")));
        let pods_in = |ns: &str| {
            index
                .charge_groups()
                .iter()
                .filter(|g| g.namespace == ns && g.label.is_some())
                .map(|g| g.pods)
                .sum::<usize>()
        };
        assert_eq!(
            pods_in("b"),
            2,
            "pods with one label and charge share a group"
        );
        assert_eq!(
            index.read().charges.len(),
            1,
            "one charge shared by three pods"
        );
    }

    #[tokio::test]
    async fn a_relist_applies_in_place_and_drops_the_rest_when_complete() {
        let index = PodIndex::default();
        index.upsert(&pod("a", "old", Some("q")));
        index.upsert(&pod("a", "kept", Some("q")));
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(pod("a", "new", Some("q"))));
        index.apply(&Event::InitApply(pod("a", "kept", Some("q"))));
        // Until the relist is done, readers see the pods it has brought and the ones before it.
        assert_eq!(index.labelled_for_quota("q"), ["kept", "new", "old"]);
        index.apply(&Event::InitDone);
        assert_eq!(index.labelled_for_quota("q"), ["kept", "new"]);
        // A later relist drops what it does not bring, whatever the one before brought.
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(pod("a", "new", Some("q"))));
        index.apply(&Event::InitDone);
        assert_eq!(index.labelled_for_quota("q"), ["new"]);
        index.wait_until_ready().await;
        let names = index.read().quota_names.len();
        assert_eq!(names, 1, "interned names follow the relist");
    }

    /// The groups from scratch: each charged pod's (namespace, label, charge) counted.
    fn groups_walked(index: &PodIndex) -> Vec<(String, Option<String>, String, usize)> {
        let mut counted: HashMap<(String, Option<String>, String), usize> = HashMap::new();
        for ((namespace, _), e) in &index.read().by_key {
            if let Some(charge) = &e.charged {
                let key = (
                    namespace.to_string(),
                    e.quota.as_deref().map(str::to_owned),
                    charge.describe(),
                );
                *counted.entry(key).or_default() += 1;
            }
        }
        let mut out: Vec<_> = counted
            .into_iter()
            .map(|((n, l, c), pods)| (n, l, c, pods))
            .collect();
        out.sort();
        out
    }

    fn groups_kept(index: &PodIndex) -> Vec<(String, Option<String>, String, usize)> {
        let mut out: Vec<_> = index
            .charge_groups()
            .into_iter()
            .map(|g| {
                let label = g.label.as_deref().map(str::to_owned);
                (g.namespace, label, g.charge.describe(), g.pods)
            })
            .collect();
        out.sort();
        out
    }

    proptest::proptest! {
        /// Whatever the watch brings (updates that relabel or end a pod, deletes, relists that
        /// drop pods), the groups kept as it goes are the ones a walk over every pod finds.
        #[test]
        fn kept_groups_match_a_walk_over_every_pod(
            ops in proptest::collection::vec((0u8..6, 0u8..3, 0u8..6, 0u8..3, 0u8..3), 0..80)
        ) {
            let index = PodIndex::default();
            for (op, ns, name, label, cpu) in ops {
                let p = IndexedPod {
                    namespace: format!("ns{ns}"),
                    name: format!("p{name}"),
                    quota_label: (label > 0).then(|| format!("q{label}")),
                    charged: (cpu > 0)
                        .then(|| Resources::parse_json(&format!(r#"{{"cpu":"{cpu}"}}"#)).unwrap()),
                };
                match op {
                    0 | 1 => index.apply(&Event::Apply(p)),
                    2 => index.apply(&Event::Delete(p)),
                    3 => index.apply(&Event::Init),
                    4 => index.apply(&Event::InitApply(p)),
                    _ => index.apply(&Event::InitDone),
                }
                proptest::prop_assert_eq!(groups_kept(&index), groups_walked(&index));
            }
        }
    }
}
