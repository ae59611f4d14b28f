//! The record's contents: what a change waits for and was checked after, and the record after a
//! batch is written (which entries stay).

use std::collections::{BTreeMap, BTreeSet};

use super::bounds::{
    HARD_MAX_ENTRIES, MAX_ENTRIES, PENDING_TIMEOUT, SEEN_GRACE_SECONDS, WHOLE_RECORD,
};
use crate::admission::ports::PendingChange;

/// The last change of each of `keys` other than `id` itself, and an older replica's change under
/// the whole record's key only (see [`waited_for`]): what a check was made after.
pub(super) fn seen_of(
    last: &BTreeMap<String, PendingChange>,
    keys: &BTreeSet<String>,
    id: &str,
) -> BTreeMap<String, Option<String>> {
    let mut seen: BTreeMap<String, Option<String>> = keys
        .iter()
        .map(|k| (k.clone(), last.get(k).map(|c| c.id.clone())))
        .collect();
    if let Some(whole) = orphan_whole(last)
        && whole.id != id
    {
        seen.insert(WHOLE_RECORD.to_owned(), Some(whole.id.clone()));
    }
    seen
}

/// The whole record's change when no other key names it: an older replica wrote it.
pub(super) fn orphan_whole(last: &BTreeMap<String, PendingChange>) -> Option<&PendingChange> {
    let whole = last.get(WHOLE_RECORD)?;
    let named = last
        .iter()
        .any(|(k, c)| k != WHOLE_RECORD && c.id == whole.id);
    (!named).then_some(whole)
}

/// The last changes a change with `keys` waits for: its keys' (other than itself), and the whole
/// record's when an older replica wrote it (it is then under no other key).
pub(super) fn waited_for<'a>(
    last: &'a BTreeMap<String, PendingChange>,
    keys: &BTreeSet<String>,
    id: &str,
) -> Vec<&'a PendingChange> {
    let mut waited: Vec<&PendingChange> = keys.iter().filter_map(|k| last.get(k)).collect();
    waited.extend(orphan_whole(last));
    waited.retain(|c| c.id != id);
    waited.sort_by(|a, b| a.id.cmp(&b.id));
    waited.dedup_by(|a, b| a.id == b.id);
    waited
}

