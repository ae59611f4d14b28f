//! Command line: one binary, one subcommand per job. Every flag of `serve` can also come from an
//! environment variable, `KOORD_WEBHOOK_<FLAG>` (`--identity` from `POD_NAME`), as a Deployment
//! sets them; the other subcommands, run by hand or by scripts, take flags only.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::admission::settings::{
    DEFAULT_ENHANCED_VALIDATOR_CONFIG, DEFAULT_MAX_AMPLIFICATION_RATIO, DEFAULT_SLO_CONFIG_NAME,
    Settings,
};
use crate::cluster_client::ClusterFlags;
use crate::duration::parse_duration_arg;
use crate::install::entry_policy::EntryPolicy;
use crate::operator::CertMode;
use crate::server::Limits;
use crate::server::limits;
use crate::telemetry::LogFormat;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "koord-webhook",
    version,
    about = "Koordinator admission webhooks, self-managed"
)]
pub struct Cli {
    /// Log lines as text, or one JSON object per line (for log collectors).
    #[arg(
        long,
        global = true,
        env = "KOORD_WEBHOOK_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
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
    /// Write the data files of the Helm chart (`charts/koord-webhook/files`) into DIR.
    #[command(hide = true)]
    ChartFiles { dir: PathBuf },
    /// Summarise koord-webhook in the cluster: leader, certificates, caBundles, entries, Events.
    Status(StatusArgs),
    /// Remove koord-webhook from the cluster: replicas first, then the webhook configurations,
    /// then the rest. Keeps the CRDs and the namespace unless asked.
    Uninstall(UninstallArgs),
}

#[derive(Args, Debug)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// Also delete Koordinator's CRDs, and with them every ElasticQuota, ElasticQuotaProfile,
    /// Reservation and ClusterColocationProfile.
    #[arg(long)]
    pub delete_crds: bool,
    /// Also delete the koordinator-system namespace.
    #[arg(long)]
    pub delete_namespace: bool,
    /// Leave the two webhook configurations and the Service `koordinator-webhook-service` in
    /// place: the way back to koord-manager's webhook, which serves them again (README, "Migrating").
    #[arg(long, conflicts_with = "delete_namespace")]
    pub keep_webhook_configurations: bool,
    /// How long to wait for the replicas to stop.
    #[arg(long, default_value = "2m", value_parser = parse_duration_arg)]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// `text` for people, `json` for scripts.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: OutputFormat,
    /// Wait until koord-webhook is healthy (or `--timeout` passes), as scripts after an install do.
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits.
    #[arg(long, default_value = "2m", value_parser = parse_duration_arg)]
    pub timeout: Duration,
    /// A certificate that expires sooner than this counts as unhealthy (rotation should have
    /// replaced it at half its life).
    #[arg(long, default_value = "168h", value_parser = parse_duration_arg)]
    pub expiry_threshold: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum ReviewOperation {
    Create,
    Update,
    Delete,
    Connect,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
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
    #[command(flatten)]
    pub entries: EntryPolicy,
    /// The namespace koord-webhook is installed in (its replicas, Service, Secrets and Lease).
    #[arg(long, short, default_value = crate::names::DEFAULT_NAMESPACE, value_parser = crate::names::parse_namespace)]
    pub namespace: String,
    /// Print only the two webhook configurations.
    #[arg(long)]
    pub webhook_configurations_only: bool,
    /// PEM file whose content becomes every entry's caBundle (default: empty, the operator fills it).
    #[arg(long)]
    pub ca_bundle_file: Option<PathBuf>,
    /// Caller authentication: the replicas require client certificates signed by the CA bundle in
    /// this ConfigMap of koord-webhook's namespace (mounted, re-read on change).
    #[arg(long, conflicts_with = "client_ca_secret")]
    pub client_ca_configmap: Option<String>,
    /// The same from a Secret.
    #[arg(long)]
    pub client_ca_secret: Option<String>,
    /// The key of that ConfigMap or Secret holding the PEM bundle.
    #[arg(long, default_value = "ca.crt")]
    pub client_ca_key: String,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The namespace of koord-webhook's own objects (Service, Secrets, Lease, ledger): its Pod's,
    /// from the downward API.
    #[arg(long, env = "POD_NAMESPACE", default_value = crate::names::DEFAULT_NAMESPACE, value_parser = crate::names::parse_namespace)]
    pub namespace: String,
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
    /// How often --tls-cert-file/--tls-key-file and --client-ca-file are re-read; a changed pair or
    /// CA is in force without a restart.
    #[arg(long, env = "KOORD_WEBHOOK_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration_arg)]
    pub tls_reload_interval: Duration,
    /// Serve from a static cache loaded from these files (a YAML/JSON file or a directory) instead of
    /// watching a cluster.
    #[arg(long, env = "KOORD_WEBHOOK_STATE")]
    pub state: Option<PathBuf>,
    /// Feature gates, e.g. `EnableQuotaAdmission=true,NodeMutatingWebhook=false`.
    #[arg(long, env = "KOORD_WEBHOOK_FEATURE_GATES", default_value = "")]
    pub feature_gates: String,
    #[command(flatten)]
    pub rules: RuleFlags,
    #[command(flatten)]
    pub operator: OperatorFlags,
    #[command(flatten)]
    pub limits: LimitFlags,
    /// Where the plain-HTTP operations port listens (`/metrics`, `/healthz`, `/readyz`, and
    /// `/debug/...` when enabled); `0` turns it off.
    #[arg(
        long,
        env = "KOORD_WEBHOOK_METRICS_BIND_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_bind_address: String,
    /// Where the kubelet's probes (`/healthz`, `/readyz`) are answered on a listener of their own:
    /// one request per connection, a 2 s head timeout and a cap per caller address, so nothing can
    /// starve them; `0` turns it off (the operations port answers them too).
    #[arg(
        long,
        env = "KOORD_WEBHOOK_HEALTH_BIND_ADDRESS",
        default_value = "0.0.0.0:8081"
    )]
    pub health_bind_address: String,
    /// Require a client certificate signed by a CA of this PEM file on the admission port (the API
    /// server presents one when its AdmissionConfiguration gives it a kubeconfig for the webhook).
    /// Re-read every --tls-reload-interval.
    #[arg(long, env = "KOORD_WEBHOOK_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Serve `/debug/elastic-quota` (the quota tree as the webhook sees it) on the operations port.
    #[arg(long, env = "KOORD_WEBHOOK_ENABLE_DEBUG_ENDPOINTS")]
    pub enable_debug_endpoints: bool,
}

