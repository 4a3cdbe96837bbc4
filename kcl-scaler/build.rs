//! Generates the `ExternalScaler` service (server and a client without transport) from
//! KEDA's `externalscaler.proto`, compiled in Rust by protox: no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/externalscaler.proto");
    let descriptors = protox::compile(["externalscaler.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
