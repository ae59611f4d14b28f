//! The in-memory cluster view every admission plugin reads.
//!
//! One store per kind ([`store`]): many readers at once, writers hold a lock only for the map
//! update, never across an await; each object slimmed to what the rules read ([`slim`]) and
//! relisted in place. In `review` and `serve --state` the stores are filled from files ([`load`]);
//! in cluster mode the operator's watches feed the same writers.

mod handles;
pub mod lenient;
pub mod load;
pub mod pod_index;
pub mod quota_topology;
pub mod quotas;
pub mod slim;
pub mod store;
mod unmanaged;
pub mod watch;

pub use handles::{Cache, CacheWriter, CachedObject};
pub use pod_index::{IndexedPod, PodIndex};
pub use quota_topology::{QuotaInfo, QuotaTopology, SharedTopology};
