//! Which callers' changes show up. Without client authentication the ledger cannot tell a forged
//! review from a real one when it is sent; it can afterwards: a real change reaches the cache within
//! milliseconds, a forged one never does. Each replica counts, per caller (the peer address each
//! entry records), the changes it has seen recorded that showed after being pending, and those that
//! never did (`Inner::sight`); a caller with [`STRIKES`] that never showed and none that did is
//! distrusted: not waited for, and its own changes not recorded, so a forger racing real changes
//! with fresh entries stops costing them anything after a few. The API server's address keeps its
//! trust with every change of its that shows.

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
    shown: u32,
    never_shown: u32,
}

impl Callers {
    /// A change of `caller`'s was waited for: it showed or it never did.
    pub fn judge(&self, caller: Option<&str>, shown: bool) {
        let Some(caller) = caller else { return };
        let mut by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        if by.len() >= MAX_CALLERS && !by.contains_key(caller) {
            by.retain(|_, c| c.shown > 0);
        }
        let counts = by.entry(caller.to_owned()).or_default();
        if shown {
            counts.shown = counts.shown.saturating_add(1);
        } else {
            counts.never_shown = counts.never_shown.saturating_add(1);
        }
    }

    /// Whether changes of `caller` are no longer waited for.
    pub fn distrusted(&self, caller: Option<&str>) -> bool {
        self.trust(caller) == Trust::Distrusted
    }

    /// What is known of `caller`: a change of its showed (the API server's), [`STRIKES`] never
    /// did and none did, or neither yet (and a change recorded without a caller).
    pub fn trust(&self, caller: Option<&str>) -> Trust {
        let Some(caller) = caller else {
            return Trust::Unknown;
        };
        let by = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        match by.get(caller) {
            Some(c) if c.shown > 0 => Trust::Trusted,
            Some(c) if c.never_shown >= STRIKES => Trust::Distrusted,
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
            callers.judge(Some("10.0.0.66"), false);
        }
        assert!(!callers.distrusted(Some("10.0.0.66")));
        callers.judge(Some("10.0.0.66"), false);
        assert!(callers.distrusted(Some("10.0.0.66")));
        // One shown change keeps a caller trusted, however many never show.
        for _ in 0..10 {
            callers.judge(Some("10.0.0.1"), false);
        }
        callers.judge(Some("10.0.0.1"), true);
        assert!(!callers.distrusted(Some("10.0.0.1")));
        assert!(
            !callers.distrusted(None),
            "entries without a caller are always waited for"
        );
        // A flood of callers forgets the distrusted ones first, never a trusted one.
        for i in 0..MAX_CALLERS {
            callers.judge(Some(&format!("f{i}")), false);
        }
        assert!(!callers.distrusted(Some("10.0.0.1")));
        assert!(callers.by_address.lock().unwrap().get("10.0.0.1").is_some());
    }
}
