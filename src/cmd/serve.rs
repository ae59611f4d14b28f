//! `koord-webhook serve`: the admission server.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::admission::Admission;
use crate::cache::{Cache, load::load_state};
use crate::certs;
use crate::cli::ServeArgs;
use crate::features::FeatureGates;
use crate::metrics::Metrics;
use crate::server::{self, Readiness, Shared};
use crate::tls::CertResolver;

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let gates: FeatureGates = args.feature_gates.parse().context("--feature-gates")?;
    let cache = match &args.state {
        Some(path) => {
            let cache = load_state(path).context("--state")?.reader();
            tracing::info!(path = %path.display(), objects = ?cache.sizes(), "serving from a static cache");
            cache
        }
        None => {
            tracing::warn!("no --state given: serving with an empty cache");
            Cache::empty()
        }
    };

    let resolver = Arc::new(CertResolver::new());
    match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => {
            let cert_pem = std::fs::read(cert)
                .with_context(|| format!("--tls-cert-file {}", cert.display()))?;
            let key_pem =
                std::fs::read(key).with_context(|| format!("--tls-key-file {}", key.display()))?;
            resolver
                .set_pem(&cert_pem, &key_pem)
                .context("--tls-cert-file/--tls-key-file")?;
            tracing::info!(cert = %cert.display(), "serving certificate loaded from files");
        }
        _ => {
            let hosts = vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
                "::1".to_owned(),
            ];
            let pair = certs::self_signed(
                "koord-webhook",
                &hosts,
                Duration::from_secs(365 * 24 * 3600),
            )?;
            resolver.set_pem(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes())?;
            tracing::warn!(
                ?hosts,
                "serving an in-memory self-signed certificate (no --tls-cert-file given)"
            );
        }
    }

    let shared = Arc::new(Shared {
        admission: Admission::new(cache, gates, Metrics::new()),
        readiness: Readiness::default(),
        resolver,
        max_body_bytes: args.max_request_bytes,
    });
    let addr = SocketAddr::new(args.bind_address, args.port);
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(%addr, gates = %gates.overrides(), "admission server listening");
    server::build(listener, shared)?
        .await
        .context("server stopped with an error")
}
