//! Command line: one binary, one subcommand per job. Every flag can also come from an environment
//! variable (`KOORD_WEBHOOK_<FLAG>`), as a Deployment sets them.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::server::DEFAULT_MAX_BODY_BYTES;

#[derive(Parser, Debug)]
#[command(
    name = "koord-webhook",
    version,
    about = "Koordinator admission webhooks, self-managed"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the admission server (HTTPS).
    Serve(ServeArgs),
    /// Answer one AdmissionReview offline, from a cache loaded from files.
    Review(ReviewArgs),
    /// Print the CustomResourceDefinitions as YAML.
    Crds,
    /// Print the install manifests (one file for `kubectl apply -f`).
    Manifests(ManifestArgs),
}

#[derive(Args, Debug)]
pub struct ManifestArgs {
    /// Address the API server calls the webhook at (URL mode); without it, the in-cluster Service.
    #[arg(long)]
    pub webhook_host: Option<String>,
    /// Webhook port in URL mode.
    #[arg(long, default_value_t = 9443)]
    pub port: u16,
    /// Container image of the Deployment.
    #[arg(long, default_value = crate::install::DEFAULT_IMAGE)]
    pub image: String,
    /// Feature gates: decide which webhook entries exist and are passed to the Deployment.
    #[arg(long, default_value = "")]
    pub feature_gates: String,
    /// Print only the two webhook configurations.
    #[arg(long)]
    pub webhook_configurations_only: bool,
    /// PEM file whose content becomes every entry's caBundle (default: empty, the operator fills it).
    #[arg(long)]
    pub ca_bundle_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// HTTPS port.
    #[arg(long, env = "KOORD_WEBHOOK_PORT", default_value_t = 9443)]
    pub port: u16,
    /// Address to listen on.
    #[arg(long, env = "KOORD_WEBHOOK_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// PEM certificate chain to serve; with --tls-key-file. Without both, a self-signed pair is made.
    #[arg(long, env = "KOORD_WEBHOOK_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "KOORD_WEBHOOK_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Serve from a static cache loaded from these files (a YAML/JSON file or a directory) instead of
    /// watching a cluster.
    #[arg(long, env = "KOORD_WEBHOOK_STATE")]
    pub state: Option<PathBuf>,
    /// Feature gates, e.g. `EnableQuotaAdmission=true,NodeMutatingWebhook=false`.
    #[arg(long, env = "KOORD_WEBHOOK_FEATURE_GATES", default_value = "")]
    pub feature_gates: String,
    /// Largest admission request body accepted, in bytes (larger gets HTTP 413).
    #[arg(long, env = "KOORD_WEBHOOK_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_request_bytes: usize,
}

#[derive(Args, Debug)]
pub struct ReviewArgs {
    /// Objects the cache should contain: a YAML/JSON file (multi-document) or a directory of them.
    #[arg(long)]
    pub state: PathBuf,
    /// The admission path, e.g. /validate-pod.
    #[arg(long)]
    pub path: String,
    /// Feature gates, as for `serve`.
    #[arg(long, default_value = "")]
    pub feature_gates: String,
    /// The AdmissionReview JSON: a file, or `-` for standard input.
    #[arg(long)]
    pub request: String,
}
