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
//! server sets just before validating admission and no one else can know (`keys::shown_and_proven`). Only a
//! trusted caller's changes are written over unknown callers' entries past their wait (`mod.rs`).

use std::collections::HashMap;
use std::sync::Mutex;

/// Changes that never showed, with none that did, before a caller is no longer waited for.
pub const STRIKES: u32 = 5;
/// Callers remembered at most; past it, those with no change shown are forgotten.
const MAX_CALLERS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    Trusted,
    Unknown,
    Distrusted,
}

#[derive(Default)]
pub struct Callers {
    by_address: Mutex<HashMap<String, Counts>>,
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
                counts.proven = counts.proven.saturating_add(1);
                counts.shown = counts.shown.saturating_add(1);
            }
            Sighting::Shown => counts.shown = counts.shown.saturating_add(1),
            Sighting::NeverShown => counts.never_shown = counts.never_shown.saturating_add(1),
        }
    }

    /// Whether changes of `caller` are no longer waited for.
    pub fn distrusted(&self, caller: Option<&str>) -> bool {
        self.trust(caller) == Trust::Distrusted
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
