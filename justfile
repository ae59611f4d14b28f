# Developer entry points. The scripts they call work without `just` (a fresh machine has none):
# `cargo install just` if you want it.

# Every test (builds the test control plane on first use).
test *ARGS:
    scripts/test {{ARGS}}

# The main job: a local control plane with koord-webhook running against it, showing admission.
dev:
    scripts/dev

# The admission server alone with a self-signed certificate and the sample state.
run *ARGS:
    cargo run -- serve --state examples/state {{ARGS}}

# Formatting and lints, as CI runs them.
lint:
    cargo fmt --all -- --check
    cargo clippy --all-targets -- -D warnings

# Regenerate crds/ and manifests/ from the code, and fail if they had drifted.
gen:
    scripts/gen --check

# Start or stop a control plane by hand: `just control-plane up`, `just control-plane down`.
control-plane *ARGS:
    scripts/control-plane {{ARGS}}

# Benchmarks: koord-webhook against a Go peer on controller-runtime (writes bench/RESULTS.md), then
# the criterion micro-benchmarks (`cargo bench --bench elastic_quota_update` for one).
bench:
    bench/run
    cargo bench
