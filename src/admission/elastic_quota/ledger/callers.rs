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
use std::sync::Mutex;

use super::probe::PROOF_TTL;
use crate::admission::ports::ProvenCallers;

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
    known: Mutex<Known>,
}

#[derive(Default)]
struct Known {
    by_address: HashMap<String, Counts>,
    /// The proven callers as the record last named them (address -> when last proven).
    proven: ProvenCallers,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    shown: u32,
    never_shown: u32,
    /// Changes that never showed since the caller was last proven (a change merely shown resets
    /// nothing: anyone's forged UPDATE of a quota someone else changes shows).
    never_shown_run: u32,
}

/// What became of a recorded change a replica looked at while it was pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sighting {
    /// Showed, which anyone's forged UPDATE can seem to do.
    Shown,
    NeverShown,
}

impl Known {
    /// Proven, and not so long ago that the proof has expired.
    fn proven(&self, caller: &str, now: i64) -> bool {
        let ttl = PROOF_TTL.as_secs() as i64;
        self.proven
            .get(caller)
            .is_some_and(|at| now.saturating_sub(*at) <= ttl)
    }

    /// Proven, and its changes not failing lately.
    fn good(&self, caller: &str, now: i64) -> bool {
        self.proven(caller, now)
            && self
                .by_address
                .get(caller)
                .is_none_or(|c| c.never_shown_run < STRIKES)
    }

    fn counts(&self, caller: &str) -> Counts {
        self.by_address.get(caller).copied().unwrap_or_default()
    }
}

impl Callers {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change of `caller`'s was looked at: what became of it.
    pub fn judge(&self, caller: Option<&str>, sighting: Sighting) {
        let Some(caller) = caller else { return };
        let mut known = self.known();
        let Known { by_address, proven } = &mut *known;
        if by_address.len() >= MAX_CALLERS && !by_address.contains_key(caller) {
            // The API server's addresses (a proof cannot be forged) are a few.
            by_address.retain(|a, _| proven.contains_key(a));
        }
        let counts = by_address.entry(caller.to_owned()).or_default();
        match sighting {
            Sighting::Shown => counts.shown = counts.shown.saturating_add(1),
            Sighting::NeverShown => {
                counts.never_shown = counts.never_shown.saturating_add(1);
                counts.never_shown_run = counts.never_shown_run.saturating_add(1);
            }
        }
    }

    /// Takes the proven callers as the record names them: a proof renewed since the last read
    /// ends its caller's run of changes that never showed.
    pub fn adopt(&self, proven: &ProvenCallers) {
        let mut known = self.known();
        for (caller, at) in proven {
            if known.proven.get(caller).is_none_or(|before| before < at)
                && let Some(counts) = known.by_address.get_mut(caller)
            {
                counts.never_shown_run = 0;
            }
        }
        known.proven = proven.clone();
    }

    /// Whether a proven caller's last [`STRIKES`] changes all never showed: its entries are then
    /// waited for no longer than an unknown caller's past a request's wait (the API server's
    /// changes denied by a later webhook cannot hold keys for long again and again).
    pub fn failing_lately(&self, caller: Option<&str>) -> bool {
        let Some(caller) = caller else { return false };
        let known = self.known();
        let now = super::probe::now();
        known.proven(caller, now) && !known.good(caller, now)
    }

    /// Whether changes of `caller` are no longer waited for.
    pub fn distrusted(&self, caller: Option<&str>) -> bool {
        self.trust(caller) == Trust::Distrusted
    }

