//! koord-webhook: Koordinator's admission webhooks as a self-managing Kubernetes operator.

pub mod admission;
pub mod apis;
pub mod cache;
pub mod certs;
pub mod cli;
pub mod cmd;
pub(crate) mod duration;
pub mod features;
pub mod install;
pub mod kubernetes_errors;
pub mod metrics;
pub mod names;
pub(crate) mod operator;
mod process_metrics;
pub mod resources;
pub mod selectors;
pub mod server;
pub mod slo_config;
pub mod state;
pub(crate) mod stores;
pub mod telemetry;
pub mod tls;
