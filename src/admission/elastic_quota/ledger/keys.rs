//! What a change is, as the ledger records it, what it can meet (its keys), and when the cache
//! shows it.

use std::collections::BTreeSet;

use kube::core::admission::Operation;

use crate::admission::ports::{ChangeKind, PendingChange};
use crate::apis::ElasticQuota;
use crate::apis::keys::ROOT_QUOTA;
use crate::cache::Cache;
use crate::cache::quota_topology::{QuotaInfo, QuotaTopology};

/// What a change can meet, as ledger keys: the tree of each quota it touches, before and after
/// (`t.<top-most ancestor under the root>`, by the cache's topology), and each namespace it binds
/// before and after (`n.<namespace>`). A name a ConfigMap key cannot hold (too long, or with other
/// characters than `-._a-zA-Z0-9`: only a forged or hand-written annotation has one) is keyed by
/// its digest instead (`t-`, `n-`), so every change can be recorded.
pub fn keys_of(
    topology: &QuotaTopology,
    object: Option<&ElasticQuota>,
    old: Option<&ElasticQuota>,
) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let infos = [object, old]
        .into_iter()
        .flatten()
        .map(QuotaInfo::from_quota)
        .collect::<Vec<_>>();
    let stored = infos.first().and_then(|i| topology.get(&i.name)).cloned();
    for info in infos.iter().chain(stored.as_ref()) {
        keys.insert(key("t", tree_of(topology, &info.name, &info.parent)));
        for namespace in &info.namespaces {
            keys.insert(key("n", namespace));
        }
    }
    keys
}

/// Whether a ConfigMap key holds `name` as it is (else it is keyed by its digest).
fn fits(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 250
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// The ledger key of `name` under `prefix` (`t` or `n`).
pub(super) fn key(prefix: &str, name: &str) -> String {
    if fits(name) {
        format!("{prefix}.{name}")
    } else {
        let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
        let hex: String = digest.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{prefix}-{hex}")
    }
}

/// Which ledger keys name something the cache stores: a tree key, a tree a cached quota is in (the
/// quota at its top, or the parent a cached quota names); a namespace key, a namespace a cached
/// quota binds. What a change names that the cache does not store is a tree or a binding only that
/// change would bring: a create the watch has not delivered yet, or a forged review's.
pub(super) struct Stored<'a> {
    topology: &'a QuotaTopology,
    /// The digest keys of the stored names that have one, computed when first asked.
    digests: std::cell::OnceCell<std::collections::HashSet<String>>,
}

impl<'a> Stored<'a> {
    pub(super) fn new(topology: &'a QuotaTopology) -> Self {
        Self {
            topology,
            digests: std::cell::OnceCell::new(),
        }
    }

    pub(super) fn holds(&self, key: &str) -> bool {
        if let Some(tree) = key.strip_prefix("t.") {
            return self.topology.children(tree).is_some();
        }
        if let Some(namespace) = key.strip_prefix("n.") {
            return self.topology.quota_for_namespace(namespace).is_some();
        }
        self.digests
            .get_or_init(|| {
                let mut digests = std::collections::HashSet::new();
                for info in self.topology.infos() {
                    for tree in [&info.name, &info.parent] {
                        if !fits(tree) {
                            digests.insert(self::key("t", tree));
                        }
                    }
                    for namespace in info.namespaces.iter().filter(|n| !fits(n)) {
                        digests.insert(self::key("n", namespace));
                    }
                }
                digests
            })
            .contains(key)
    }
}

/// The top-most quota under the root above `name` whose parent is `parent` (itself for a quota
/// directly under the root; an unknown ancestor ends the walk).
fn tree_of<'a>(topology: &'a QuotaTopology, name: &'a str, parent: &'a str) -> &'a str {
    let (mut top, mut next) = (name, parent);
    // At most one step per quota: a cycle in a stale cache ends the walk too.
    for _ in 0..=topology.len() {
        if next.is_empty() || next == ROOT_QUOTA {
            break;
        }
        top = next;
        next = topology.get(next).map_or("", |i| i.parent.as_str());
    }
    top
}

/// The change a request makes, as the ledger records it; `None` for what changes nothing.
pub fn change_of(
    uid: &str,
    operation: &Operation,
    object: Option<&ElasticQuota>,
    old: Option<&ElasticQuota>,
) -> Option<PendingChange> {
    let (kind, quota) = match operation {
        Operation::Create => (ChangeKind::Create, object?),
        Operation::Update => (ChangeKind::Update, old.or(object)?),
        Operation::Delete => (ChangeKind::Delete, old?),
        Operation::Connect => return None,
    };
    Some(PendingChange {
        id: uid.to_owned(),
        namespace: quota.metadata.namespace.clone().unwrap_or_default(),
        name: quota.metadata.name.clone().unwrap_or_default(),
        operation: kind,
        resource_version: match kind {
            ChangeKind::Update => quota.metadata.resource_version.clone(),
            _ => None,
        },
        at: 0,
        caller: None,
    })
}

/// Whether `change` has reached the cache: created, updated past the version it changed, or gone.
pub fn visible(change: &PendingChange, cache: &Cache) -> bool {
    shown_in(
        change,
        cache
            .elastic_quotas
            .get(Some(&change.namespace), &change.name)
            .as_deref(),
    )
}

/// Whether `change` has reached the cache, `None` while the cache has not listed ElasticQuotas
/// yet: a quota missing from it then says nothing (a forged change would seem pending).
pub fn shown(change: &PendingChange, cache: &Cache) -> Option<bool> {
    cache
        .elastic_quotas
        .is_ready()
        .then(|| visible(change, cache))
}

fn shown_in(change: &PendingChange, current: Option<&ElasticQuota>) -> bool {
    match change.operation {
        ChangeKind::Create => current.is_some(),
        ChangeKind::Update => current.is_none_or(|q| {
            match versions(q.metadata.resource_version.as_deref(), change) {
                // A cache behind the version changed has not seen the change yet.
                Some((cached, changed)) => cached > changed,
                None => q.metadata.resource_version != change.resource_version,
            }
        }),
        ChangeKind::Delete => current.is_none_or(|q| q.metadata.deletion_timestamp.is_some()),
    }
}

/// Whether `change` is an UPDATE of a version older than the cache holds: the API server cannot
/// store it as reviewed (its write would conflict, and it reviews the update again on the newer
/// version), so it needs neither a wait nor a record.
/// So is one whose old version is not a number when the cache's is: the API server gave it no such
/// version.
pub fn superseded(change: &PendingChange, cache: &Cache) -> bool {
    if change.operation != ChangeKind::Update {
        return false;
    }
    let Some(cached) = cache
        .elastic_quotas
        .get(Some(&change.namespace), &change.name)
    else {
        return false;
    };
    let cached = cached.metadata.resource_version.as_deref();
    match versions(cached, change) {
        Some((cached, changed)) => cached > changed,
        None => cached.is_some_and(|v| v.parse::<u64>().is_ok()),
    }
}

/// The cached and the changed resourceVersions as numbers, when both are (etcd's revisions:
/// Kubernetes asks clients not to order them, but they are ordered; otherwise only told apart).
fn versions(cached: Option<&str>, change: &PendingChange) -> Option<(u64, u64)> {
    let parse = |v: Option<&str>| v?.parse::<u64>().ok();
    Some((parse(cached)?, parse(change.resource_version.as_deref())?))
}