/// What one client can cost the server (src/server/limits.rs).
#[derive(Args, Debug)]
pub struct LimitFlags {
    /// Largest admission request body accepted, in bytes (larger gets HTTP 413).
    #[arg(long, env = "KOORD_WEBHOOK_MAX_REQUEST_BYTES", default_value_t = limits::DEFAULT_MAX_BODY_BYTES)]
    pub max_request_bytes: usize,
    /// Request bytes held in memory at once over all connections; beyond it HTTP 503 at once.
    #[arg(long, env = "KOORD_WEBHOOK_MAX_INFLIGHT_REQUEST_BYTES", default_value_t = limits::DEFAULT_MAX_INFLIGHT_BYTES)]
    pub max_inflight_request_bytes: usize,
    /// Time a client has to send a whole body (the API server's `?timeout=` shortens it); HTTP 408
    /// after it.
    #[arg(long, env = "KOORD_WEBHOOK_REQUEST_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration_arg)]
    pub request_read_timeout: Duration,
    /// Requests in flight on one connection (HTTP/2 streams); more get HTTP 503.
    #[arg(long, env = "KOORD_WEBHOOK_MAX_STREAMS_PER_CONNECTION", default_value_t = limits::DEFAULT_MAX_STREAMS_PER_CONNECTION)]
    pub max_streams_per_connection: usize,
    /// Open connections over all workers; more wait in the listen backlog.
    #[arg(long, env = "KOORD_WEBHOOK_MAX_CONNECTIONS", default_value_t = limits::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Open connections from one client address; a connection over it is answered 503 and closed.
    #[arg(long, env = "KOORD_WEBHOOK_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = limits::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)]
    pub max_connections_per_address: usize,
    /// Memory the reviews in flight may take once decoded, estimated from each body's shape before
    /// decoding; a review waits for room until its deadline (then 503). Default: 3/8 of
    /// --memory-limit, or 96 MiB.
    #[arg(long, env = "KOORD_WEBHOOK_DECODE_MEMORY_BUDGET")]
    pub decode_memory_budget: Option<usize>,
    /// The container's memory limit in bytes (the chart sets it from the Downward API); the decode
    /// budget is derived from it.
    #[arg(long, env = "KOORD_WEBHOOK_MEMORY_LIMIT")]
    pub memory_limit: Option<u64>,
    /// HTTP worker threads (default: the cores, at least 2, whatever the CPU limit).
    #[arg(long, env = "KOORD_WEBHOOK_WORKERS")]
    pub workers: Option<usize>,
}

