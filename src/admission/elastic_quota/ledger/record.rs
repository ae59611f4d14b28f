//! The record's contents: what a change waits for and was checked after, and the record after a
//! batch is written (which entries stay).

use std::collections::{BTreeMap, BTreeSet};

use super::{HARD_MAX_ENTRIES, MAX_ENTRIES, PENDING_TIMEOUT, SEEN_GRACE_SECONDS, WHOLE_RECORD};
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
/// and the last of them the last of the whole. Entries older than twice [`PENDING_TIMEOUT`] leave;
/// beyond [`MAX_ENTRIES`], the oldest of those `seen` here for [`SEEN_GRACE_SECONDS`] leave too, and
/// no other: a young change no replica may have seen stays, up to [`HARD_MAX_ENTRIES`] (`None`
/// beyond: the changes wait).
pub(super) fn next_record(
    last: &BTreeMap<String, PendingChange>,
    changes: &[(&BTreeSet<String>, PendingChange)],
    now: i64,
    seen: impl Fn(&PendingChange) -> bool,
) -> Option<BTreeMap<String, PendingChange>> {
    let horizon = (PENDING_TIMEOUT * 2).as_secs() as i64;
    let written = |k: &String| changes.iter().any(|(keys, _)| keys.contains(k));
    let mut kept: Vec<(&String, &PendingChange)> = last
        .iter()
        .filter(|(k, c)| *k != WHOLE_RECORD && !written(k) && now - c.at < horizon)
        .collect();
    let new_keys: usize = changes.iter().map(|(keys, _)| keys.len()).sum();
    let mut over = (kept.len() + new_keys + 1).saturating_sub(MAX_ENTRIES);
    if over > 0 {
        // Oldest first; among those of one second, in key order (the record's own).
        kept.sort_by_key(|(_, c)| c.at);
        kept.retain(|(_, c)| {
            let leaves = over > 0 && now - c.at >= SEEN_GRACE_SECONDS && seen(c);
            over -= usize::from(leaves);
            !leaves
        });
    }
    if kept.len() + new_keys + 1 > HARD_MAX_ENTRIES {
        return None;
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
    Some(next)
}
