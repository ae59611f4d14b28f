//! The admission ports (`admission/ports/`) implemented against the API server: where quota
//! evaluation reads and writes an ElasticQuota's `child-request` (`quota.rs`), and the ConfigMap through which replicas admit
//! ElasticQuota changes one at a time (`quota_ledger.rs`), and the webhook configurations a replica
//! widens before a change needs a narrowed pod entry (`pod_reach.rs`); and the dry runs through
//! which replicas learn the API server's address (`api_server_probe.rs`). The plugins see only the traits
//! (`admission::pod::quota::store`, `admission::elastic_quota::ledger`); `review` and
//! `serve --state` run without these, and tests use the in-memory ones beside the traits.

pub mod api_server_probe;
mod errors;
pub mod own_user;
pub mod pod_reach;
pub mod quota;
pub mod quota_ledger;
pub mod would_deny_events;
