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

ARG RUST_VERSION=1

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p kcl-example-consumer --features aws \
 && install -D -m 0755 target/release/kcl-example-consumer /out/kcl-example-consumer

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /out/kcl-example-consumer /usr/local/bin/kcl-example-consumer
# 65532 = nonroot in distroless; numeric so that runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/kcl-example-consumer", "healthcheck"]
# Exec form: the binary is PID 1 and receives SIGTERM itself.
ENTRYPOINT ["/usr/local/bin/kcl-example-consumer"]
CMD ["run"]
