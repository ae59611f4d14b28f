//! Which callers' changes show up. Without client authentication the ledger cannot tell a forged
//! review from a real one when it is sent; it can afterwards: a real change reaches the cache within
//! milliseconds, a forged one never does. Each replica counts, per caller (the peer address each
//! entry records), the changes it has seen recorded that showed after being pending, and those that
//! never did (`Sightings::sight`); a caller with [`STRIKES`] that never showed and none that did is
//! distrusted: not waited for, and its own changes not recorded, so a forger racing real changes
//! with fresh entries stops costing them anything after a few.
//!
//! A change "showing" proves little: anyone can forge an UPDATE of a quota that someone else then
//! changes, and a tenant allowed to create quotas can replay its new quota's uid before a replica's
//! watch delivers it. Trust takes proof: a probe one of the replicas made through the API server
//! (`probe.rs`), which only the API server forwards. Once a replica holds that proof for one
//! caller, it knows the API server's address, and writes it into the record for every replica
//! (`LedgerRecord::proven`): a change from any caller nothing is known of is then checked against
//! the cache and not recorded ([`Callers::unrecorded`]), so forged reviews never hold a key that
//! real changes wait for. A write names the version it read, so once the proof is in the record no
//! replica records such a change again. (A second API server address, in a cluster with several,
//! is recorded once a probe reaches it (the replicas probe over a new connection each time);
//! until then its changes are checked against each replica's cache alone, as Koordinator checks
//! every change.)

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
    /// A caller proven here that the record may not name yet.
    unpublished: AtomicBool,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    proven: u32,
    shown: u32,
    never_shown: u32,
    /// Changes that never showed since the last proof (a change merely shown resets nothing:
    /// anyone's forged UPDATE of a quota someone else changes shows).
    never_shown_run: u32,
}

/// What became of a recorded change a replica looked at while it was pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sighting {
    /// Sent a probe a replica made (`probe.rs`): only the API server can.
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
                counts.never_shown_run = 0;
            }
            Sighting::Shown => counts.shown = counts.shown.saturating_add(1),
            Sighting::NeverShown => {
                counts.never_shown = counts.never_shown.saturating_add(1);
                counts.never_shown_run = counts.never_shown_run.saturating_add(1);
            }
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
    }

    /// The record's proven callers with those proven here that it lacks added last, up to
    /// [`MAX_PROVEN`]: a proof never leaves the record (dropping the oldest would let proofs that
    /// came later, forged or not, push out the API server's).
    pub fn proven_with(&self, record: &ProvenCallers) -> ProvenCallers {
        let by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        let mut mine: Vec<&String> = by
            .iter()
            .filter(|(caller, c)| c.proven > 0 && !record.contains(caller))
            .map(|(caller, _)| caller)
            .collect();
        mine.sort();
        let room = MAX_PROVEN.saturating_sub(record.len());
        let mut all = record.clone();
        all.extend(mine.into_iter().take(room).cloned());
        all
    }

    /// Whether a caller was proven here since the last call: the record should be told.
    pub fn take_unpublished(&self) -> bool {
        self.unpublished.swap(false, Ordering::Relaxed)
    }

    /// Whether a trusted caller's last [`STRIKES`] changes all never showed: its entries are then
    /// waited for no longer than an unknown caller's past a request's wait (the API server's
    /// changes denied by a later webhook, or a caller whose proof was forged, cannot hold keys for
    /// long again and again).
    pub fn failing_lately(&self, caller: Option<&str>) -> bool {
        let Some(caller) = caller else { return false };
        let by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        by.get(caller).is_some_and(|c| c.proven > 0 && !c.good())
    }

    /// Whether changes of `caller` are no longer waited for.
    pub fn distrusted(&self, caller: Option<&str>) -> bool {
        self.trust(caller) == Trust::Distrusted
    }

    /// Whether a change of `caller` is checked against the cache without being recorded: the
    /// caller is distrusted, or nothing is known of it while a proven caller's changes show (the
    /// API server, as it calls). A proven caller is always recorded, failing lately or not: any
    /// tenant can make the API server's changes fail to show (no-op UPDATEs it never stores), and
    /// unrecording it let two of its racing siblings both in (`tests/proof.rs`). A change without
    /// a caller (no server in front: the `review` command) is recorded.
    pub fn unrecorded(&self, caller: Option<&str>) -> bool {
        let Some(caller) = caller else {
            return false;
        };
        let by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        let counts = by.get(caller).copied().unwrap_or_default();
        if counts.distrusted() {
            return true;
        }
        counts.proven == 0 && by.values().any(Counts::good)
    }

    /// What is known of `caller`: a probe of its proven (the API server's), [`STRIKES`] changes
    /// never showed and none did, or neither yet (and a change recorded without a caller).
    pub fn trust(&self, caller: Option<&str>) -> Trust {
        let Some(caller) = caller else {
            return Trust::Unknown;
        };
        let by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        match by.get(caller) {
            Some(c) if c.proven > 0 => Trust::Trusted,
            Some(c) if c.distrusted() => Trust::Distrusted,
            _ => Trust::Unknown,
        }
    }
}

impl Counts {
    fn distrusted(&self) -> bool {
        self.proven == 0 && self.never_shown >= STRIKES && self.shown == 0
    }

    /// Proven, and its changes not failing lately.
    fn good(&self) -> bool {
        self.proven > 0 && self.never_shown_run < STRIKES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proven_caller_whose_changes_stop_showing_is_failing_lately_until_proven_again() {
        let callers = Callers::default();
        callers.judge(Some("10.0.0.1"), Sighting::Proven);
        for _ in 0..STRIKES - 1 {
            callers.judge(Some("10.0.0.1"), Sighting::NeverShown);
        }
        assert!(!callers.failing_lately(Some("10.0.0.1")));
        callers.judge(Some("10.0.0.1"), Sighting::NeverShown);
        assert!(callers.failing_lately(Some("10.0.0.1")));
        assert_eq!(
            callers.trust(Some("10.0.0.1")),
            Trust::Trusted,
            "still trusted"
        );
        assert!(
            !callers.unrecorded(Some("10.0.0.1")),
            "alone, still recorded"
        );
        // Beside another proven caller, a failing one is still recorded.
        callers.judge(Some("10.0.0.2"), Sighting::Proven);
        assert!(!callers.unrecorded(Some("10.0.0.1")));
        assert!(!callers.unrecorded(Some("10.0.0.2")));
        // A change merely shown does not end the run (anyone's forged UPDATE can show); a proof
        // does.
        callers.judge(Some("10.0.0.1"), Sighting::Shown);
        assert!(callers.failing_lately(Some("10.0.0.1")));
        callers.judge(Some("10.0.0.1"), Sighting::Proven);
        assert!(!callers.failing_lately(Some("10.0.0.1")));
    }

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
        // A proof never leaves the record: once it holds MAX_PROVEN, later ones are not added
        // (so proofs that come later cannot push out the API server's, the oldest).
        let mut record: ProvenCallers =
            (0..MAX_PROVEN - 1).map(|i| format!("10.9.0.{i}")).collect();
        record = here.proven_with(&record);
        assert_eq!(record.len(), MAX_PROVEN);
        assert_eq!(record.last().map(String::as_str), Some("10.0.0.1"));
        here.judge(Some("10.0.0.2"), Sighting::Proven);
        assert_eq!(here.proven_with(&record), record, "full: unchanged");
        assert_eq!(record[0], "10.9.0.0");
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
