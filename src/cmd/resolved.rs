//! A command's configuration, resolved once from its flags: what every part of the command then
//! reads. `serve` resolves a replica's ([`Replica::resolve`]), and so does the deployed view
//! (`deployed.rs`: a Deployment's `serve` arguments parsed back), so `audit --same-as-deployed` and
//! `status` read an install's settings as its replicas do; `review` and `audit`, which review as a
//! replica would without being one, resolve the rules' alone ([`Rules::resolve`]).

use anyhow::Context;

use crate::admission::Settings;
use crate::admission::rule_flags::RuleFlags;
use crate::admission::settings::OwnUser;
use crate::cli::ServeArgs;
use crate::features::FeatureGates;
use crate::install::WebhookTarget;
use crate::names::Mode;
use crate::operator::certificates::CertPolicy;
use crate::operator::leader::LeaseTimings;
use crate::operator::webhook_keeper::Desired;
use crate::operator::{OperatorConfig, serving_hosts};

/// The admission rules' configuration: the feature gates and the rules' settings.
#[derive(Debug)]
pub struct Rules {
    pub gates: FeatureGates,
    pub settings: Settings,
}

/// Whose changes a command's reviews count as the replicas' own (the user whose recent-admissions
/// records on quotas are the replicas'), when `--own-user` does not name it.
pub enum OwnUserUnless {
    /// `review`: the installed ServiceAccount (no API server to ask).
    ServiceAccount,
    /// `audit`: itself, whatever the flags say (it reviews stored quotas as its own changes).
    Always(&'static str),
}

impl Rules {
    /// The rules of `review` and `audit`: Enforce mode's ConfigMap namespace unless the flags say.
    pub fn resolve(
        feature_gates: &str,
        flags: &RuleFlags,
        own: OwnUserUnless,
    ) -> anyhow::Result<Self> {
        let gates = feature_gates.parse().context("--feature-gates")?;
        Ok(Self {
            gates,
            settings: flags.settings(),
        }
        .with_own_user(own))
    }

    /// These rules as `review` or `audit` runs them (`own`), whoever the replicas are.
    pub fn with_own_user(mut self, own: OwnUserUnless) -> Self {
        match own {
            OwnUserUnless::ServiceAccount => self
                .settings
                .own_user
                .learn(crate::names::service_account_user()),
            OwnUserUnless::Always(user) => self.settings.own_user = OwnUser::known(user),
        }
        self
    }
}

/// A replica's configuration: its rules' and, in cluster mode, its operator's.
pub struct Replica {
    pub rules: Rules,
    pub operator: OperatorConfig,
}

impl Replica {
    /// A replica started with `args`: its rules run with its mode's config namespace, the actions
    /// of the entries it audits, and (a shadow) no own user; its own user otherwise as
    /// `--own-user` says, or learned from the API server once it runs (`serve`). Before this was
    /// one function, the deployed view took Enforce mode's namespace for a shadow install's
    /// ConfigMaps.
    pub fn resolve(args: &ServeArgs) -> anyhow::Result<Self> {
        let gates = args.feature_gates.parse().context("--feature-gates")?;
        let mode = args.operator.entries.mode;
        let audited = (args.operator.entries.audited_endpoints()).map_err(anyhow::Error::msg)?;
        let mut settings = args
            .rules
            .settings_in(mode)
            .auditing_endpoints(&audited, &crate::admission::registered_rules());
        // A shadow keeps no record of its own on quotas, so it has none to guard (and must not
        // refuse another writer's, an enforcing koord-webhook's): its own user stays unknown.
        if mode == Mode::Shadow {
            settings.own_user = OwnUser::default();
        }
        let operator = operator_config(args, gates, &settings);
        Ok(Self {
            rules: Rules { gates, settings },
            operator,
        })
    }
}

fn operator_config(args: &ServeArgs, gates: FeatureGates, settings: &Settings) -> OperatorConfig {
    let (flags, port) = (&args.operator, args.port);
    let identity = flags.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "koord-webhook".to_owned());
        format!("{host}-{}", std::process::id())
    });
    OperatorConfig {
        identity,
        leader_elect: flags.leader_elect,
        lease: LeaseTimings {
            lease: flags.lease_duration,
            renew_deadline: flags.lease_renew_deadline,
            retry: flags.lease_retry_period,
        },
        cert_mode: flags.cert_mode,
        policy: CertPolicy {
            ca_validity: flags.ca_validity,
            cert_validity: flags.cert_validity,
            renew_fraction: flags.renew_fraction,
            ca_grace: flags.ca_rotation_grace,
            publish_settle: flags.ca_publish_settle,
            // A shadow has a CA of its own.
            adopt_ca_secret: Some(flags.adopt_ca_secret.clone())
                .filter(|name| !name.is_empty() && flags.entries.mode == Mode::Enforce),
            hosts: serving_hosts(flags.webhook_host.as_deref(), flags.entries.mode),
        },
        desired: Desired {
            gates,
            target: WebhookTarget {
                qos_split: flags.qos_split,
                ..WebhookTarget::from_flags(flags.webhook_host.as_deref(), port, &flags.entries)
            },
        },
        child_request_quiet: settings.child_request_window,
        narrow_hold: flags.narrow_hold,
        watch_failure_bound: flags.watch_failure_bound,
        config_maps: settings.config_maps(),
        memory_limit: args.limits.memory_limit,
    }
}
