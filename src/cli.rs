//! Command line: one binary, one subcommand per job. Every flag of `serve` can also come from an
//! environment variable, mostly `KOORD_WEBHOOK_<FLAG>` (`--identity` and `--namespace` from
//! `POD_NAME` and `POD_NAMESPACE`, repeatable flags under a plural name: README's table), as a Deployment
//! sets them; the other subcommands, run by hand or by scripts, take flags only. Each part owns its
//! flags beside the settings they make (`RuleFlags` in admission/rule_flags.rs, `LimitFlags` in
//! server/limits.rs, `OperatorFlags` in operator/flags.rs, `EntryPolicy` in install/); this file
//! composes them into subcommands.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::admission::rule_flags::RuleFlags;
use crate::cluster_client::ClusterFlags;
use crate::duration::parse_duration_arg;
use crate::install::entry_policy::EntryPolicy;
use crate::operator::flags::OperatorFlags;
use crate::server::limits::LimitFlags;
use crate::server::shutdown::ShutdownFlags;
use crate::telemetry::LogFormat;

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
    /// Rewrite the tables generated into README.md and docs/ under the repository ROOT.
    #[command(hide = true)]
    DocTables { root: PathBuf },
    /// Summarise koord-webhook in the cluster: leader, certificates, caBundles, entries, Events.
    Status(StatusArgs),
    /// List what is stored and report what the validating rules would refuse today (read only).
    Audit(AuditArgs),
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
    /// Once healthy, also check admission end to end: a dry-run pod create in NAMESPACE (one the
    /// pod entries do not skip) must be refused by koord-webhook (`helm test` does this).
    #[arg(long, value_name = "NAMESPACE", value_parser = crate::names::parse_namespace)]
    pub check_admission: Option<String>,
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
    Yaml,
}

#[derive(Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// `text` for people, `json` or `yaml` for scripts.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: OutputFormat,
    /// Feature gates, as for `serve` (ignored with --same-as-deployed).
    #[arg(long, default_value = "")]
    pub feature_gates: String,
    /// Take the feature gates and rule flags from the installed koord-webhook Deployment.
    #[arg(long)]
    pub same_as_deployed: bool,
    /// Objects shown per rule.
    #[arg(long, default_value_t = 5)]
    pub examples: usize,
    /// Objects per list request.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub page_size: u32,
    #[command(flatten)]
    pub rules: RuleFlags,
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
    /// The namespace koord-webhook is installed in (its replicas, Service, Secrets and Lease);
    /// default koordinator-system, koord-webhook-shadow with `--mode shadow`.
    #[arg(long, short, value_parser = crate::names::parse_namespace)]
    pub namespace: Option<String>,
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
    /// Any other `serve` flag for the Deployment, `NAME=VALUE` (e.g. `lease-duration=30s`;
    /// `NAME=true` for a switch); repeatable. The chart's `serve:` value takes the same.
    #[arg(long = "serve-flag")]
    pub serve_flags: Vec<String>,
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
    #[command(flatten)]
    pub shutdown: ShutdownFlags,
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
    /// Also report what shadowed rules (`--rule-action`, `--entry-action`) would refuse as Warning
    /// Events `WouldDeny` on the replica's Pod: per rule and namespace one at once and at most one
    /// more a minute.
    #[arg(long, env = "KOORD_WEBHOOK_WOULD_DENY_EVENTS")]
    pub would_deny_events: bool,
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
