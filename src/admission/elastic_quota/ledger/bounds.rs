//! The ledger's times and sizes: how long a change stays pending, how long a request waits, and
//! what the record holds (`mod.rs` waits and writes by them, `record.rs` trims by them).

use std::time::Duration;

use crate::admission::outcome::Rejection;
use crate::admission::ports::PendingChange;

/// After this long (on the local clock) a change still not in the cache may leave a full record:
/// every replica stopped waiting for it at [`MAX_WAIT`], and a real one would have been stored
/// within the API server's webhook timeout (10 s).
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a change not yet in the cache is waited for, from when this replica first saw it: a
/// real one normally shows within milliseconds of its admission. After this the next change is
/// checked against the cache without it, as if it will not happen, so a change the API server
/// never stores (a forged review) delays the changes under its keys by this much at most and
/// refuses none. The price: a real change the API server stores later than this (behind a
/// webhook slower than 5 s) is not waited for, and the next change under its keys is checked
/// without it, as each Koordinator replica checks against its own cache.
pub const MAX_WAIT: Duration = Duration::from_secs(5);
/// How long a request past its own [`MAX_WAIT`] still waits for a change that beat it to a write
/// (from when this replica first saw that change): without it, forged changes that used up the wait
/// would let two real sibling changes that race each other both pass, each checked without the
/// other. A real winner normally shows within milliseconds.
pub const WINNER_WAIT: Duration = Duration::from_secs(1);
/// The longest a request tries: past it (changes under its keys kept being recorded ahead of it)
/// a retryable denial. Under the API server's 10 s webhook timeout.
pub const GIVE_UP: Duration = Duration::from_secs(8);
/// How often a waiting request looks at its cache again.
pub const POLL: Duration = Duration::from_millis(10);
/// The record's key replicas read before keyed ledgers: still written (the newest change), and
/// waited for when a replica of such a version wrote it (its change is under no other key).
pub const WHOLE_RECORD: &str = "last-change";
/// Entries the record keeps at most while older ones can go: beyond this, entries this replica's
/// cache has shown for [`SEEN_GRACE_SECONDS`] and entries past [`PENDING_TIMEOUT`] leave, oldest
/// first; entries older than twice [`PENDING_TIMEOUT`] go in any case: nobody waits for them any
/// more.
pub const MAX_ENTRIES: usize = 256;
/// Keys one write records at most, and one change may have: a batch leaves room in the record
/// for what others wait for.
pub const BATCH_KEYS: usize = MAX_ENTRIES / 2;
/// Entries the record holds at most (~200 KiB, within a ConfigMap's 1 MiB). Up to this, young
/// entries not yet seen stay (another replica may still have to wait for them); beyond it, a
/// write makes room instead of being refused: first from entries under keys the cache does not
/// store (a tree no quota is in, a namespace no quota binds: a forged review's, or a create not yet
/// delivered), then from the tree holding the most entries (`record::next_record`). So no caller
/// can make the record refuse a change whose keys it does not share, and entries under the
/// cluster's own keys (one per key) leave only when the cluster has more of those than this.
pub const HARD_MAX_ENTRIES: usize = MAX_ENTRIES * 4;
/// An entry this replica's cache shows may leave a full record once it is this old (seconds): the
/// other replicas' watches have had the time to deliver it too.
pub(super) const SEEN_GRACE_SECONDS: i64 = 2;

/// What the API server allows of what an entry records: a longer one is no change the API server
/// sends (it validates names before the validating webhooks), so the record's entries stay small.
const LIMITS: [(&str, usize); 4] = [
    ("name", 253),
    ("namespace", 63),
    ("request uid", MAX_ID_BYTES),
    ("resourceVersion", 64),
];
/// A request uid is a UUID (36 bytes); room for other forms.
const MAX_ID_BYTES: usize = 128;

pub(super) fn within_the_api_servers_limits(change: &PendingChange) -> Result<(), Rejection> {
    let fields = [
        change.name.len(),
        change.namespace.len(),
        change.id.len(),
        change.resource_version.as_deref().map_or(0, str::len),
    ];
    match LIMITS.iter().zip(fields).find(|((_, max), len)| len > max) {
        Some(((what, max), len)) => Err(Rejection::invalid(format!(
            "this ElasticQuota change's {what} is {len} bytes, more than the {max} the API server \
             allows: no such change is stored"
        ))),
        None => Ok(()),
    }
}
