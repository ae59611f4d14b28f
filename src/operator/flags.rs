//! The operator's flags (cluster mode: `serve` without `--state`): where the API server calls, the
//! entries' policy, leader election, certificates and the quota recount, flattened into `serve`.

use std::time::Duration;

use clap::Args;

use super::config::CertMode;
use crate::duration::parse_duration_arg;
use crate::install::entry_policy::EntryPolicy;

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
    /// How long the leader keeps trying to renew before it gives the Lease up.
    #[arg(long, env = "KOORD_WEBHOOK_LEASE_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration_arg)]
    pub lease_renew_deadline: Duration,
    /// How often every replica tries to acquire or renew the Lease.
    #[arg(long, env = "KOORD_WEBHOOK_LEASE_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration_arg)]
    pub lease_retry_period: Duration,
    /// The leader narrows a pod entry to what its cache needs only once no change needing the
    /// entry (a profile, a parent quota) has been admitted for this long, nor its cache synced
    /// (longer than an admitted change takes to be stored and watched).
    #[arg(long, env = "KOORD_WEBHOOK_NARROW_HOLD", default_value = "120s", value_parser = parse_duration_arg)]
    pub narrow_hold: Duration,
    /// How long a watch of the cache may fail without a success before the replica turns unready
    /// (its cache no longer follows the cluster): longer than an API-server restart takes at the
    /// largest measured state (~2 min at L1, docs/scale.md), so a restart alone does not take
    /// every replica out at once.
    #[arg(long, env = "KOORD_WEBHOOK_WATCH_FAILURE_BOUND", default_value = "180s", value_parser = parse_duration_arg)]
    pub watch_failure_bound: Duration,
    /// `on`: the leader registers each pod entry as two webhooks, pods carrying Koordinator's QoS
    /// label sent by the second without matchConditions (the API server then does not convert
    /// them for CEL; docs/narrowing.md), while no other pod template of this install runs (during
    /// a rollout the entries are written whole). Turn it off, and let the leader write, before
    /// rolling back by hand to a release without this flag outside a rollout.
    #[arg(long, env = "KOORD_WEBHOOK_QOS_SPLIT", default_value = "on", action = clap::ArgAction::Set,
          value_parser = crate::install::entry_policy::parse_on_off)]
    pub qos_split: bool,
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!("{text:?} is not a number between 0 and 1")),
    }
}
