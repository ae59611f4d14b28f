//! The record of a pod entry's reach, kept as an annotation on its webhook configuration so that it
//! changes in the same write as the entry's `matchConditions`, under the configuration's
//! resourceVersion (docs/narrowing.md, "Pods").
//!
//! Two writers share it: a replica admitting a change that needs the entry (a profile, a parent
//! quota) widens the entry if the recorded reach does not cover the change, and in any case stamps
//! `touched`; the leader narrows to what its cache derives only once nothing has been touched for
//! the hold time, so a change admitted but not yet in its cache is never narrowed away.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::pod::{PodEntry, Reach};
use crate::entries::ENDPOINTS;
use crate::entries::Narrowing;

/// The annotation holding the record on each webhook configuration.
pub const REACH_ANNOTATION: &str = "koord-webhook.koordinator.sh/pod-reach";

/// How long after a widened entry is written the API server acts on it: its informer on webhook
/// configurations (measured 5-23 ms on one kube-apiserver, docs/narrowing.md), with margin for
/// several API servers. An admission that widened waits this long before it allows.
pub const SETTLE: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReachRecord {
    /// The reach the entry's conditions were written for.
    pub reach: Reach,
    /// When they were last written (Unix milliseconds; 0 unknown).
    pub changed_ms: u64,
    /// When a change that needs the entry was last admitted (Unix milliseconds; 0 never).
    pub touched_ms: u64,
}

impl PodEntry {
    /// The entry's name in its configuration, as the webhook table has it.
    pub fn entry_name(self) -> &'static str {
        entry_with(match self {
            PodEntry::Create => Narrowing::PodCreate,
            PodEntry::Validate => Narrowing::PodValidation,
        })
    }

    /// The entry every change that can widen this one passes (failurePolicy Fail).
    pub fn guard_entry(self) -> &'static str {
        entry_with(match self {
            PodEntry::Create => Narrowing::PodReachGuard,
            PodEntry::Validate => Narrowing::ElasticQuotaChange,
        })
    }
}

/// The name of the table's entry narrowed this way (each of these narrowings names one entry).
fn entry_with(narrowing: Narrowing) -> &'static str {
    ENDPOINTS
        .iter()
        .flat_map(|w| w.entries)
        .find(|e| e.narrowing == narrowing)
        .map_or("", |e| e.name)
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a configuration (as JSON) says of one pod entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryState {
    /// The entry's index in `webhooks`; `None` when it is not registered.
    pub index: Option<usize>,
    /// The entry carries `matchConditions`.
    pub narrowed: bool,
    /// The record, if present and readable.
    pub record: Option<ReachRecord>,
    pub resource_version: Option<String>,
    has_annotations: bool,
}

