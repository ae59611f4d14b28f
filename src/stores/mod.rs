//! The admission plugins' stores, against the API server: where quota evaluation reads and writes
//! an ElasticQuota's `child-request` (`quota.rs`), and the ConfigMap through which replicas admit
//! ElasticQuota changes one at a time (`quota_ledger.rs`). The plugins see only the traits
//! (`admission::pod::quota::store`, `admission::elastic_quota::ledger`); `review` and
//! `serve --state` run without these, and tests use the in-memory ones beside the traits.

pub mod quota;
pub mod quota_ledger;
