//! How the API server calls each webhook entry: the settings of the webhook configurations that
//! `manifests` renders and `serve` keeps, as flags. The operator owns these fields (and the
//! caBundle): a hand edit is put back and recorded as an Event, so change them here (or in the
//! chart's values).

use clap::Args;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

use crate::entries::{ENDPOINTS, FailurePolicy};
use crate::names::Mode;

pub const DEFAULT_TIMEOUT_SECONDS: i32 = 10;

/// The entry flags, shared by `serve` (what the leader keeps) and `manifests` (what it renders).
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct EntryPolicy {
    /// `enforce`: in front of Koordinator's objects under Koordinator's names, replacing
    /// koord-manager's webhook. `shadow`: beside it, to try koord-webhook first — its own
    /// configuration (validating only) and entry names, every rule in Audit, `failurePolicy:
    /// Ignore`, every request sent (no narrowing), nothing of Koordinator's written.
    #[arg(
        long,
        env = "KOORD_WEBHOOK_MODE",
        value_enum,
        default_value = "enforce"
    )]
    pub mode: Mode,
    /// `ENTRY=Fail|Ignore` for an entry (e.g. `vpod.koordinator.sh=Ignore`) or `all=Ignore`;
    /// repeatable, the last one naming an entry wins. Default: the table's (Fail but for nodes).
    #[arg(long = "failure-policy", env = "KOORD_WEBHOOK_FAILURE_POLICY", value_delimiter = ',',
          value_parser = parse_failure_policy)]
    pub failure_policies: Vec<(String, FailurePolicy)>,
    /// Seconds the API server waits for an answer (1-30).
    #[arg(long, env = "KOORD_WEBHOOK_TIMEOUT_SECONDS", default_value_t = DEFAULT_TIMEOUT_SECONDS,
          value_parser = clap::value_parser!(i32).range(1..=30))]
    pub webhook_timeout_seconds: i32,
    /// A namespace the pod entries skip besides kube-system and koord-webhook's own; repeatable.
    #[arg(
        long = "exclude-namespace",
        env = "KOORD_WEBHOOK_EXCLUDE_NAMESPACES",
        value_delimiter = ','
    )]
    pub excluded_namespaces: Vec<String>,
    /// A namespace label (`KEY` or `KEY=VALUE`) that exempts the namespaces carrying it from the pod
    /// entries; repeatable.
    #[arg(
        long = "exclude-namespace-label",
        env = "KOORD_WEBHOOK_EXCLUDE_NAMESPACE_LABELS",
        value_delimiter = ',',
        value_parser = parse_namespace_label
    )]
    pub excluded_namespace_labels: Vec<NamespaceLabel>,
    /// `on`: the API server calls only for requests whose answer can differ from "allowed,
    /// unchanged" (each entry's `matchConditions`, written by the operator); `off`: every request
    /// the entries' rules select, as Koordinator registers them.
    #[arg(long, env = "KOORD_WEBHOOK_NARROW_CALLS", default_value = "on", action = clap::ArgAction::Set,
          value_parser = parse_on_off)]
    pub narrow_calls: bool,
    /// `ENTRY=Audit` (or `all=Audit`): every rule of the entry's endpoint records what it would
    /// refuse or change instead of doing it (as `--rule-action RULE=Audit`, which wins where both
    /// name a rule), and the entry is written with `failurePolicy: Ignore`. Entries that share an
    /// endpoint (`mpod-create` and `mpod-update`) are named together. Repeatable.
    #[arg(long = "entry-action", env = "KOORD_WEBHOOK_ENTRY_ACTIONS", value_delimiter = ',',
          value_name = "ENTRY=Audit", value_parser = parse_entry_action)]
    pub audited_entries: Vec<String>,
}

