use which::which;

/// Building this crate needs the `bpf-linker` binary, which cargo cannot express as a dependency.
/// Rebuild when it changes; fail with a hint when it is missing.
fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(_) => {
            println!("cargo:warning=bpf-linker not found in PATH: run `cargo xtask setup`");
        }
    }
}
