//! The `koord-webhook` binary: parses the command line (`cli.rs`), sets up logging (except for
//! `status` and `audit`, whose output is the report), and runs the command (`cmd/`) on a runtime;
//! errors leave as one line on stderr and a non-zero exit.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use koord_webhook::cli::{Cli, Command};
use koord_webhook::{cmd, telemetry, tls};

fn main() -> ExitCode {
    tls::install_default_provider();
    let cli = Cli::parse();
    // `status` prints one report or one error line; the client library's logs would only add noise.
    if !matches!(cli.command, Command::Status(_) | Command::Audit(_)) {
        telemetry::init(cli.log_format);
    }
    let own_namespace = match &cli.command {
        Command::Serve(args) => Some(args.namespace.as_str()),
        Command::Manifests(args) => Some(args.entries.mode.namespace_or(args.namespace.as_deref())),
        Command::Status(args) => Some(args.cluster.namespace()),
        Command::Audit(args) => Some(args.cluster.namespace()),
        Command::Uninstall(args) => Some(args.cluster.namespace()),
        Command::Review(_)
        | Command::Crds
        | Command::ChartFiles { .. }
        | Command::DocTables { .. } => None,
    };
    if let Some(namespace) = own_namespace
        && let Err(e) = koord_webhook::names::set_namespace(namespace)
    {
        return fail(e);
    }
    match cli.command {
        Command::Serve(args) => on_runtime(cmd::serve::run(args), done),
        Command::Review(args) => match cmd::review::run(&args) {
            Ok(response) => {
                let mut stdout = std::io::stdout().lock();
                let _ = stdout
                    .write_all(&response)
                    .and_then(|_| stdout.write_all(b"\n"));
                if args.exit_code && !cmd::review::allowed(&response) {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => {
                eprintln!("koord-webhook review: {e}");
                ExitCode::from(2)
            }
        },
        Command::ChartFiles { dir } => {
            match koord_webhook::install::chart_files::write(&dir, &cmd::manifests::serve_flags()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(format!("{e:#}")),
            }
        }
        Command::DocTables { root } => match cmd::doc_tables::write(&root) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(format!("{e:#}")),
        },
        Command::Crds => match koord_webhook::apis::crds_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("cannot render CRDs: {e}")),
        },
        Command::Status(args) => on_runtime(cmd::status::run(&args), report),
        Command::Audit(args) => on_runtime(cmd::audit::run(&args), report),
        Command::Uninstall(args) => {
            let options = cmd::uninstall::Options {
                cluster: args.cluster,
                delete_crds: args.delete_crds,
                keep_webhook_configurations: args.keep_webhook_configurations,
                delete_namespace: args.delete_namespace,
                timeout: args.timeout,
            };
            on_runtime(cmd::uninstall::run(&options), done)
        }
        Command::Manifests(args) => match cmd::manifests::render(&args) {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("{e:#}")),
        },
    }
}

/// One line on stderr, exit 1.
fn fail(message: String) -> ExitCode {
    eprintln!("koord-webhook: error: {}", message.replace('\n', " "));
    ExitCode::FAILURE
}

/// The one place a command's runtime is made: runs `command` to its end, and `exit` on its result.
fn on_runtime<T>(
    command: impl std::future::Future<Output = T>,
    exit: impl FnOnce(T) -> ExitCode,
) -> ExitCode {
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => exit(runtime.block_on(command)),
        Err(e) => fail(format!("cannot start runtime: {e}")),
    }
}

/// Exit 0, or 1 with the error.
fn done(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("{e:#}")),
    }
}

/// A command that prints a report: exit 0 when it says all is well, 1 when not, 2 when the
/// cluster could not be read.
fn report(result: anyhow::Result<(String, bool)>) -> ExitCode {
    match result {
        Ok((text, fine)) => {
            print!("{text}");
            if fine {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            fail(format!("{e:#}"));
            ExitCode::from(2)
        }
    }
}
