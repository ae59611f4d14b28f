# Developer entry points. The scripts they call work without `just` (a fresh machine has none):
# `cargo install just` if you want it.

# Every test (builds the test control plane on first use).
test *ARGS:
    scripts/test {{ARGS}}

# The main job: the image installed from manifests/install.yaml on a one-node cluster, showing
# admission through the Service.
dev *ARGS:
    scripts/dev {{ARGS}}

# The fast loop without a node: a local control plane, koord-webhook as a host process (URL mode).
dev-local *ARGS:
    scripts/dev-local {{ARGS}}

# The image from the Dockerfile (static binary FROM scratch), offline: `just image --load DIR` also
# loads it into a cluster from `just cluster up DIR`.
image *ARGS:
    scripts/image {{ARGS}}

# A one-node cluster by hand: `just cluster up DIR`, `just cluster exec DIR kubectl get pods -A`.
cluster *ARGS:
    scripts/cluster {{ARGS}}

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

# The differential harness against Koordinator v1.8.0's own handlers: N random cases per endpoint
# (default 1000), the report in conformance/REPORT.md. CONFORMANCE_SEED=S replays a run.
conformance N="1000":
    CONFORMANCE_CASES={{N}} CONFORMANCE_REPORT={{justfile_directory()}}/conformance/REPORT.md cargo test --test it -- --exact conformance::random_reviews_answer_as_koordinator_does --nocapture
