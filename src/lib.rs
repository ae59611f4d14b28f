//! koord-webhook: Koordinator's admission webhooks as a self-managing Kubernetes operator.

pub mod admission;
pub mod apis;
pub mod cache;
pub mod certs;
pub mod cli;
pub mod cluster_client;
pub mod cmd;
pub(crate) mod duration;
pub mod entries;
pub mod features;
pub mod install;
pub mod kube_events;
pub(crate) mod kube_ports;
pub mod kubernetes_errors;
pub mod memory;
pub mod metrics;
pub mod names;
pub(crate) mod operator;
pub mod resources;
#[cfg(test)]
pub(crate) mod scripted_api;
pub mod selectors;
mod serde_proxy;
pub mod server;
pub mod slo_config;
pub mod state;
pub mod telemetry;
pub mod tls;
