//! How replicas learn the API server's address without client authentication: each replica asks
//! the API server for a dry-run apply of one ElasticQuota ([`PROBE_NAME`] in its own namespace)
//! that carries a token in an annotation ([`PROBE_ANNOTATION`]); the API server sends that request
//! to the validating webhook like any other, and the replica answering it, this one or another,
//! checks the token and answers with a warning naming the address the review came from, MACed
//! ([`answer`]). The API server hands the warning back to the replica that asked, in its response;
//! that replica checks it ([`read_answer`]) and writes the address into the ledger's record
//! ([`publish`]), where every replica reads it.
//!
//! A token is a MAC over its time and a random nonce, keyed by a secret derived from the serving
//! key that every replica loads ([`ProbeSecret`]): a review carrying a valid one was built from a
//! request one of the replicas made. Only the replica that made the request publishes, and only
//! what the API server answered it: a token copied out of an audit log or another webhook and
//! replayed to a replica gets the replayer a warning naming itself, which no replica reads. Unlike
//! a CREATE that shows with the uid its review carried (the proof this replaced), no caller can race
//! anything to make one: a tenant allowed to create quotas cannot prove its own address.
//!
//! A proof is kept with when it was last made ([`ProvenCallers`]); every probe renews it, and one
//! not renewed for [`PROOF_TTL`] is dropped, so an address the API server no longer calls from
//! (a control-plane node replaced) is not trusted for long and does not fill the record.

use std::net::IpAddr;
use std::time::Duration;

use ring::hmac;

use crate::admission::ports::{LedgerStore, ProbeSecret, ProvenCallers, StoreError};

pub use crate::apis::keys::PROBE_ANNOTATION;
pub use crate::names::PROBE_NAME;
/// How long after it was made a token is answered (the API server's webhook timeout is 30 s at
/// most), and how far ahead of a replica's clock it may be.
pub const VALID_FOR: Duration = Duration::from_secs(30);
/// A proof not renewed for this long is dropped (each replica probes every 2 minutes).
pub const PROOF_TTL: Duration = Duration::from_secs(10 * 60);
/// Proven addresses the record keeps at most: past it, the least recently proven is dropped.
pub const MAX_PROVEN: usize = 16;
/// The answer's warning starts with this.
const ANSWER_PREFIX: &str = "koord-webhook api-server probe answered:";
/// A token is far shorter; a longer value is not looked at.
const MAX_TOKEN: usize = 128;
const VERSION: &str = "v1";

/// Why a review's token is not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("the token is not of the form v1.<seconds>.<nonce>.<mac>")]
    Malformed,
    #[error("the token's MAC does not match this replica's serving key")]
    Mac,
    #[error("the token is older than {VALID_FOR:?} or from the future")]
    Expired,
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
    // only make this one token a repeat of another.
    let _ = ring::rand::SystemRandom::new().fill(&mut nonce);
    token(secret, now(), nonce)
}

pub fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

fn key(secret: &ProbeSecret) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, &secret.0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a probe's token at `now`: its nonce (hex) if it is one of the replicas' and fresh.
pub fn check(secret: &ProbeSecret, token: &str, now: i64) -> Result<String, ProbeError> {
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
    if at.abs_diff(now) > valid_for as u64 {
        return Err(ProbeError::Expired);
    }
    Ok(nonce.to_owned())
}

/// The warning a replica answers a probe's review with: the nonce, the address the review came
/// from, and a MAC over both.
pub fn answer(secret: &ProbeSecret, nonce: &str, caller: IpAddr) -> String {
    let signed = format!("{nonce} {caller}");
    let mac = hmac::sign(&key(secret), format!("answer {signed}").as_bytes());
    format!("{ANSWER_PREFIX} {signed} {}", hex(mac.as_ref()))
}

