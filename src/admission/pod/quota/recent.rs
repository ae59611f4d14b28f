//! The pods quota evaluation admitted a moment ago, kept on the quota beside `child-request`
//! (annotation [`RECENT`]): what lets the leader's recount tell a pod on its way to the cluster
//! from one that will never arrive.
//!
//! `child-request` is a running sum: evaluation adds each admitted pod before the pod is stored,
//! and a pod the API server then refuses, or a review forged by a caller that is not the API
//! server, would stay counted. The recount sets `child-request` to what the pods that exist charge
//! plus the recent admissions whose pod is not in the cache yet and that are younger than the
//! window (`--child-request-recount-quiet`): an admission that never becomes a pod stops counting
//! when its window ends, however many admissions follow it. Before, the recount left a quota alone
//! while evaluation kept writing it, so one forged review every minute held its charge for good.

use crate::memory::metered::read_within;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

use crate::apis::ElasticQuota;
use crate::apis::meta::annotation;
use crate::resources::Resources;

/// The annotation: a JSON list of [`Admitted`], oldest first.
pub use crate::apis::keys::QUOTA_RECENT_ADMISSIONS as RECENT;
/// Admissions kept at most per quota (about 80 bytes each, well within the 256 KiB annotations
/// may take). Beyond it the oldest go first: a burst of more than this many pods into one quota
/// within the window may be recounted without its oldest pods until they are stored.
pub const MAX_RECENT: usize = 1024;
/// Bytes of JSON the record takes at most, whatever its entries hold: with the quota's other
/// annotations it stays well within the API server's 256 KiB, so a quota stays writable.
pub const MAX_RECENT_BYTES: usize = 128 * 1024;
/// The longest `namespace/name` a stored pod can have (63 and 253 characters).
pub const MAX_POD_KEY: usize = 63 + 1 + 253;
/// How far in the future an entry may be dated (clock skew between replicas); a later one was not
/// written by a replica and is not counted.
pub const MAX_SKEW_SECONDS: i64 = 60;

/// One admitted pod: who, when (Unix seconds), and what it was charged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Admitted {
    /// `namespace/name`.
    pub pod: String,
    pub at: i64,
    pub requests: BTreeMap<String, Quantity>,
}

/// The record on `quota` (none, or one that does not parse: empty).
pub fn read(quota: &ElasticQuota) -> Vec<Admitted> {
    annotation(quota, RECENT)
        .and_then(|text| read_within(text.as_bytes()).ok())
        .unwrap_or_default()
}

pub fn to_json(recent: &[Admitted]) -> String {
    serde_json::to_string(recent).unwrap_or_else(|_| "[]".to_owned())
}

/// Adds admitted pods to the record, dropping those older than `window`, and the oldest beyond
/// [`MAX_RECENT`] entries or [`MAX_RECENT_BYTES`]. A pod whose key no stored pod can have (a
/// forged review) is not recorded: the next recount forgets its charge.
pub fn record(
    recent: &mut Vec<Admitted>,
    admitted: impl IntoIterator<Item = Admitted>,
    now: i64,
    window: i64,
) {
    recent.retain(|a| now - a.at < window && counts(a, now));
    recent.extend(admitted.into_iter().filter(|a| a.pod.len() <= MAX_POD_KEY));
    let over = recent.len().saturating_sub(MAX_RECENT);
    recent.drain(..over);
    let mut bytes: usize = recent.iter().map(json_len).sum();
    let mut drop = 0;
    while bytes > MAX_RECENT_BYTES {
        bytes -= json_len(&recent[drop]);
        drop += 1;
    }
    recent.drain(..drop);
}

/// Bytes an entry takes in the record's JSON, at most (every character escaped to six).
fn json_len(a: &Admitted) -> usize {
    let requests: usize = a
        .requests
        .iter()
        .map(|(k, v)| 6 * (k.len() + v.0.len()) + 6)
        .sum();
    6 * a.pod.len() + requests + 48
}

