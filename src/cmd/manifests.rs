//! `koord-webhook manifests`: the install file, or only the webhook configurations.

use anyhow::Context;

use clap::{CommandFactory, Parser};

use crate::cli::{Cli, Command, ManifestArgs};
use crate::features::FeatureGates;
use crate::install::serve_flags::ServeFlags;
use crate::install::{self, ClientCaMount, ClientCaObject, InstallOptions, WebhookTarget};
use crate::server::shutdown;

/// The table of `serve` flags an install may set (`--serve-flag`, the chart's `serve:`).
pub fn serve_flags() -> ServeFlags {
    ServeFlags::of(&serve_command())
}

/// The `serve` subcommand's definition, built, so that the global flags (`--log-format`) are among
/// its own.
pub fn serve_command() -> clap::Command {
    let mut cli = Cli::command();
    cli.build();
    cli.find_subcommand("serve")
        .expect("the serve subcommand is defined in cli.rs")
        .clone()
}

/// `--serve-flag`s as `serve` arguments, each checked against the table and all of them parsed as
/// `serve` parses them, so a bad value is refused here rather than by a crash-looping replica; and
/// the replicas as parsed.
fn serve_args(flags: &[String]) -> anyhow::Result<(Vec<String>, crate::cli::ServeArgs)> {
    let table = serve_flags();
    let mut args = Vec::new();
    for flag in flags {
        args.extend(table.arg(flag).context("--serve-flag")?);
    }
    let argv = ["koord-webhook", "serve"]
        .into_iter()
        .map(str::to_owned)
        .chain(args.iter().cloned());
    let Command::Serve(serve) = Cli::try_parse_from(argv).context("--serve-flag")?.command else {
        unreachable!("parsed as the serve subcommand");
    };
    Ok((args, serve))
}

pub fn render(args: &ManifestArgs) -> anyhow::Result<String> {
    let gates: FeatureGates = args.feature_gates.parse().context("--feature-gates")?;
    args.entries
        .audited_endpoints()
        .map_err(anyhow::Error::msg)?;
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
    let (serve_args, serve) = serve_args(&args.serve_flags)?;
    let mode = args.entries.mode;
    Ok(install::render(&InstallOptions {
        image: args.image.clone(),
        serve_args,
        termination_grace_period_seconds: shutdown::grace_period(serve.shutdown.drain_delay),
        config_namespace: serve
            .rules
            .config_namespace
            .unwrap_or_else(|| mode.config_namespace().to_owned()),
        gates,
        target,
        client_ca: object.map(|object| ClientCaMount {
            object,
            key: args.client_ca_key.clone(),
        }),
    })?)
}

#[cfg(test)]
mod tests {
    use crate::install::serve_flags::{OWNED, ServeFlagError, ServeFlags};
    use clap::CommandFactory;

    fn table() -> ServeFlags {
        super::serve_flags()
    }

    #[test]
    fn every_serve_flag_is_settable_or_owned_by_a_value() {
        let table = table();
        let mut cli = crate::cli::Cli::command();
        cli.build();
        let serve = cli.find_subcommand("serve").unwrap();
        for arg in serve.get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(name) = arg.get_long() else { continue };
            assert!(
                name == "help" || table.flags.contains_key(name) || table.owned.contains_key(name),
                "--{name}"
            );
        }
        // Every owned name is a flag of serve (a renamed flag must not leave a stale row).
        for (name, _) in OWNED {
            assert!(
                serve.get_arguments().any(|a| a.get_long() == Some(name)),
                "--{name} is no serve flag"
            );
        }
        let ratio = &table.flags["max-amplification-ratio"];
        assert_eq!(ratio.default.as_deref(), Some("5"));
        assert!(!ratio.switch && !ratio.repeatable);
        assert!(table.flags["enable-debug-endpoints"].switch);
        assert_eq!(
            table.flags["lease-duration"].default.as_deref(),
            Some("15s")
        );
    }

    #[test]
    fn a_serve_flag_becomes_its_argument_or_a_clear_refusal() {
        let table = table();
        assert_eq!(
            table.arg("max-amplification-ratio=3"),
            Ok(Some("--max-amplification-ratio=3".to_owned()))
        );
        assert_eq!(
            table.arg("enable-debug-endpoints=true"),
            Ok(Some("--enable-debug-endpoints".to_owned()))
        );
        assert_eq!(table.arg("enable-debug-endpoints=false"), Ok(None));
        assert_eq!(
            table.arg("cert-mode=external").unwrap_err().to_string(),
            "--cert-mode is set from certificates.mode, not as a serve flag"
        );
        assert_eq!(
            table.arg("no-such-flag=1").unwrap_err(),
            ServeFlagError::Unknown("no-such-flag".into())
        );
        assert!(matches!(
            table.arg("lease-duration"),
            Err(ServeFlagError::Shape(_))
        ));
    }
}