/// The address a warning of the API server's response names, if it is a replica's answer to the
/// probe whose token was `token`. Every occurrence is tried, each up to the quote that ends a
/// warning's text (an intermediary may fold several `Warning` fields into one line).
pub fn read_answer(secret: &ProbeSecret, token: &str, warning: &str) -> Option<IpAddr> {
    let mine = token.split('.').nth(2)?;
    warning.match_indices(ANSWER_PREFIX).find_map(|(at, _)| {
        let rest = &warning[at + ANSWER_PREFIX.len()..];
        let rest = rest.split('"').next()?;
        let mut parts = rest.split_whitespace();
        let (Some(nonce), Some(caller), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        if nonce != mine {
            return None;
        }
        let signed = format!("answer {nonce} {caller}");
        hmac::verify(&key(secret), signed.as_bytes(), &unhex(mac)?).ok()?;
        caller.parse().ok()
    })
}

/// What the warnings of the API server's response to a probe say of who answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    By(IpAddr),
    /// No replica's answer: the webhook was not called, or another step dropped the warnings.
    Nobody,
    /// Answers naming different addresses: someone replayed the probe (another webhook the API
    /// server called with it) and returned the answer it got; none is taken.
    Several(Vec<IpAddr>),
}

/// Reads every answer to the probe whose token was `token` out of `warnings`.
pub fn answered(secret: &ProbeSecret, token: &str, warnings: &[String]) -> Answered {
    let mut by: Vec<IpAddr> = warnings
        .iter()
        .filter_map(|w| read_answer(secret, token, w))
        .collect();
    by.sort();
    by.dedup();
    match by.as_slice() {
        [] => Answered::Nobody,
        [one] => Answered::By(*one),
        _ => Answered::Several(by),
    }
}

/// `proven` with `caller` proven at `now`: those older than [`PROOF_TTL`] dropped, then the
/// least recently proven past [`MAX_PROVEN`].
pub fn with_proof(proven: &ProvenCallers, caller: &str, now: i64) -> ProvenCallers {
    let ttl = PROOF_TTL.as_secs() as i64;
    let mut next: ProvenCallers = proven
        .iter()
        .filter(|(_, at)| now.saturating_sub(**at) <= ttl)
        .map(|(a, at)| (a.clone(), *at))
        .collect();
    next.insert(caller.to_owned(), now);
    while next.len() > MAX_PROVEN {
        let oldest = next
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(a, _)| a.clone());
        match oldest {
            Some(a) => next.remove(&a),
            None => break,
        };
    }
    next
}

/// Writes `caller`, proven at `now`, into the record's proven callers, whatever its version (a
/// conditional write could be kept out for good by anyone keeping the record busy: a forger's
/// stream of recorded changes). Two replicas publishing at once may lose one proof; the next probe
/// writes it again. The ledger's own writes carry the proven callers as they read them, and name
/// the version, so they never drop one written since.
pub async fn publish(store: &dyn LedgerStore, caller: &str, now: i64) -> Result<(), StoreError> {
    let record = store.read().await?;
    store
        .write_proven(&with_proof(&record.proven, caller, now))
        .await
}

