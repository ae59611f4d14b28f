//! Which callers' changes show up. Without client authentication the ledger cannot tell a forged
//! review from a real one when it is sent; it can afterwards: a real change reaches the cache within
//! milliseconds, a forged one never does. Each replica counts, per caller (the peer address each
//! entry records), the changes it has seen recorded that showed after being pending, and those that
//! never did (`Sightings::sight`); a caller with [`STRIKES`] that never showed and none that did is
//! distrusted: not waited for, and its own changes not recorded, so a forger racing real changes
//! with fresh entries stops costing them anything after a few.
//!
//! A change "showing" proves little: anyone can forge an UPDATE of a quota that someone else then
//! changes. Trust takes proof: a CREATE that shows with the uid its review carried, which the API
//! server sets just before validating admission and no one else can know (`keys::shown_and_proven`).
//! Once a replica holds that proof for one caller, it knows the API server's address, and writes it
//! into the record for every replica (`LedgerRecord::proven`): a change from any caller nothing is
//! known of is then checked against the cache and not recorded ([`Callers::unrecorded`]), so forged
//! reviews from fresh addresses never hold a key that real changes wait for. A write names the
//! version it read, so once the proof is in the record no replica records such a change again. (A
//! second API server address, in a cluster with several, is recorded again once one of its CREATEs
//! shows; until then its changes are checked against each replica's cache alone, as Koordinator
//! checks every change.)

use std::collections::HashMap;

use crate::admission::ports::ProvenCallers;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Changes that never showed, with none that did, before a caller is no longer waited for.
pub const STRIKES: u32 = 5;
/// Callers remembered at most; past it, those with no change shown are forgotten.
const MAX_CALLERS: usize = 4096;
/// Proven callers the record keeps at most: the API server's addresses, a few.
pub const MAX_PROVEN: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    Trusted,
    Unknown,
    Distrusted,
}

#[derive(Default)]
pub struct Callers {
    by_address: Mutex<HashMap<String, Counts>>,
    /// Whether some caller has proven itself the API server (never forgotten: see `judge`).
    someone_proven: AtomicBool,
    /// A caller proven here that the record may not name yet.
    unpublished: AtomicBool,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    proven: u32,
    shown: u32,
    never_shown: u32,
}

/// What became of a recorded change a replica looked at while it was pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sighting {
    /// A CREATE that showed with the uid its review carried: only the API server's can.
    Proven,
    /// Showed, which anyone's forged UPDATE can seem to do.
    Shown,
    NeverShown,
}

impl Callers {
    /// A change of `caller`'s was looked at: what became of it.
    pub fn judge(&self, caller: Option<&str>, sighting: Sighting) {
        let Some(caller) = caller else { return };
        let mut by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        if by.len() >= MAX_CALLERS && !by.contains_key(caller) {
            // The trusted are the API server's addresses (proof cannot be forged): a few.
            by.retain(|_, c| c.proven > 0);
        }
        let counts = by.entry(caller.to_owned()).or_default();
        match sighting {
            Sighting::Proven => {
                if counts.proven == 0 {
                    self.unpublished.store(true, Ordering::Relaxed);
                }
                counts.proven = counts.proven.saturating_add(1);
                counts.shown = counts.shown.saturating_add(1);
                self.someone_proven.store(true, Ordering::Relaxed);
            }
            Sighting::Shown => counts.shown = counts.shown.saturating_add(1),
            Sighting::NeverShown => counts.never_shown = counts.never_shown.saturating_add(1),
        }
    }

    /// Takes the callers another replica proved, as the record names them.
    pub fn adopt(&self, proven: &ProvenCallers) {
        if proven.is_empty() {
            return;
        }
        let mut by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        for caller in proven.iter().take(MAX_PROVEN) {
            let counts = by.entry(caller.clone()).or_default();
            counts.proven = counts.proven.max(1);
        }
        self.someone_proven.store(true, Ordering::Relaxed);
    }

    /// The record's proven callers with those proven here that it lacks added last; past
    /// [`MAX_PROVEN`], the oldest proofs leave (an API server that moved addresses long ago).
    pub fn proven_with(&self, record: &ProvenCallers) -> ProvenCallers {
        let by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        let mut all = record.clone();
        let mut mine: Vec<&String> = by
            .iter()
            .filter(|(caller, c)| c.proven > 0 && !record.contains(caller))
            .map(|(caller, _)| caller)
            .collect();
        mine.sort();
        all.extend(mine.into_iter().cloned());
        let over = all.len().saturating_sub(MAX_PROVEN);
        all.drain(..over);
        all
    }

    /// Whether a caller was proven here since the last call: the record should be told.
    pub fn take_unpublished(&self) -> bool {
        self.unpublished.swap(false, Ordering::Relaxed)
    }

    /// Whether changes of `caller` are no longer waited for.
    pub fn distrusted(&self, caller: Option<&str>) -> bool {
        self.trust(caller) == Trust::Distrusted
    }