impl Default for EntryPolicy {
    fn default() -> Self {
        Self {
            mode: Mode::Enforce,
            failure_policies: Vec::new(),
            webhook_timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            excluded_namespaces: Vec::new(),
            excluded_namespace_labels: Vec::new(),
            narrow_calls: true,
            audited_entries: Vec::new(),
        }
    }
}

impl EntryPolicy {
    /// The `serve` flags that give the operator these entry settings (for the Deployment).
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.mode != Mode::Enforce {
            args.push(format!("--mode={}", self.mode.as_str()));
        }
        if self.webhook_timeout_seconds != DEFAULT_TIMEOUT_SECONDS {
            args.push(format!(
                "--webhook-timeout-seconds={}",
                self.webhook_timeout_seconds
            ));
        }
        for (entry, policy) in &self.failure_policies {
            args.push(format!("--failure-policy={entry}={}", policy.as_str()));
        }
        for namespace in &self.excluded_namespaces {
            args.push(format!("--exclude-namespace={namespace}"));
        }
        for label in &self.excluded_namespace_labels {
            args.push(format!("--exclude-namespace-label={}", label.arg()));
        }
        if !self.narrow_calls {
            args.push("--narrow-calls=off".to_owned());
        }
        for entry in &self.audited_entries {
            args.push(format!("--entry-action={entry}=Audit"));
        }
        args
    }

    /// Whether `--entry-action` (or a shadow) puts the entry in Audit.
    pub fn audited(&self, entry: &str) -> bool {
        self.mode == Mode::Shadow
            || self
                .audited_entries
                .iter()
                .any(|name| name == entry || name == "all")
    }

    /// Whether calls are narrowed (`--narrow-calls=on`, and never in a shadow: its pod entries sit
    /// in one validating configuration, which the leader's narrowing does not keep).
    pub fn narrows(&self) -> bool {
        self.narrow_calls && self.mode == Mode::Enforce
    }

    /// The endpoints whose rules are in Audit; an error when an entry is named without the entries
    /// that share its endpoint.
    pub fn audited_endpoints(&self) -> Result<Vec<&'static str>, String> {
        let mut paths = Vec::new();
        for spec in ENDPOINTS {
            let named: Vec<&str> = spec
                .entries
                .iter()
                .map(|e| e.name)
                .filter(|name| self.audited(name))
                .collect();
            if named.is_empty() {
                continue;
            }
            if named.len() < spec.entries.len() {
                let all: Vec<&str> = spec.entries.iter().map(|e| e.name).collect();
                return Err(format!(
                    "--entry-action: {} share the rules of {}: name them all",
                    all.join(" and "),
                    spec.path
                ));
            }
            paths.push(spec.path);
        }
        Ok(paths)
    }
}

/// `on` or `off` (`--narrow-calls`).
pub fn parse_on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?}: expected on or off")),
    }
}

/// `KEY` (a namespace carrying the label, whatever its value) or `KEY=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceLabel {
    pub key: String,
    pub value: Option<String>,
}

impl NamespaceLabel {
    /// The requirement a namespace must meet to be called: not carrying the label.
    pub(super) fn requirement(&self) -> LabelSelectorRequirement {
        match &self.value {
            // NotIn also admits namespaces without the key, as an exemption should.
            Some(value) => LabelSelectorRequirement {
                key: self.key.clone(),
                operator: "NotIn".to_owned(),
                values: Some(vec![value.clone()]),
            },
            None => LabelSelectorRequirement {
                key: self.key.clone(),
                operator: "DoesNotExist".to_owned(),
                values: None,
            },
        }
    }

    fn arg(&self) -> String {
        match &self.value {
            Some(value) => format!("{}={value}", self.key),
            None => self.key.clone(),
        }
    }
}

