//! Builds the host versions of stoker's CUDA kernels (`kernels/cu/*.cu` behind a shim for
//! CUDA's built-ins) into this library, for `cuLaunchKernel` to run.

fn main() {
    let manifest = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let cu = manifest.join("../../../kernels/cu");
    println!("cargo:rerun-if-changed=csrc/host_kernels.cpp");
    println!("cargo:rerun-if-changed={}", cu.join("augment.cu").display());
    cc::Build::new()
        .cpp(true)
        .file("csrc/host_kernels.cpp")
        .include(&cu)
        .flag("-std=c++17")
        // The GPU code is built with --fmad=false: no contraction here either.
        .flag("-ffp-contract=off")
        .opt_level(2)
        .warnings(false)
        .compile("stoker_emu_host_kernels");
}