/// Lower-case hex only, as [`hex`] writes it: one spelling per value.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
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
    fn a_token_is_answered_within_its_time_under_the_key_that_made_it() {
        let t = token(&secret(1), 1000, [7; 16]);
        assert_eq!(check(&secret(2), &t, 1000), Err(ProbeError::Mac));
        assert_eq!(check(&secret(1), &t, 1000 + 31), Err(ProbeError::Expired));
        assert_eq!(check(&secret(1), &t, 1000 - 31), Err(ProbeError::Expired));
        assert_eq!(check(&secret(1), &t, 1030), Ok("07".repeat(16)));
    }

    #[test]
    fn a_token_changed_anywhere_is_not_answered() {
        let t = token(&secret(1), 1000, [7; 16]);
        for i in 0..t.len() {
            for replacement in ['0', 'f', '.', '9', 'x', 'F', '+'] {
                let mut changed: Vec<char> = t.chars().collect();
                if changed[i] == replacement {
                    continue;
                }
                changed[i] = replacement;
                let changed: String = changed.into_iter().collect();
                assert!(check(&secret(1), &changed, 1000).is_err(), "{changed}");
            }
        }
        for bad in [
            "",
            "v1",
            "v1...",
            "v2.1000.00.00",
            &"a".repeat(10_000),
            "v1.-1.x.y",
        ] {
            assert!(check(&secret(1), bad, 1000).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_an_answer_to_this_probe_under_this_key_names_an_address() {
        let t = token(&secret(1), 1000, [7; 16]);
        let nonce = check(&secret(1), &t, 1000).unwrap();
        let api_server: IpAddr = "10.0.0.1".parse().unwrap();
        let warning = answer(&secret(1), &nonce, api_server);
        // As the API server hands it back: in a Warning header's quoted text.
        let header = format!("299 - \"{warning}\"");
        assert_eq!(read_answer(&secret(1), &t, &header), Some(api_server));
        assert_eq!(read_answer(&secret(2), &t, &header), None, "another key");
        let other = token(&secret(1), 1000, [8; 16]);
        assert_eq!(
            read_answer(&secret(1), &other, &header),
            None,
            "another probe"
        );
        let forged = header.replace("10.0.0.1", "10.66.0.1");
        assert_eq!(
            read_answer(&secret(1), &t, &forged),
            None,
            "another address"
        );
        assert_eq!(read_answer(&secret(1), &t, "299 - \"a warning\""), None);
    }

    #[test]
    fn answers_are_read_from_folded_headers_and_two_addresses_are_none() {
        let t = token(&secret(1), 1000, [7; 16]);
        let nonce = check(&secret(1), &t, 1000).unwrap();
        let at = |a: &str| answer(&secret(1), &nonce, a.parse().unwrap());
        let folded = format!(
            "299 - \"other\", 299 - \"{}\", 299 - \"more\"",
            at("10.0.0.1")
        );
        assert_eq!(
            answered(&secret(1), &t, std::slice::from_ref(&folded)),
            Answered::By("10.0.0.1".parse().unwrap())
        );
        let decoy = format!("299 - \"{ANSWER_PREFIX} x; {}\"", at("10.0.0.1"));
        assert_eq!(
            read_answer(&secret(1), &t, &decoy),
            Some("10.0.0.1".parse().unwrap()),
            "a decoy prefix before the answer hides nothing"
        );
        let twice = vec![folded.clone(), format!("299 - \"{}\"", at("10.0.0.1"))];
        assert_eq!(
            answered(&secret(1), &t, &twice),
            Answered::By("10.0.0.1".parse().unwrap())
        );
        let replayed = vec![format!("299 - \"{}\"", at("10.66.0.9")), folded];
        assert!(matches!(
            answered(&secret(1), &t, &replayed),
            Answered::Several(_)
        ));
        assert_eq!(answered(&secret(1), &t, &[]), Answered::Nobody);
    }

    #[test]
    fn proofs_expire_and_the_record_keeps_the_most_recent() {
        let ttl = PROOF_TTL.as_secs() as i64;
        let mut proven = ProvenCallers::new();
        for i in 0..MAX_PROVEN + 4 {
            proven = with_proof(&proven, &format!("10.9.0.{i}"), 1000 + i as i64);
        }
        assert_eq!(proven.len(), MAX_PROVEN);
        assert!(!proven.contains_key("10.9.0.0"), "the least recent goes");
        assert!(proven.contains_key(&format!("10.9.0.{}", MAX_PROVEN + 3)));
        // Renewed, an address stays; not renewed past the TTL, the others go.
        let later = 1000 + ttl + 10;
        let renewed = with_proof(&proven, "10.0.0.1", later);
        assert_eq!(
            renewed.len(),
            1 + proven.values().filter(|at| later - **at <= ttl).count()
        );
        let much_later = later + ttl + 1;
        let after = with_proof(&renewed, "10.0.0.2", much_later);
        assert_eq!(after.keys().collect::<Vec<_>>(), ["10.0.0.2"]);
    }
}
