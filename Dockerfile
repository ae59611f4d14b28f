# The koord-webhook image: one static binary (musl, rustls + ring, no OpenSSL, no libc to patch) and
# nothing else: no shell, no package manager, no CA store (the operator trusts only the cluster's CA).
# It starts FROM scratch, so it builds offline and for any architecture without emulation; build the
# binary first, or run `scripts/image` (`just image`; `--all` for amd64 and arm64 in one OCI index),
# which does both with buildah, podman or docker:
#
#   cargo build --release --locked --target x86_64-unknown-linux-musl --bin koord-webhook
#   docker build -t ghcr.io/koord-webhook/koord-webhook:$(cargo pkgid | cut -d'#' -f2) .
#   (arm64: cargo zigbuild ... --target aarch64-unknown-linux-musl, then
#    --platform linux/arm64 --build-arg TARGET=aarch64-unknown-linux-musl)
FROM scratch
ARG TARGET=x86_64-unknown-linux-musl
COPY target/${TARGET}/release/koord-webhook /koord-webhook
# mimalloc v3 keeps freed pages committed for a second before giving them back; a replica frees and
# allocates all the time (each watch event replaces an object), so that second is part of its steady
# RSS: 125 MiB instead of 132 at the L1 scale state (docs/scale.md). bench/scale.py runs the binary
# with these ENV lines too.
ENV MIMALLOC_PURGE_DELAY=0
# Not root; the Deployment also sets runAsNonRoot and a read-only root filesystem.
USER 65532:65532
EXPOSE 9443
ENTRYPOINT ["/koord-webhook"]
CMD ["serve"]