    /// Whether a change of `caller` is checked against the cache without being recorded: the
    /// caller is distrusted, or nothing is known of it while another caller has proven itself the
    /// API server. A change without a caller (no server in front: the `review` command) is
    /// recorded.
    pub fn unrecorded(&self, caller: Option<&str>) -> bool {
        match self.trust(caller) {
            Trust::Trusted => false,
            Trust::Distrusted => true,
            Trust::Unknown => caller.is_some() && self.someone_proven.load(Ordering::Relaxed),
        }
    }

    /// What is known of `caller`: a CREATE of its proven (the API server's), [`STRIKES`] changes
    /// never showed and none did, or neither yet (and a change recorded without a caller).
    pub fn trust(&self, caller: Option<&str>) -> Trust {
        let Some(caller) = caller else {
            return Trust::Unknown;
        };
        let by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        match by.get(caller) {
            Some(c) if c.proven > 0 => Trust::Trusted,
            Some(c) if c.never_shown >= STRIKES && c.shown == 0 => Trust::Distrusted,
            _ => Trust::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_any_proof_every_caller_not_distrusted_is_recorded() {
        let callers = Callers::default();
        callers.judge(Some("10.0.0.7"), Sighting::Shown);
        for _ in 0..STRIKES {
            callers.judge(Some("10.0.0.66"), Sighting::NeverShown);
        }
        assert!(!callers.unrecorded(Some("10.0.0.7")));
        assert!(!callers.unrecorded(Some("10.9.9.9")));
        assert!(callers.unrecorded(Some("10.0.0.66")));
    }

    #[test]
    fn a_proof_is_published_once_and_adopted_by_other_replicas() {
        let here = Callers::default();
        here.judge(Some("10.0.0.1"), Sighting::Proven);
        assert!(here.take_unpublished());
        here.judge(Some("10.0.0.1"), Sighting::Proven);
        assert!(
            !here.take_unpublished(),
            "one proof of a caller is published once"
        );
        let record = here.proven_with(&Vec::new());
        assert_eq!(record, ["10.0.0.1"]);
        // Another replica, which has seen nothing yet, reads the record.
        let there = Callers::default();
        assert!(!there.unrecorded(Some("10.1.0.9")));
        there.adopt(&record);
        assert!(!there.unrecorded(Some("10.0.0.1")));
        assert!(there.unrecorded(Some("10.1.0.9")));
        assert!(
            !there.take_unpublished(),
            "an adopted proof is not published again"
        );
        // The record keeps the latest MAX_PROVEN proofs, the oldest first.
        let mut record: ProvenCallers = (0..MAX_PROVEN).map(|i| format!("10.9.0.{i}")).collect();
        record = here.proven_with(&record);
        assert_eq!(record.len(), MAX_PROVEN);
        assert_eq!(record.last().map(String::as_str), Some("10.0.0.1"));
        assert_eq!(record[0], "10.9.0.1");
        assert_eq!(here.proven_with(&record), record, "nothing new: unchanged");
    }

    #[test]
    fn a_caller_is_distrusted_after_strikes_without_a_change_shown() {
        let callers = Callers::default();
        for _ in 0..STRIKES - 1 {
            callers.judge(Some("10.0.0.66"), Sighting::NeverShown);
        }
        assert!(!callers.distrusted(Some("10.0.0.66")));
        callers.judge(Some("10.0.0.66"), Sighting::NeverShown);
        assert!(callers.distrusted(Some("10.0.0.66")));
        // One proven change makes a caller trusted, however many never show.
        for _ in 0..10 {
            callers.judge(Some("10.0.0.1"), Sighting::NeverShown);
        }
        callers.judge(Some("10.0.0.1"), Sighting::Proven);
        assert_eq!(callers.trust(Some("10.0.0.1")), Trust::Trusted);
        // A change that showed keeps a caller from distrust, and earns no trust.
        for _ in 0..STRIKES {
            callers.judge(Some("10.0.0.7"), Sighting::NeverShown);
        }
        callers.judge(Some("10.0.0.7"), Sighting::Shown);
        assert_eq!(callers.trust(Some("10.0.0.7")), Trust::Unknown);
        assert!(
            !callers.distrusted(None),
            "entries without a caller are always waited for"
        );
        // A caller proven: every caller nothing is known of is checked without being recorded;
        // the proven one, and changes without a caller, are recorded.
        assert!(callers.unrecorded(Some("10.0.0.7")));
        assert!(callers.unrecorded(Some("10.9.9.9")));
        assert!(callers.unrecorded(Some("10.0.0.66")));
        assert!(!callers.unrecorded(Some("10.0.0.1")));
        assert!(!callers.unrecorded(None));
        // A flood of callers forgets the distrusted ones first, never a trusted one.
        for i in 0..MAX_CALLERS {
            callers.judge(Some(&format!("f{i}")), Sighting::NeverShown);
        }
        // Callers whose changes merely showed do not fill it either (a forger's addresses).
        for i in 0..MAX_CALLERS * 2 {
            callers.judge(Some(&format!("s{i}")), Sighting::Shown);
        }
        assert!(callers.by_address.lock().unwrap().len() <= MAX_CALLERS);
        assert!(!callers.distrusted(Some("10.0.0.1")));
        assert!(callers.by_address.lock().unwrap().get("10.0.0.1").is_some());
    }
}