    /// Whether a change of `caller` is checked against the cache without being recorded: the
    /// caller is distrusted, or it is not proven while another is (the API server, as it calls).
    /// A proven caller is always recorded, failing lately or not: any tenant can make the API
    /// server's changes fail to show (no-op UPDATEs it never stores), and unrecording it let two
    /// of its racing siblings both in (`tests/failing.rs`); nor does its failing lately make the
    /// others recorded again (the same no-ops switched the proof off: `tests/probe_attack2.rs`).
    /// A change without a caller (no server in front: the `review` command) is recorded.
    pub fn unrecorded(&self, caller: Option<&str>) -> bool {
        let Some(caller) = caller else {
            return false;
        };
        let known = self.known();
        let now = super::probe::now();
        if known.counts(caller).distrusted() && !known.proven(caller, now) {
            return true;
        }
        !known.proven(caller, now) && known.proven.keys().any(|a| known.proven(a, now))
    }

    /// What is known of `caller`: proven by a probe (the API server's), [`STRIKES`] changes
    /// never showed and none did, or neither yet (and a change recorded without a caller).
    pub fn trust(&self, caller: Option<&str>) -> Trust {
        let Some(caller) = caller else {
            return Trust::Unknown;
        };
        let known = self.known();
        if known.proven(caller, super::probe::now()) {
            Trust::Trusted
        } else if known.counts(caller).distrusted() {
            Trust::Distrusted
        } else {
            Trust::Unknown
        }
    }
}

impl Counts {
    fn distrusted(&self) -> bool {
        self.never_shown >= STRIKES && self.shown == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proven(callers: &[&str]) -> ProvenCallers {
        let now = super::super::probe::now();
        callers.iter().map(|c| ((*c).to_owned(), now)).collect()
    }

    #[test]
    fn a_proven_caller_whose_changes_stop_showing_is_failing_lately_until_proven_again() {
        let callers = Callers::default();
        callers.adopt(&proven(&["10.0.0.1"]));
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
        let mut both = proven(&["10.0.0.1", "10.0.0.2"]);
        callers.adopt(&both);
        assert!(!callers.unrecorded(Some("10.0.0.1")));
        assert!(!callers.unrecorded(Some("10.0.0.2")));
        // A change merely shown does not end the run (anyone's forged UPDATE can show); a proof
        // renewed does.
        callers.judge(Some("10.0.0.1"), Sighting::Shown);
        assert!(callers.failing_lately(Some("10.0.0.1")));
        callers.adopt(&both);
        assert!(callers.failing_lately(Some("10.0.0.1")), "the same proof");
        *both.get_mut("10.0.0.1").unwrap() += 1;
        callers.adopt(&both);
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
    fn an_expired_proof_unrecords_nobody_and_trusts_nobody() {
        let callers = Callers::default();
        let long_ago = super::super::probe::now() - PROOF_TTL.as_secs() as i64 - 1;
        callers.adopt(&ProvenCallers::from([("10.0.0.1".to_owned(), long_ago)]));
        assert_eq!(callers.trust(Some("10.0.0.1")), Trust::Unknown);
        assert!(!callers.unrecorded(Some("10.9.9.9")));
        // A fresh proof of another address: only it is recorded.
        callers.adopt(&ProvenCallers::from([
            ("10.0.0.1".to_owned(), long_ago),
            ("10.0.0.3".to_owned(), super::super::probe::now()),
        ]));
        assert!(callers.unrecorded(Some("10.0.0.1")));
        assert!(!callers.unrecorded(Some("10.0.0.3")));
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
        // A proven caller is trusted, however many never show.
        for _ in 0..10 {
            callers.judge(Some("10.0.0.1"), Sighting::NeverShown);
        }
        callers.adopt(&proven(&["10.0.0.1"]));
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
        // A flood of callers forgets the others first, never a proven one's counts.
        for i in 0..MAX_CALLERS {
            callers.judge(Some(&format!("f{i}")), Sighting::NeverShown);
        }
        for i in 0..MAX_CALLERS * 2 {
            callers.judge(Some(&format!("s{i}")), Sighting::Shown);
        }
        assert!(callers.known().by_address.len() <= MAX_CALLERS);
        assert!(!callers.distrusted(Some("10.0.0.1")));
        assert!(callers.known().by_address.contains_key("10.0.0.1"));
    }
}
