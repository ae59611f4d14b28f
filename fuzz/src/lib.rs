//! What the fuzz targets run. Each function must never panic, hang or grow without bound on any
//! input: a panic or an abort is a finding, and becomes a regression test in the main crate.

use std::sync::OnceLock;
use std::time::Duration;

use koord_webhook::admission::Admission;
use koord_webhook::cache::load::load_state;
use koord_webhook::entries::EndpointName;
use koord_webhook::features::FeatureGates;
use koord_webhook::memory::Meter;
use koord_webhook::metrics::Metrics;
use koord_webhook::resources::Qty;
use koord_webhook::resources::strategic_merge::{self, POD_KEYS};
use koord_webhook::slo_config::{self, CheckEnv, ConfigKey, SystemForQos};

/// One admission server's handlers over the test fixtures' quota tree and pods, every gate that
/// adds a rule turned on.
fn admission() -> &'static (Admission, tokio::runtime::Runtime) {
    static ADMISSION: OnceLock<(Admission, tokio::runtime::Runtime)> = OnceLock::new();
    ADMISSION.get_or_init(|| {
        // The fuzz crate's directory, or the main crate's when tests/it replays the seeds.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let repo = if dir.ends_with("fuzz") {
            dir.parent().expect("fuzz/ has a parent")
        } else {
            dir
        };
        let cache = load_state(&repo.join("tests/fixtures/state"))
            .expect("the fixture state loads")
            .reader();
        let gates: FeatureGates = "EnableQuotaAdmission=true,MultiQuotaTree=true"
            .parse()
            .expect("known gates");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        (Admission::new(cache, gates, Metrics::new()), runtime)
    })
}

/// Bytes the answer to a body of `n` bytes may allocate, at most, all told: the decode is held to
/// the body's estimate (`koord_webhook::memory`), and the rules, the copy a mutating chain keeps and
/// the patch take a bounded multiple of what was decoded.
pub fn answer_bound(n: usize) -> usize {
    ANSWER_BYTES_PER_BODY_BYTE * n + ANSWER_FLOOR
}
pub const ANSWER_BYTES_PER_BODY_BYTE: usize = 64;
pub const ANSWER_FLOOR: usize = 1 << 20;

/// A body to `endpoint`'s path: either an HTTP error (Err) or a response that is an
/// AdmissionReview, and within [`answer_bound`] of memory. Every endpoint has a target calling
/// this (checked in the main crate).
pub fn review(endpoint: EndpointName, body: &[u8]) {
    let peak = review_measured(endpoint, body);
    assert!(
        peak <= answer_bound(body.len()),
        "answering {} bytes took {peak} bytes, more than {} (the bound)",
        body.len(),
        answer_bound(body.len())
    );
}

/// As [`review`] without the bound: the most bytes the answer held at once (counted by the
/// process's allocator on this thread, and on the blocking pool for the checks sent there).
pub fn review_measured(endpoint: EndpointName, body: &[u8]) -> usize {
    let (admission, runtime) = admission();
    let path = endpoint.spec().path;
    let meter = Meter::start(usize::MAX);
    let answer = runtime.block_on(admission.review(path, body, Some(Duration::from_secs(10))));
    let peak = meter.peak();
    drop(meter);
    if let Ok(response) = answer {
        let review: serde_json::Value =
            serde_json::from_slice(&response).expect("every response is JSON");
        assert_eq!(review["kind"], "AdmissionReview", "{review}");
        assert!(review["response"]["allowed"].is_boolean(), "{review}");
    }
    peak
}

pub fn slo_config(text: &[u8]) {
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    // The same text read as the system config too: network QoS is checked against its totals.
    let system = SystemForQos::read(Some(text));
    let env = CheckEnv {
        config_map: "koordinator-system/slo-controller-config",
        name_need_check: true,
        system: &system,
    };
    for key in ConfigKey::CHECK_ORDER {
        let _ = slo_config::check_key(key, text, &env);
    }
}

pub fn quantity(text: &[u8]) {
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    if let Ok(q) = text.parse::<Qty>() {
        let printed = q.to_string();
        let again: Qty = printed.parse().unwrap_or_else(|e| {
            panic!("{text:?} printed as {printed:?}, which does not parse: {e}")
        });
        assert_eq!(again.milli(), q.milli(), "{text:?} -> {printed:?}");
    }
}

pub fn strategic_merge(bytes: &[u8]) {
    let split = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let (Ok(original), Ok(patch)) = (
        serde_json::from_slice::<serde_json::Value>(&bytes[..split]),
        serde_json::from_slice::<serde_json::Value>(bytes.get(split + 1..).unwrap_or_default()),
    ) else {
        return;
    };
    let _ = strategic_merge::apply(&original, &patch, &POD_KEYS);
}
