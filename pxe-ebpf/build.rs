//! Rebuilds the object when bpf-linker changes (aya-template's build script)
//! and gives the linker the code generation flags the program needs.
use which::which;

fn main() {
    let bpf_linker =
        which("bpf-linker").expect("bpf-linker not found on PATH: run `cargo xtask setup`");
    println!(
        "cargo:rerun-if-changed={}",
        bpf_linker.to_str().expect("bpf-linker path is not UTF-8")
    );
    // Word loads and stores at any address: the reply is copied into the
    // frame eight bytes at a time, at offsets no alignment can be promised
    // for. Without this LLVM splits every unaligned word into bytes. The
    // kernel allows unaligned packet and map access on the architectures
    // with efficient unaligned access (x86-64, arm64).
    println!("cargo:rustc-link-arg=--cpu-features=+allows-misaligned-mem-access");
}
