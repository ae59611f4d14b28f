//! `koord-webhook manifests`: the install file, or only the webhook configurations.

use anyhow::Context;

use crate::cli::ManifestArgs;
use crate::features::FeatureGates;
use crate::install::{self, ClientCaMount, ClientCaObject, InstallOptions, WebhookTarget};

pub fn render(args: &ManifestArgs) -> anyhow::Result<String> {
    let gates: FeatureGates = args.feature_gates.parse().context("--feature-gates")?;
    let target = WebhookTarget::from_flags(args.webhook_host.as_deref(), args.port, &args.entries);
    let ca_bundle = match &args.ca_bundle_file {
        Some(path) => Some(
            std::fs::read(path).with_context(|| format!("--ca-bundle-file {}", path.display()))?,
        ),
        None => None,
    };
    if args.webhook_configurations_only {
        return Ok(install::render_webhook_configurations(
            &gates,
            &target,
            ca_bundle.as_deref(),
        )?);
    }
    if ca_bundle.is_some() {
        anyhow::bail!(
            "--ca-bundle-file goes with --webhook-configurations-only (the operator fills the installed ones)"
        );
    }
    let object = match (&args.client_ca_configmap, &args.client_ca_secret) {
        (Some(name), _) => Some(ClientCaObject::ConfigMap(name.clone())),
        (None, Some(name)) => Some(ClientCaObject::Secret(name.clone())),
        (None, None) => None,
    };
    Ok(install::render(&InstallOptions {
        image: args.image.clone(),
        gates,
        target,
        client_ca: object.map(|object| ClientCaMount {
            object,
            key: args.client_ca_key.clone(),
        }),
    })?)
}
