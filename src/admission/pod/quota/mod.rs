//! A pod and its ElasticQuota: which quota a pod belongs to, the topology check of /validate-pod
//! (`topology_check.rs`), and quota evaluation (`evaluation.rs` the plugin, `evaluator.rs` the
//! coalescing per-quota queue and the `child-request` record; it reads and writes quotas through
//! `admission::ports::QuotaStore`).

pub mod evaluation;
pub mod evaluator;
pub mod recent;
mod replace_resources;
mod resolve;
pub mod topology_check;
