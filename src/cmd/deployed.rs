//! The feature gates and rule flags of the installed replicas (`audit --same-as-deployed`, the rule
//! actions `status` shows), read from their Deployment's container arguments and parsed as `serve`
//! parses them.

use anyhow::{Context, anyhow};
use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::{Api, ListParams};

use super::resolved::{Replica, Rules};
use crate::cli::{Cli, Command};
use crate::names::{APP_NAME, SELECTOR_LABEL};

/// The gates and rule settings (entry actions included) `serve` runs with in `namespace`'s
/// koord-webhook Deployment, resolved as its replicas resolve them.
pub async fn flags(client: &Client, namespace: &str) -> anyhow::Result<Rules> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{SELECTOR_LABEL}={APP_NAME}");
    let list = deployments
        .list(&ListParams::default().labels(&selector))
        .await
        .with_context(|| format!("cannot list the Deployments of {namespace}"))?;
    let deployment = list
        .items
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no Deployment labelled {selector} in {namespace}"))?;
    let args = serve_args(&deployment)
        .ok_or_else(|| anyhow!("the Deployment's {APP_NAME} container runs no `serve`"))?;
    parse(&args)
}

fn serve_args(deployment: &Deployment) -> Option<Vec<String>> {
    let containers = &deployment.spec.as_ref()?.template.spec.as_ref()?.containers;
    let container = containers.iter().find(|c| c.name == APP_NAME)?;
    let args = container.args.clone().unwrap_or_default();
    (args.first().map(String::as_str) == Some("serve")).then_some(args)
}

fn parse(args: &[String]) -> anyhow::Result<Rules> {
    let cli = Cli::try_parse_from(std::iter::once(APP_NAME.to_owned()).chain(args.iter().cloned()))
        .map_err(|e| {
            anyhow!(
                "the Deployment's arguments do not parse: {}",
                e.to_string().trim()
            )
        })?;
    match cli.command {
        Command::Serve(serve) => Ok(Replica::resolve(&serve)?.rules),
        _ => Err(anyhow!("the Deployment's container runs no `serve`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deployments_gates_and_rule_flags_are_read_as_serve_reads_them() {
        let args: Vec<String> = [
            "serve",
            "--port=9443",
            "--feature-gates=EnableQuotaAdmission=true",
            "--rule-action=ColocationQoSPriority=Warn",
            "--entry-action=vnode.koordinator.sh=Audit",
            "--slo-config-name=other",
        ]
        .map(String::from)
        .to_vec();
        let Rules { gates, settings } = parse(&args).unwrap();
        assert!(gates.enabled(crate::features::Gate::EnableQuotaAdmission));
        assert_eq!(settings.slo_config_name, "other");
        assert!(
            !settings
                .actions
                .of("/validate-pod", "ColocationQoSPriority")
                .enforces()
        );
        assert!(
            !settings
                .actions
                .of("/validate-node", "NodeSLOConfigConflict")
                .enforces()
        );
        // A shadow install reads Koordinator's ConfigMaps where Koordinator keeps them, as its
        // replicas do, whatever namespace it runs in.
        let shadow_args = [
            "serve",
            "--mode=shadow",
            "--own-user=system:serviceaccount:x:y",
        ];
        let shadow = parse(&shadow_args.map(String::from)).unwrap().settings;
        assert_eq!(shadow.config_namespace, crate::names::DEFAULT_NAMESPACE);
        assert_eq!(shadow.own_user.get(), None);
        let bad = parse(&["serve".to_owned(), "--rule-action=Nope=Warn".to_owned()]);
        assert!(bad.unwrap_err().to_string().contains("Nope"));
    }
}