impl LimitFlags {
    pub fn limits(&self) -> Limits {
        Limits {
            max_body_bytes: self.max_request_bytes,
            // The raw bytes held while reading: a quarter of the memory limit at most.
            max_inflight_bytes: self
                .memory_limit
                .map_or(self.max_inflight_request_bytes, |l| {
                    self.max_inflight_request_bytes
                        .min(usize::try_from(l / 4).unwrap_or(usize::MAX))
                }),
            read_timeout: self.request_read_timeout,
            max_streams_per_connection: self.max_streams_per_connection,
            max_connections: self.max_connections,
            max_connections_per_address: self.max_connections_per_address.max(1),
            decode_budget: self
                .decode_memory_budget
                .unwrap_or_else(|| limits::decode_budget_for(self.memory_limit)),
            workers: self.workers.unwrap_or_else(limits::default_workers),
        }
    }
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
    #[arg(long, required_unless_present = "object", conflicts_with_all = ["object", "old_object"])]
    pub request: Option<String>,
    /// The object alone (YAML or JSON file, `-` for standard input): `review` builds the
    /// AdmissionReview around it, as the API server would.
    #[arg(long)]
    pub object: Option<String>,
    /// The object before the change (UPDATE, DELETE).
    #[arg(long)]
    pub old_object: Option<String>,
    /// The operation of the built review (`CREATE` as AdmissionReviews write it, or `create`).
    #[arg(long, value_enum, ignore_case = true, default_value = "CREATE")]
    pub operation: ReviewOperation,
    /// Who asks, in the built review.
    #[arg(long, default_value = "koord-webhook-review")]
    pub user: String,
    /// A group of the user (repeatable).
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Exit 1 when the request is denied (default: 0 whenever an answer was produced).
    #[arg(long)]
    pub exit_code: bool,
    #[command(flatten)]
    pub rules: RuleFlags,
}

/// Flags of the operator (cluster mode: `serve` without `--state`).
#[derive(Args, Debug)]
pub struct OperatorFlags {
    /// Host (name or IP) the API server calls the webhook at: URL mode for the webhook
    /// configurations and a SAN of the serving certificate. Without it, the in-cluster Service.
    #[arg(long, env = "KOORD_WEBHOOK_WEBHOOK_HOST")]
    pub webhook_host: Option<String>,
    #[command(flatten)]
    pub entries: EntryPolicy,
    /// Elect one writer among the replicas through a Lease; false makes this process the leader.
    #[arg(long, env = "KOORD_WEBHOOK_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of this replica in the Lease and in Events (default: the host name and process id).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Lifetime of the CA, e.g. `8760h`.
    #[arg(long, env = "KOORD_WEBHOOK_CA_VALIDITY", default_value = "8760h", value_parser = parse_duration_arg)]
    pub ca_validity: Duration,
    /// Lifetime of a serving certificate, e.g. `720h`.
    #[arg(long, env = "KOORD_WEBHOOK_CERT_VALIDITY", default_value = "720h", value_parser = parse_duration_arg)]
    pub cert_validity: Duration,
    /// Renew a certificate when less than this fraction of its lifetime remains.
    #[arg(long, env = "KOORD_WEBHOOK_RENEW_FRACTION", default_value_t = 1.0 / 3.0, value_parser = parse_fraction)]
    pub renew_fraction: f64,
    /// How long the old CA stays trusted after serving moved to the new one.
    #[arg(long, env = "KOORD_WEBHOOK_CA_ROTATION_GRACE", default_value = "2m", value_parser = parse_duration_arg)]
    pub ca_rotation_grace: Duration,
    /// How long the bundle with both CAs stays published before serving moves to the new CA
    /// (API servers take a moment to load a changed webhook configuration).
    #[arg(long, env = "KOORD_WEBHOOK_CA_PUBLISH_SETTLE", default_value = "10s", value_parser = parse_duration_arg)]
    pub ca_publish_settle: Duration,
    /// On first start (no CA of its own yet), take over the CA koord-manager's webhook keeps in
    /// this Secret of the namespace (`ca-cert.pem`, `ca-key.pem`), so that both webhooks are trusted
    /// by either caBundle while a migration runs; empty: never.
    #[arg(
        long,
        env = "KOORD_WEBHOOK_ADOPT_CA_SECRET",
        default_value = "koordinator-webhook-certs"
    )]
    pub adopt_ca_secret: String,
    /// `self`: issue and rotate certificates; `external`: read `webhook-tls` as provided.
    #[arg(
        long,
        env = "KOORD_WEBHOOK_CERT_MODE",
        value_enum,
        default_value = "self"
    )]
    pub cert_mode: CertMode,
    /// Leader election (client-go semantics): followers take the Lease once its record has not
    /// changed for --lease-duration; the leader gives up when it could not renew for
    /// --lease-renew-deadline (shorter); every replica tries every --lease-retry-period.
    #[arg(long, env = "KOORD_WEBHOOK_LEASE_DURATION", default_value = "15s", value_parser = parse_duration_arg)]
    pub lease_duration: Duration,
    #[arg(long, env = "KOORD_WEBHOOK_LEASE_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration_arg)]
    pub lease_renew_deadline: Duration,
    #[arg(long, env = "KOORD_WEBHOOK_LEASE_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration_arg)]
    pub lease_retry_period: Duration,
    /// How long a pod quota evaluation admitted may take to be stored: its charge stays in the
    /// quota's child-request that long even before the pod is in the cache; the leader's recount
    /// drops it after (and recounts every half of it).
    #[arg(long, env = "KOORD_WEBHOOK_CHILD_REQUEST_RECOUNT_QUIET", default_value = "60s", value_parser = parse_duration_arg)]
    pub child_request_recount_quiet: Duration,
    /// The leader narrows a pod entry to what its cache needs only once no change needing the
    /// entry (a profile, a parent quota) has been admitted for this long, nor its cache synced
    /// (longer than an admitted change takes to be stored and watched).
    #[arg(long, env = "KOORD_WEBHOOK_NARROW_HOLD", default_value = "120s", value_parser = parse_duration_arg)]
    pub narrow_hold: Duration,
    /// On SIGTERM, keep serving this long before closing the listener: the API server routes by
    /// EndpointSlices, which on a busy control plane follow a Pod's deletion by several seconds.
    #[arg(long, env = "KOORD_WEBHOOK_DRAIN_DELAY", default_value = "10s", value_parser = parse_duration_arg)]
    pub drain_delay: Duration,
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!("{text:?} is not a number between 0 and 1")),
    }
}

