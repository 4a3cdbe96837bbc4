# syntax=docker/dockerfile:1
#
# kcl-example-consumer: build with the full Rust toolchain, ship only the binary.
#
#   docker build -t kcl-example-consumer .
#   docker run --rm kcl-example-consumer demo          # no AWS needed
#   docker run --rm -e KCL_STREAM=orders -e KCL_APPLICATION_NAME=orders-app \
#     -e AWS_REGION=eu-west-1 -p 8080:8080 kcl-example-consumer
#
# The runtime image is distroless (glibc, CA certificates, nothing else: no shell, no package
# manager, no compiler) and runs as an unprivileged user. `kcl-example-consumer healthcheck`
# stands in for curl in container health checks.

# Base images, as build arguments so that they can be pinned by digest, e.g.
#   docker buildx imagetools inspect rust:1.95-bookworm          # prints the index digest
#   docker build --build-arg BUILD_IMAGE=rust:1.95-bookworm@sha256:<digest> \
#     --build-arg RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot@sha256:<digest> .
# (or let Renovate/Dependabot keep the defaults below pinned and current). The Rust version
# is at least the workspace's rust-version (1.94.1).
ARG BUILD_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p kcl-example-consumer --features aws \
 && install -D -m 0755 target/release/kcl-example-consumer /out/kcl-example-consumer

FROM ${RUNTIME_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="kcl-example-consumer" \
      org.opencontainers.image.description="A Kinesis consumer on kcl: windowed counts, health, Prometheus metrics, graceful shutdown" \
      org.opencontainers.image.source="https://github.com/kcl-rs/kcl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/kcl-example-consumer /usr/local/bin/kcl-example-consumer
# 65532 = nonroot in distroless; numeric so that runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/kcl-example-consumer", "healthcheck"]
# Exec form: the binary is PID 1 and receives SIGTERM itself.
ENTRYPOINT ["/usr/local/bin/kcl-example-consumer"]
CMD ["run"]
