//! `koord-webhook review`: answers one AdmissionReview offline with the very chain `serve` runs.
//!
//! Exit 0 whenever a response was produced (allowed or denied), 2 with one line on stderr when the
//! input is unusable.

use std::io::Read;

use crate::admission::Admission;
use crate::cache::load::load_state;
use crate::cli::ReviewArgs;
use crate::features::FeatureGates;
use crate::metrics::Metrics;

/// Input `review` cannot use; the message is the whole line printed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(String);

/// Runs the review and returns the response JSON.
pub fn run(args: &ReviewArgs) -> Result<Vec<u8>, Unusable> {
    let gates: FeatureGates = args
        .feature_gates
        .parse()
        .map_err(|e| Unusable(format!("--feature-gates: {e}")))?;
    let cache = load_state(&args.state)
        .map_err(|e| Unusable(format!("--state: {e}")))?
        .reader();
    let body = read_request(&args.request)?;
    let admission =
        Admission::new(cache, gates, Metrics::new()).with_settings(args.rules.settings());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Unusable(format!("cannot start runtime: {e}")))?;
    runtime
        .block_on(admission.review(&args.path, &body, None))
        .map_err(|e| Unusable(format!("--request: {e}")))
}

fn read_request(source: &str) -> Result<Vec<u8>, Unusable> {
    let mut body = Vec::new();
    if source == "-" {
        std::io::stdin()
            .read_to_end(&mut body)
            .map_err(|e| Unusable(format!("--request: cannot read standard input: {e}")))?;
    } else {
        body = std::fs::read(source)
            .map_err(|e| Unusable(format!("--request: cannot read {source}: {e}")))?;
    }
    Ok(body)
}