impl EntryState {
    pub fn read(configuration: &Value, entry: PodEntry) -> Self {
        let webhooks = configuration["webhooks"].as_array();
        let index = webhooks.and_then(|w| w.iter().position(|e| e["name"] == entry.entry_name()));
        let narrowed = index
            .and_then(|i| configuration["webhooks"][i]["matchConditions"].as_array())
            .is_some_and(|c| !c.is_empty());
        let annotations = &configuration["metadata"]["annotations"];
        let record = annotations[REACH_ANNOTATION]
            .as_str()
            .and_then(|text| serde_json::from_str(text).ok());
        Self {
            index,
            narrowed,
            record,
            resource_version: configuration["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_owned),
            has_annotations: annotations.is_object(),
        }
    }

    /// The reach the entry is written for: every request when it has no conditions; the record's
    /// when it has; unknown (`None`) when it has conditions and no readable record.
    pub fn written(&self) -> Option<Reach> {
        if !self.narrowed {
            return Some(Reach::Every);
        }
        self.record.as_ref().map(|r| r.reach.clone())
    }

    /// The JSON patch operation that stores `record`.
    pub fn record_op(&self, record: &ReachRecord) -> Value {
        let text = serde_json::to_string(record).unwrap_or_default();
        if self.has_annotations {
            let key = REACH_ANNOTATION.replace('~', "~0").replace('/', "~1");
            json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": text})
        } else {
            let annotations: BTreeMap<&str, String> = BTreeMap::from([(REACH_ANNOTATION, text)]);
            json!({"op": "add", "path": "/metadata/annotations", "value": annotations})
        }
    }

    /// The operation that makes a JSON patch conditional on the resourceVersion read (the API
    /// server answers 409 when the configuration changed since).
    pub fn precondition(&self) -> Vec<Value> {
        self.resource_version
            .iter()
            .map(|rv| json!({"op": "add", "path": "/metadata/resourceVersion", "value": rv}))
            .collect()
    }

    /// The operations that send the entry every request (its conditions removed).
    pub fn widen_ops(&self, entry: PodEntry) -> Vec<Value> {
        match self.index {
            Some(i) if self.narrowed => vec![
                json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": entry.entry_name()}),
                json!({"op": "remove", "path": format!("/webhooks/{i}/matchConditions")}),
            ],
            _ => Vec::new(),
        }
    }
}

/// What a replica admitting a change that needs `needed` must write before it allows, and how
/// long it then waits: `None` when the entry is not registered (nothing is sent, nothing to keep).
pub fn admit_plan(
    state: &EntryState,
    entry: PodEntry,
    needed: &Reach,
    now: u64,
) -> Option<(Vec<Value>, Duration)> {
    state.index?;
    let settle = SETTLE.as_millis() as u64;
    match state.written() {
        Some(written) if written.covers(needed) => {
            let changed = state.record.as_ref().map_or(0, |r| r.changed_ms);
            let record = ReachRecord {
                reach: written,
                changed_ms: changed,
                touched_ms: now,
            };
            // A widening written a moment ago (by another replica) may not be in effect yet.
            let wait = match changed {
                0 => 0,
                at => (at + settle).saturating_sub(now).min(settle),
            };
            let mut ops = state.precondition();
            ops.push(state.record_op(&record));
            Some((ops, Duration::from_millis(wait)))
        }
        _ => {
            let record = ReachRecord {
                reach: Reach::Every,
                changed_ms: now,
                touched_ms: now,
            };
            let mut ops = state.precondition();
            ops.push(state.record_op(&record));
            ops.extend(state.widen_ops(entry));
            Some((ops, SETTLE))
        }
    }
}

/// The reach the leader writes: what its cache derives once the hold has passed since the last
/// admitted change (and since its cache synced); until then no narrower than what is written.
pub fn leader_reach(written: Option<Reach>, derived: Reach, hold_passed: bool) -> Reach {
    if hold_passed {
        derived
    } else {
        written.unwrap_or(Reach::Every).union(derived)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn only(terms: &[&str]) -> Reach {
        Reach::Only(
            terms
                .iter()
                .map(|t| (*t).to_owned())
                .collect::<BTreeSet<_>>(),
        )
    }

    fn configuration(conditions: bool, record: Option<&ReachRecord>) -> Value {
        let mut entry = json!({"name": "vpod.koordinator.sh"});
        if conditions {
            entry["matchConditions"] = json!([{"name": "x", "expression": "true"}]);
        }
        let mut metadata = json!({"name": "c", "resourceVersion": "7"});
        if let Some(r) = record {
            metadata["annotations"] = json!({REACH_ANNOTATION: serde_json::to_string(r).unwrap()});
        }
        json!({"metadata": metadata, "webhooks": [{"name": "other"}, entry]})
    }

    fn patched(configuration: &Value, ops: Vec<Value>) -> Value {
        let mut out = configuration.clone();
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut out, &patch).unwrap();
        out
    }

    #[test]
    fn pod_entries_and_their_guards_are_in_the_table() {
        assert_eq!(PodEntry::Create.entry_name(), "mpod-create.koordinator.sh");
        assert_eq!(PodEntry::Validate.entry_name(), "vpod.koordinator.sh");
        assert_eq!(
            PodEntry::Create.guard_entry(),
            "vclustercolocationprofile.koordinator.sh"
        );
        assert_eq!(
            PodEntry::Validate.guard_entry(),
            "velasticquota.koordinator.sh"
        );
    }

    #[test]
    fn a_covered_change_only_stamps_the_record() {
        let record = ReachRecord {
            reach: only(&["a", "b"]),
            changed_ms: 1_000,
            touched_ms: 5,
        };
        let config = configuration(true, Some(&record));
        let state = EntryState::read(&config, PodEntry::Validate);
        let (ops, wait) = admit_plan(&state, PodEntry::Validate, &only(&["a"]), 60_000).unwrap();
        assert_eq!(wait, Duration::ZERO);
        let after = EntryState::read(&patched(&config, ops), PodEntry::Validate);
        assert!(after.narrowed);
        assert_eq!(
            after.record,
            Some(ReachRecord {
                touched_ms: 60_000,
                ..record
            })
        );
        assert_eq!(after.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn an_uncovered_change_widens_the_entry_and_waits() {
        let record = ReachRecord {
            reach: only(&["a"]),
            changed_ms: 1_000,
            touched_ms: 5,
        };
        let config = configuration(true, Some(&record));
        let state = EntryState::read(&config, PodEntry::Validate);
        let (ops, wait) = admit_plan(&state, PodEntry::Validate, &only(&["c"]), 60_000).unwrap();
        assert_eq!(wait, SETTLE);
        let after = EntryState::read(&patched(&config, ops), PodEntry::Validate);
        assert!(!after.narrowed, "conditions removed");
        assert_eq!(after.written(), Some(Reach::Every));
        assert_eq!(after.record.unwrap().touched_ms, 60_000);
    }

    #[test]
    fn conditions_without_a_record_are_widened_and_a_wide_entry_is_stamped() {
        let config = configuration(true, None);
        let state = EntryState::read(&config, PodEntry::Validate);
        assert_eq!(state.written(), None);
        let (ops, _) = admit_plan(&state, PodEntry::Validate, &only(&["a"]), 9).unwrap();
        assert!(!EntryState::read(&patched(&config, ops), PodEntry::Validate).narrowed);

        let wide = configuration(false, None);
        let state = EntryState::read(&wide, PodEntry::Validate);
        let (ops, wait) = admit_plan(&state, PodEntry::Validate, &Reach::Every, 9).unwrap();
        assert_eq!(wait, Duration::ZERO);
        let after = EntryState::read(&patched(&wide, ops), PodEntry::Validate);
        assert_eq!(after.record.unwrap().touched_ms, 9);
        // Not registered: nothing to write.
        let state = EntryState::read(&wide, PodEntry::Create);
        assert!(admit_plan(&state, PodEntry::Create, &Reach::Every, 9).is_none());
    }

    #[test]
    fn a_recent_widening_by_someone_else_is_waited_for() {
        let record = ReachRecord {
            reach: Reach::Every,
            changed_ms: 10_000,
            touched_ms: 10_000,
        };
        let config = configuration(false, Some(&record));
        let state = EntryState::read(&config, PodEntry::Validate);
        let (_, wait) = admit_plan(&state, PodEntry::Validate, &only(&["a"]), 10_400).unwrap();
        assert_eq!(wait, Duration::from_millis(600));
    }

    #[test]
    fn the_leader_narrows_only_after_the_hold() {
        let written = Some(only(&["a", "b"]));
        assert_eq!(
            leader_reach(written.clone(), only(&["c"]), false),
            only(&["a", "b", "c"])
        );
        assert_eq!(leader_reach(written, only(&["c"]), true), only(&["c"]));
        assert_eq!(leader_reach(None, only(&["c"]), false), Reach::Every);
    }
}
