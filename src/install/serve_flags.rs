//! The `serve` flags an install sets beyond its dedicated values: one table, read from the flags'
//! own definitions (clap), written into the chart's `files/serve-flags.yaml` (the chart's `serve:`
//! value is checked against it) and checked by `manifests --serve-flag`. A new `serve` flag is
//! settable through both with no other edit; the flags a dedicated value sets are refused, naming
//! that value.

use std::collections::BTreeMap;

use clap::ArgAction;
use serde::Serialize;

/// The `serve` flags the chart and `manifests` set from a value of their own, and that value.
pub const OWNED: &[(&str, &str)] = &[
    ("port", "the container port (9443)"),
    ("namespace", "the release namespace"),
    ("identity", "the Pod's name"),
    ("memory-limit", "resources.limits.memory"),
    ("feature-gates", "featureGates"),
    ("failure-policy", "webhooks.failurePolicy"),
    ("webhook-timeout-seconds", "webhooks.timeoutSeconds"),
    ("exclude-namespace", "webhooks.excludeNamespaces"),
    ("exclude-namespace-label", "webhooks.excludeNamespaceLabels"),
    ("narrow-calls", "webhooks.narrowCalls"),
    ("mode", "mode"),
    ("entry-action", "webhooks.actions"),
    ("client-ca-file", "clientCA"),
    ("cert-mode", "certificates.mode"),
    ("log-format", "logging.format"),
];

/// One settable flag.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServeFlag {
    /// Takes no value: given as `--NAME` when set to true.
    pub switch: bool,
    /// May be given more than once (a list value repeats it).
    pub repeatable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    pub help: String,
}

/// Every settable flag by name, and the owned ones with their value.
#[derive(Clone, Debug, Serialize)]
pub struct ServeFlags {
    pub flags: BTreeMap<String, ServeFlag>,
    pub owned: BTreeMap<String, String>,
}

/// Why a `--serve-flag` cannot be set.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServeFlagError {
    #[error("{0:?}: expected NAME=VALUE")]
    Shape(String),
    #[error("--{name} is set from {owner}, not as a serve flag")]
    Owned { name: String, owner: String },
    #[error("koord-webhook serve has no flag --{0}")]
    Unknown(String),
}

impl ServeFlags {
    /// The table of the `serve` subcommand `serve`.
    pub fn of(serve: &clap::Command) -> Self {
        let owned: BTreeMap<String, String> = OWNED
            .iter()
            .map(|(name, owner)| ((*name).to_owned(), (*owner).to_owned()))
            .collect();
        let flags = serve
            .get_arguments()
            .filter(|arg| !arg.is_hide_set())
            .filter_map(|arg| Some((arg.get_long()?.to_owned(), arg)))
            .filter(|(name, _)| !owned.contains_key(name) && name != "help")
            .map(|(name, arg)| {
                let defaults: Vec<String> = arg
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect();
                let flag = ServeFlag {
                    switch: matches!(arg.get_action(), ArgAction::SetTrue),
                    repeatable: matches!(arg.get_action(), ArgAction::Append),
                    default: (!defaults.is_empty()).then(|| defaults.join(",")),
                    help: arg
                        .get_help()
                        .map(|h| h.to_string())
                        .unwrap_or_default()
                        .replace('\n', " "),
                };
                (name, flag)
            })
            .collect();
        Self { flags, owned }
    }

    /// `NAME=VALUE` as the `serve` argument it stands for; a switch takes `true` or `false`
    /// (`false` gives none).
    pub fn arg(&self, text: &str) -> Result<Option<String>, ServeFlagError> {
        let (name, value) = text
            .split_once('=')
            .ok_or_else(|| ServeFlagError::Shape(text.to_owned()))?;
        let name = name.trim_start_matches("--");
        if let Some(owner) = self.owned.get(name) {
            return Err(ServeFlagError::Owned {
                name: name.to_owned(),
                owner: owner.clone(),
            });
        }
        let flag = self
            .flags
            .get(name)
            .ok_or_else(|| ServeFlagError::Unknown(name.to_owned()))?;
        Ok(match (flag.switch, value) {
            (true, "true") => Some(format!("--{name}")),
            (true, "false") => None,
            (true, _) => return Err(ServeFlagError::Shape(text.to_owned())),
            (false, _) => Some(format!("--{name}={value}")),
        })
    }
}