/// Flags of the admission rules, shared by `serve` and `review`.
#[derive(Args, Debug)]
pub struct RuleFlags {
    /// Namespace of the slo-controller ConfigMap (default: koord-webhook's own, as Koordinator's).
    #[arg(long, env = "KOORD_WEBHOOK_CONFIG_NAMESPACE")]
    pub config_namespace: Option<String>,
    /// Name of the slo-controller ConfigMap.
    #[arg(long, env = "KOORD_WEBHOOK_SLO_CONFIG_NAME", default_value = DEFAULT_SLO_CONFIG_NAME)]
    pub slo_config_name: String,
    /// Require a unique `name` on every node strategy of the slo-controller ConfigMap.
    #[arg(long, env = "KOORD_WEBHOOK_NODE_STRATEGY_NAME_NEED_CHECK", default_value_t = false, action = clap::ArgAction::Set)]
    pub node_strategy_name_need_check: bool,
    /// Largest resource amplification ratio a node may carry (at least 1).
    #[arg(long, env = "KOORD_WEBHOOK_MAX_AMPLIFICATION_RATIO", default_value_t = DEFAULT_MAX_AMPLIFICATION_RATIO, value_parser = parse_max_ratio)]
    pub max_amplification_ratio: f64,
    /// Namespace of the ConfigMap of required-label rules (EnablePodEnhancedValidator; default:
    /// koord-webhook's own).
    #[arg(long, env = "KOORD_WEBHOOK_POD_ENHANCED_VALIDATOR_CONFIG_NAMESPACE")]
    pub pod_enhanced_validator_config_namespace: Option<String>,
    /// Name of that ConfigMap.
    #[arg(long, env = "KOORD_WEBHOOK_POD_ENHANCED_VALIDATOR_CONFIG_NAME", default_value = DEFAULT_ENHANCED_VALIDATOR_CONFIG)]
    pub pod_enhanced_validator_config_name: String,
}

impl RuleFlags {
    pub fn settings(&self) -> Settings {
        Settings {
            config_namespace: self
                .config_namespace
                .clone()
                .unwrap_or_else(|| crate::names::namespace().to_owned()),
            slo_config_name: self.slo_config_name.clone(),
            node_strategy_name_need_check: self.node_strategy_name_need_check,
            max_amplification_ratio: self.max_amplification_ratio,
            enhanced_validator_config: (
                self.pod_enhanced_validator_config_namespace
                    .clone()
                    .unwrap_or_else(|| crate::names::namespace().to_owned()),
                self.pod_enhanced_validator_config_name.clone(),
            ),
            ..Settings::default()
        }
    }
}

fn parse_max_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!("{text:?} is not a number of at least 1")),
    }
}
