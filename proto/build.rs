//! Compiles the .proto files with protox (pure Rust, no protoc) and generates tonic code.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/brain/jobmaster/v1/jobmaster.proto",
        "proto/brain/service/v1/brain.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