/// `KEY` or `KEY=VALUE` (`--exclude-namespace-label`), KEY a label key as the API server takes it.
pub fn parse_namespace_label(text: &str) -> Result<NamespaceLabel, String> {
    let (key, value) = match text.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (text, None),
    };
    let (prefix, name) = key
        .rsplit_once('/')
        .map_or((None, key), |(p, n)| (Some(p), n));
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.len() <= 63
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && n.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && n.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    let prefix_ok =
        prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(crate::names::is_dns_label));
    if !name_ok(name) || !prefix_ok {
        return Err(format!("{key:?} is not a label key"));
    }
    if let Some(value) = value
        && !value.is_empty()
        && !name_ok(value)
    {
        return Err(format!("{value:?} is not a label value"));
    }
    Ok(NamespaceLabel {
        key: key.to_owned(),
        value: value.map(str::to_owned),
    })
}

/// `ENTRY=Fail|Ignore` (`--failure-policy`), `ENTRY` an entry name of the table or `all`.
pub fn parse_failure_policy(text: &str) -> Result<(String, FailurePolicy), String> {
    let (entry, policy) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected ENTRY=Fail or ENTRY=Ignore"))?;
    let policy = match policy {
        "Fail" => FailurePolicy::Fail,
        "Ignore" => FailurePolicy::Ignore,
        other => return Err(format!("{other:?}: the failurePolicy is Fail or Ignore")),
    };
    Ok((known_entry(entry)?, policy))
}

/// `ENTRY=Audit` (`--entry-action`), `ENTRY` an entry name of the table or `all`.
pub fn parse_entry_action(text: &str) -> Result<String, String> {
    match text.split_once('=') {
        Some((entry, "Audit")) => known_entry(entry),
        Some((_, other)) => Err(format!(
            "{other:?}: an entry's action is Audit (enforcing is the default)"
        )),
        None => Err(format!("{text:?}: expected ENTRY=Audit")),
    }
}

/// `entry` when it names an entry of the table, or is `all`.
fn known_entry(entry: &str) -> Result<String, String> {
    let known = ENDPOINTS.iter().flat_map(|w| w.entries).map(|e| e.name);
    if entry != "all" && !known.clone().any(|name| name == entry) {
        let names: Vec<&str> = known.collect();
        return Err(format!(
            "{entry:?} is no webhook entry; one of: all, {}",
            names.join(", ")
        ));
    }
    Ok(entry.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audited_entries_name_whole_endpoints() {
        let policy = |entries: &[&str]| EntryPolicy {
            audited_entries: entries.iter().map(|e| (*e).to_owned()).collect(),
            ..EntryPolicy::default()
        };
        assert_eq!(
            policy(&["vpod.koordinator.sh"]).audited_endpoints(),
            Ok(vec!["/validate-pod"])
        );
        let half = policy(&["mpod-create.koordinator.sh"]).audited_endpoints();
        assert!(half.unwrap_err().contains("mpod-update.koordinator.sh"));
        let both = policy(&["mpod-create.koordinator.sh", "mpod-update.koordinator.sh"]);
        assert_eq!(both.audited_endpoints(), Ok(vec!["/mutate-pod"]));
        assert_eq!(
            policy(&["all"]).audited_endpoints().unwrap().len(),
            ENDPOINTS.len()
        );
        assert!(parse_entry_action("vpod.koordinator.sh=Audit").is_ok());
        assert!(parse_entry_action("vpod.koordinator.sh=Warn").is_err());
        assert!(parse_entry_action("vpods=Audit").is_err());
        assert_eq!(
            policy(&["vpod.koordinator.sh"]).args(),
            ["--entry-action=vpod.koordinator.sh=Audit"]
        );
    }

    #[test]
    fn bad_label_keys_and_values_are_refused() {
        for bad in [
            "",
            "-x",
            "a/",
            "/x",
            "x=bad value",
            "Bad_Prefix.io/x",
            "x=-v",
        ] {
            assert!(parse_namespace_label(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["x", "a.b/c-d", "x=", "x=v.1", "example.com/exempt=true"] {
            assert!(parse_namespace_label(good).is_ok(), "{good:?} refused");
        }
    }
}
