//! Rebuilds the object when bpf-linker changes (aya-template's build script).
use which::which;

fn main() {
    let bpf_linker =
        which("bpf-linker").expect("bpf-linker not found on PATH: run `cargo xtask setup`");
    println!(
        "cargo:rerun-if-changed={}",
        bpf_linker.to_str().expect("bpf-linker path is not UTF-8")
    );
}
