//! How a replica learns the API server's address without client authentication: each replica
//! asks the API server for a dry-run create of one ElasticQuota ([`PROBE_NAME`] in its own
//! namespace) that carries a token in an annotation ([`PROBE_ANNOTATION`]); the API server sends
//! that request to the validating webhook like any other, and the replica answering it, this one
//! or another, checks the token and proves the review's caller (`Ledger::prove`).
//!
//! A token is a MAC over its time and a random nonce, keyed by a secret derived from the serving
//! key that every replica loads ([`ProbeSecret`]): a review carrying a valid one was built from a
//! request one of the replicas made, and nobody but the API server (and the webhooks it calls)
//! sees that request. A token is taken once and only for [`VALID_FOR`], so one copied out of an
//! audit log later proves nothing. Unlike a CREATE that shows with the uid its review carried
//! (the proof this replaced), no caller can race anything to make one: a tenant allowed to create
//! quotas cannot prove its own address.

use std::collections::HashMap;
use std::time::Duration;

use ring::hmac;

use crate::admission::ports::ProbeSecret;

/// The ElasticQuota every probe names, in the operator's namespace; never stored (dry run).
pub const PROBE_NAME: &str = "koord-webhook-probe";
/// Where the token rides.
pub const PROBE_ANNOTATION: &str = "koord-webhook.koordinator.sh/api-server-probe";
/// How long after it was made a token proves its caller.
pub const VALID_FOR: Duration = Duration::from_secs(60);
/// A token is far shorter; a longer value is not looked at.
const MAX_TOKEN: usize = 128;
/// Tokens remembered as taken; past it, the oldest are forgotten (they expire anyway, and only
/// the replicas can make them: a few a minute).
const MAX_TAKEN: usize = 1024;
const VERSION: &str = "v1";

/// Why a review's token proves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("the token is not of the form v1.<seconds>.<nonce>.<mac>")]
    Malformed,
    #[error("the token's MAC does not match this replica's serving key")]
    Mac,
    #[error("the token is older than {VALID_FOR:?} or from the future")]
    Expired,
    #[error("the token was taken already")]
    Taken,
    #[error("no serving key is loaded")]
    NoSecret,
}

/// A token for a probe made at `now` (Unix seconds) with `nonce`.
pub fn token(secret: &ProbeSecret, now: i64, nonce: [u8; 16]) -> String {
    let signed = format!("{VERSION}.{now}.{}", hex(&nonce));
    let mac = hmac::sign(&key(secret), signed.as_bytes());
    format!("{signed}.{}", hex(mac.as_ref()))
}

/// A token for a probe made now, with a fresh nonce.
pub fn fresh_token(secret: &ProbeSecret) -> String {
    use ring::rand::SecureRandom;
    let mut nonce = [0u8; 16];
    // The system's randomness does not fail on the systems this runs on; a zero nonce would
    // only make this one token a repeat, refused as taken.
    let _ = ring::rand::SystemRandom::new().fill(&mut nonce);
    token(secret, jiff::Timestamp::now().as_second(), nonce)
}

fn key(secret: &ProbeSecret) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, &secret.0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The tokens taken, each with when it expires.
#[derive(Default)]
pub struct TakenTokens {
    taken: std::sync::Mutex<HashMap<String, i64>>,
}

impl TakenTokens {
    /// Checks `token` against `secret` at `now` and takes it: `Ok` once per valid token.
    pub fn take(&self, secret: &ProbeSecret, token: &str, now: i64) -> Result<(), ProbeError> {
        if token.len() > MAX_TOKEN {
            return Err(ProbeError::Malformed);
        }
        let (signed, mac) = token.rsplit_once('.').ok_or(ProbeError::Malformed)?;
        let mut parts = signed.split('.');
        let (Some(VERSION), Some(at), Some(nonce), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ProbeError::Malformed);
        };
        let at: i64 = at.parse().map_err(|_| ProbeError::Malformed)?;
        if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ProbeError::Malformed);
        }
        let mac = unhex(mac).ok_or(ProbeError::Malformed)?;
        hmac::verify(&key(secret), signed.as_bytes(), &mac).map_err(|_| ProbeError::Mac)?;
        let valid_for = VALID_FOR.as_secs() as i64;
        // A little skew between replicas' clocks is allowed the other way.
        if at > now + 5 || now.saturating_sub(at) > valid_for {
            return Err(ProbeError::Expired);
        }
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        taken.retain(|_, expires| *expires >= now);
        if taken.contains_key(nonce) {
            return Err(ProbeError::Taken);
        }
        if taken.len() >= MAX_TAKEN
            && let Some(oldest) = taken
                .iter()
                .min_by_key(|(_, expires)| **expires)
                .map(|(n, _)| n.clone())
        {
            taken.remove(&oldest);
        }
        taken.insert(nonce.to_owned(), at + valid_for);
        Ok(())
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(b: u8) -> ProbeSecret {
        ProbeSecret([b; 32])
    }

    #[test]
    fn a_token_proves_once_within_its_time_under_the_key_that_made_it() {
        let taken = TakenTokens::default();
        let t = token(&secret(1), 1000, [7; 16]);
        assert_eq!(taken.take(&secret(2), &t, 1000), Err(ProbeError::Mac));
        assert_eq!(
            taken.take(&secret(1), &t, 1000 + 61),
            Err(ProbeError::Expired)
        );
        assert_eq!(
            taken.take(&secret(1), &t, 1000 - 6),
            Err(ProbeError::Expired)
        );
        assert_eq!(taken.take(&secret(1), &t, 1030), Ok(()));
        assert_eq!(taken.take(&secret(1), &t, 1031), Err(ProbeError::Taken));
        // Another nonce, the same second: a token of its own.
        let u = token(&secret(1), 1000, [8; 16]);
        assert_eq!(taken.take(&secret(1), &u, 1031), Ok(()));
    }

    #[test]
    fn a_token_changed_anywhere_proves_nothing() {
        let t = token(&secret(1), 1000, [7; 16]);
        for i in 0..t.len() {
            for replacement in ['0', 'f', '.', '9', 'x'] {
                let mut changed: Vec<char> = t.chars().collect();
                if changed[i] == replacement {
                    continue;
                }
                changed[i] = replacement;
                let changed: String = changed.into_iter().collect();
                let taken = TakenTokens::default();
                assert!(
                    taken.take(&secret(1), &changed, 1000).is_err(),
                    "{changed} proved"
                );
            }
        }
        let taken = TakenTokens::default();
        for bad in [
            "",
            "v1",
            "v1...",
            "v2.1000.00.00",
            &"a".repeat(10_000),
            "v1.-1.x.y",
        ] {
            assert!(taken.take(&secret(1), bad, 1000).is_err(), "{bad}");
        }
    }

    #[test]
    fn taken_tokens_are_bounded() {
        let taken = TakenTokens::default();
        for i in 0..(MAX_TAKEN as u32 + 50) {
            let mut nonce = [0u8; 16];
            nonce[..4].copy_from_slice(&i.to_le_bytes());
            let t = token(&secret(1), 1000, nonce);
            assert_eq!(taken.take(&secret(1), &t, 1000), Ok(()));
        }
        assert!(taken.taken.lock().unwrap().len() <= MAX_TAKEN);
    }
}
