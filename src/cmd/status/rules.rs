//! The rules section of `status`: each rule whose action is not the default (read from the
//! Deployment's arguments) and what the replicas counted for it (their `/metrics`, read through the
//! API server's pod proxy; counts since each replica started: Prometheus gives any window).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::admission::actions::Action;
use crate::admission::registered_rules;
use crate::names::{APP_NAME, SELECTOR_LABEL};

#[derive(Serialize, Debug, Default, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RuleStatus {
    pub rule: String,
    pub webhook: String,
    /// As `--rule-action` writes it (`Deny`, `Warn+Audit`, `Apply`, ...).
    pub action: String,
    /// Refusals that denied, shown or recorded only, and changes not sent, summed over the ready
    /// replicas since each started.
    pub denied: u64,
    pub would_deny: u64,
    pub would_change: u64,
}

/// The rules with a non-default action or a count, and notes on what could not be read.
pub async fn collect(client: &Client, namespace: &str) -> (Vec<RuleStatus>, Vec<String>) {
    let mut notes = Vec::new();
    let mut rows: BTreeMap<(String, String), RuleStatus> = BTreeMap::new();
    match super::super::deployed::flags(client, namespace).await {
        Ok(deployed) => {
            let settings = deployed.settings;
            for rule in registered_rules() {
                for webhook in &rule.webhooks {
                    let action = settings.actions.of(webhook, rule.name);
                    if action != Action::ENFORCE {
                        let row = row(&mut rows, webhook, rule.name);
                        row.action = action.label(rule.kind).to_owned();
                    }
                }
            }
        }
        Err(e) => notes.push(format!("rule actions unknown: {e:#}")),
    }
    match replica_metrics(client, namespace).await {
        Ok(texts) => {
            for text in texts {
                for sample in rule_results(&text) {
                    let row = row(&mut rows, &sample.webhook, &sample.rule);
                    if row.action.is_empty() || sample.result != "deny" {
                        row.action = sample.action.clone();
                    }
                    match sample.result.as_str() {
                        "deny" => row.denied += sample.value,
                        "would_deny" => row.would_deny += sample.value,
                        "would_change" => row.would_change += sample.value,
                        _ => {}
                    }
                }
            }
        }
        Err(e) => notes.push(format!("the replicas' metrics could not be read: {e:#}")),
    }
    (rows.into_values().collect(), notes)
}

fn row<'a>(
    rows: &'a mut BTreeMap<(String, String), RuleStatus>,
    webhook: &str,
    rule: &str,
) -> &'a mut RuleStatus {
    rows.entry((rule.to_owned(), webhook.to_owned()))
        .or_insert_with(|| RuleStatus {
            rule: rule.to_owned(),
            webhook: webhook.to_owned(),
            ..RuleStatus::default()
        })
}

/// The `/metrics` text of each running replica, through the API server's pod proxy (the port named
/// `metrics`).
async fn replica_metrics(client: &Client, namespace: &str) -> anyhow::Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{SELECTOR_LABEL}={APP_NAME}");
    let mut texts = Vec::new();
    for pod in pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
    {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let port = pod.spec.as_ref().and_then(|spec| {
            spec.containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some("metrics"))
                .map(|p| p.container_port)
        });
        let (Some(name), Some(port), true) = (pod.metadata.name.as_deref(), port, running) else {
            continue;
        };
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}:{port}/proxy/metrics");
        let request = http::Request::get(path).body(Vec::new())?;
        texts.push(client.request_text(request).await?);
    }
    Ok(texts)
}

/// One sample of `koord_webhook_admission_rule_results_total`.
#[derive(Debug, PartialEq, Eq)]
struct Sample {
    webhook: String,
    rule: String,
    action: String,
    result: String,
    value: u64,
}

const RULE_RESULTS: &str = "koord_webhook_admission_rule_results_total{";

/// The rule-result samples of a Prometheus text exposition.
fn rule_results(text: &str) -> Vec<Sample> {
    text.lines()
        .filter_map(|line| line.strip_prefix(RULE_RESULTS))
        .filter_map(|rest| {
            let (labels, value) = rest.split_once("} ")?;
            let mut found: BTreeMap<&str, &str> = BTreeMap::new();
            for pair in labels.split("\",") {
                let (key, value) = pair.split_once("=\"")?;
                found.insert(key, value.trim_end_matches('"'));
            }
            let label = |key: &str| found.get(key).map(|v| (*v).to_owned());
            Some(Sample {
                webhook: label("webhook")?,
                rule: label("rule")?,
                action: label("action")?,
                result: label("result")?,
                value: value.trim().parse::<f64>().ok()? as u64,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_results_are_read_from_the_exposition() {
        let text = "# HELP koord_webhook_admission_rule_results Rule refusals\n\
            koord_webhook_admission_rule_results_total{webhook=\"/validate-pod\",rule=\"ColocationQoSPriority\",action=\"Warn\",result=\"would_deny\"} 3\n\
            koord_webhook_admission_requests_total{webhook=\"/validate-pod\"} 9\n\
            koord_webhook_admission_rule_results_total{webhook=\"/mutate-pod\",rule=\"ClusterColocationProfile\",action=\"Audit\",result=\"would_change\"} 1\n";
        assert_eq!(
            rule_results(text),
            [
                Sample {
                    webhook: "/validate-pod".into(),
                    rule: "ColocationQoSPriority".into(),
                    action: "Warn".into(),
                    result: "would_deny".into(),
                    value: 3
                },
                Sample {
                    webhook: "/mutate-pod".into(),
                    rule: "ClusterColocationProfile".into(),
                    action: "Audit".into(),
                    result: "would_change".into(),
                    value: 1
                }
            ]
        );
    }
}