/// The record after `changes` (disjoint keys each) are admitted at `now`, each the last of its keys
/// and the last of them the last of the whole. Never more than [`HARD_MAX_ENTRIES`] entries, and
/// never a refusal: what a full record drops is chosen so that no writer can push out entries
/// under keys it does not name except by flooding keys the cluster does not have.
/// 1. Entries older than twice [`PENDING_TIMEOUT`] leave: nobody waits for them.
/// 2. Beyond [`MAX_ENTRIES`], the oldest leave of those `seen` here for [`SEEN_GRACE_SECONDS`]
///    and those past [`PENDING_TIMEOUT`], seen or not: every replica has stopped waiting for them.
/// 3. Beyond [`HARD_MAX_ENTRIES`] (young entries no replica may have seen yet), the entries under
///    keys the cache does not `stored` (a tree no quota is in, a namespace no quota binds) leave:
///    only a change not yet in the cache (a create, a new binding) or one that never will be (a
///    forged review) names such a key, so they do not count against the cap.
/// 4. Still beyond it, the others leave; the cap counts per tree then.
///
/// Steps 3 and 4 level the trees: the tree holding the most entries loses its oldest first (a
/// namespace entry counts in the tree of its change). A tree holds about one change's keys not
/// yet seen (at most [`super::BATCH_KEYS`]: each change waits for its tree's last), so a few forged
/// changes of many keys lose their own entries before a real change of a few keys loses one.
pub(super) fn next_record(
    last: &BTreeMap<String, PendingChange>,
    changes: &[(&BTreeSet<String>, PendingChange)],
    now: i64,
    seen: impl Fn(&PendingChange) -> bool,
    stored: impl Fn(&str) -> bool,
) -> BTreeMap<String, PendingChange> {
    let horizon = (PENDING_TIMEOUT * 2).as_secs() as i64;
    let pending = PENDING_TIMEOUT.as_secs() as i64;
    let written = |k: &String| changes.iter().any(|(keys, _)| keys.contains(k));
    let mut kept: Vec<(&String, &PendingChange)> = last
        .iter()
        .filter(|(k, c)| *k != WHOLE_RECORD && !written(k) && now - c.at < horizon)
        .collect();
    let new_keys: usize = changes.iter().map(|(keys, _)| keys.len()).sum();
    // How many of the kept entries fit beside the new ones and the whole record's key.
    let room = |max: usize| max.saturating_sub(new_keys + 1);
    if kept.len() > room(MAX_ENTRIES) {
        let mut over = kept.len() - room(MAX_ENTRIES);
        // Oldest first; among those of one second, in key order (the record's own).
        kept.sort_by_key(|(_, c)| c.at);
        kept.retain(|(_, c)| {
            let age = now - c.at;
            let leaves = over > 0 && (age >= pending || (age >= SEEN_GRACE_SECONDS && seen(c)));
            over -= usize::from(leaves);
            !leaves
        });
    }
    if kept.len() > room(HARD_MAX_ENTRIES) {
        let over = kept.len() - room(HARD_MAX_ENTRIES);
        let over = level(&mut kept, over, |k| !stored(k));
        level(&mut kept, over, |_| true);
    }
    let mut next: BTreeMap<String, PendingChange> = kept
        .into_iter()
        .map(|(k, c)| (k.clone(), c.clone()))
        .collect();
    for (keys, change) in changes {
        for key in keys.iter() {
            next.insert(key.clone(), change.clone());
        }
    }
    if let Some((_, newest)) = changes.last() {
        next.insert(WHOLE_RECORD.to_owned(), newest.clone());
    }
    next
}

/// Drops `over` of the `kept` entries whose key is a `candidate`: each time the oldest of the tree
/// holding the most candidates (among equals, the tree whose oldest is oldest); returns how many
/// more should have gone (none were left).
fn level(
    kept: &mut Vec<(&String, &PendingChange)>,
    mut over: usize,
    candidate: impl Fn(&str) -> bool,
) -> usize {
    if over == 0 {
        return 0;
    }
    // The tree of each change, by its tree key: what its namespace entries count in.
    let mut tree_of: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, c) in kept.iter() {
        if is_tree(k) {
            tree_of.entry(c.id.as_str()).or_insert(k.as_str());
        }
    }
    // Per tree, its candidates' positions in `kept`, newest first (so the oldest pops). A
    // namespace entry whose change no longer names a tree key counts on its own change's.
    let mut trees: BTreeMap<(bool, &str), Vec<usize>> = BTreeMap::new();
    for (i, (k, c)) in kept.iter().enumerate() {
        if candidate(k) {
            let tree = if is_tree(k) {
                Some(k.as_str())
            } else {
                tree_of.get(c.id.as_str()).copied()
            };
            let group = tree.map_or((false, c.id.as_str()), |t| (true, t));
            trees.entry(group).or_default().push(i);
        }
    }
    for positions in trees.values_mut() {
        positions.sort_by_key(|&i| std::cmp::Reverse((kept[i].1.at, kept[i].0)));
    }
    let mut gone = vec![false; kept.len()];
    while over > 0 {
        let Some(positions) = trees
            .values_mut()
            .filter(|p| !p.is_empty())
            .max_by_key(|p| {
                let oldest = p[p.len() - 1];
                (p.len(), std::cmp::Reverse(kept[oldest].1.at))
            })
        else {
            break;
        };
        if let Some(i) = positions.pop() {
            gone[i] = true;
            over -= 1;
        }
    }
    let mut i = 0;
    kept.retain(|_| {
        i += 1;
        !gone[i - 1]
    });
    over
}

/// A tree's key (`t.` or, by digest, `t-`), as opposed to a namespace's.
fn is_tree(key: &str) -> bool {
    key.starts_with("t.") || key.starts_with("t-")
}
