# Build: a static musl binary (rustls + ring, no OpenSSL), then an empty distroless image.
FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl && apt-get update && apt-get install -y --no-install-recommends musl-tools
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY .cargo ./.cargo
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin koord-webhook

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/koord-webhook /usr/local/bin/koord-webhook
USER 65532:65532
EXPOSE 9443
ENTRYPOINT ["/usr/local/bin/koord-webhook"]
CMD ["serve"]
