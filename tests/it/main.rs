//! Every integration test, in one binary: the crate and its dependencies are linked once, and the
//! shared helpers in `support/` are compiled once (and checked for dead code like any module).
//!
//! The real-node test (`node::`) needs root and starts a one-node cluster; `scripts/test` runs it on
//! its own, after the rest, so that its timings are not shared with other control planes.

mod support;

mod audit;
mod beside_koordinator;
mod ca_adoption;
mod cache_watch;
mod conformance;
mod control_plane;
mod deadline;
mod fuzz_seeds;
pub(crate) mod generated;
mod image_architectures;
mod layers;
mod node;
mod node_upgrade;
mod operator;
mod operator_admission;
mod own_record;
mod qos_split;
mod release;
mod review_cli;
mod review_elastic_quota;
mod review_node_configmap;
mod review_pod;
mod rule_actions;
mod server;
mod server_limits;
mod shadow;
mod shape_search;