/// Whether an entry can be a replica's: a stored pod's key, dated no later than the clocks allow,
/// charging nothing negative. Anyone who may update the quota can write the record; the rest is
/// not counted.
fn counts(a: &Admitted, now: i64) -> bool {
    a.pod.len() <= MAX_POD_KEY
        && a.at <= now + MAX_SKEW_SECONDS
        && Resources::parse(Some(&a.requests)).is_ok_and(|r| r.negative_keys().is_empty())
}

/// The admissions still on their way: younger than `window` and whose pod `stored` does not show
/// yet; and the sum of what they were charged.
pub fn in_flight(
    recent: &[Admitted],
    now: i64,
    window: i64,
    stored: impl Fn(&str) -> bool,
) -> (Vec<Admitted>, Resources) {
    let kept: Vec<Admitted> = recent
        .iter()
        .filter(|a| now - a.at < window && counts(a, now) && !stored(&a.pod))
        .cloned()
        .collect();
    let mut sum = Resources::default();
    for a in &kept {
        if let Ok(requests) = Resources::parse(Some(&a.requests)) {
            sum.add(&requests);
        }
    }
    (kept, sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(pod: &str, at: i64, cpu: &str) -> Admitted {
        Admitted {
            pod: pod.to_owned(),
            at,
            requests: [("cpu".to_owned(), Quantity(cpu.to_owned()))].into(),
        }
    }

    #[test]
    fn old_and_stored_admissions_stop_counting() {
        let recent = vec![
            admitted("ns/old", 100, "4"),
            admitted("ns/stored", 150, "2"),
            admitted("ns/coming", 170, "1"),
        ];
        let (kept, sum) = in_flight(&recent, 180, 60, |pod| pod == "ns/stored");
        assert_eq!(kept, vec![admitted("ns/coming", 170, "1")]);
        assert_eq!(sum.describe(), "cpu=1");
    }

    #[test]
    fn entries_no_replica_writes_do_not_count() {
        let recent = vec![
            admitted("ns/future", 10_000, "4"),
            admitted("ns/negative", 170, "-8"),
            admitted(&format!("ns/{}", "x".repeat(400)), 170, "2"),
            admitted("ns/skewed", 200, "1"),
        ];
        let (kept, sum) = in_flight(&recent, 180, 60, |_| false);
        assert_eq!(kept, vec![admitted("ns/skewed", 200, "1")]);
        assert_eq!(sum.describe(), "cpu=1");
    }

    #[test]
    fn the_record_stays_within_its_bytes_whatever_it_is_given() {
        let mut recent = Vec::new();
        // A forged review's name longer than any pod's is not recorded.
        record(
            &mut recent,
            [admitted(&format!("ns/{}", "x".repeat(250_000)), 100, "1")],
            100,
            60,
        );
        assert!(recent.is_empty());
        // Names of the longest valid size, and many resources each.
        let long = |i: usize| {
            let mut a = admitted(&format!("{}/{i:0>253}", "n".repeat(63)), 100, "1");
            for r in 0..20 {
                a.requests
                    .insert(format!("example.com/resource-{r}"), Quantity("1".into()));
            }
            a
        };
        record(&mut recent, (0..MAX_RECENT).map(long), 100, 60);
        assert!(!recent.is_empty());
        assert!(to_json(&recent).len() <= MAX_RECENT_BYTES);
        assert_eq!(
            recent.last().map(|a| &a.pod),
            Some(&long(MAX_RECENT - 1).pod),
            "the newest are kept"
        );
    }

    #[test]
    fn the_record_forgets_what_is_past_the_window_and_keeps_its_size() {
        let mut recent = vec![admitted("ns/a", 0, "1")];
        record(&mut recent, [admitted("ns/b", 100, "1")], 100, 60);
        assert_eq!(recent, vec![admitted("ns/b", 100, "1")]);
        record(
            &mut recent,
            (0..MAX_RECENT).map(|i| admitted(&format!("ns/p{i}"), 101, "1")),
            101,
            60,
        );
        assert_eq!(recent.len(), MAX_RECENT);
        assert_eq!(recent[0].pod, "ns/p0", "the oldest went first");
        let json = to_json(&recent[..1]);
        assert_eq!(json, r#"[{"pod":"ns/p0","at":101,"requests":{"cpu":"1"}}]"#);
    }
}
