use pyo3_build_config::{GilUsed, PythonAbiKind, PythonImplementation};

/// The CPython minors whose private layouts `rust/cpython/` reads have been checked (its
/// Rust tests, `cargo test`, run on each: 3.11 and 3.13 in CI, 3.12 by hand). Another minor,
/// a free-threaded build or the stable ABI gets the public-API fallback only: the reads are
/// not compiled at all.
const VERIFIED_MINORS: std::ops::RangeInclusive<u8> = 11..=13;

/// Set (to anything but empty or `0`), the reads are left out on any interpreter, as on an
/// unverified one: how CI builds and checks that variant.
const LEAVE_OUT: &str = "TREECLONE_WITHOUT_CPYTHON_INTERNALS";

fn main() {
    // Emits the `Py_3_x` cfgs for the interpreter being built against.
    pyo3_build_config::use_pyo3_cfgs();
    let config = pyo3_build_config::get();
    let version = config.version();
    // Version-specific, with the GIL: the layouts of the stable ABI or a free-threaded build
    // are other ones.
    let abi = config.target_abi().kind();
    let verified = config.implementation() == PythonImplementation::CPython
        && version.major == 3
        && VERIFIED_MINORS.contains(&version.minor)
        && abi == PythonAbiKind::VersionSpecific(GilUsed::GilEnabled);
    println!("cargo::rerun-if-env-changed={LEAVE_OUT}");
    let left_out = std::env::var(LEAVE_OUT).is_ok_and(|v| !v.is_empty() && v != "0");
    println!("cargo::rustc-check-cfg=cfg(cpython_layouts)");
    if verified && !left_out {
        println!("cargo::rustc-cfg=cpython_layouts");
    }
    // The interpreter built for, as `rust/cpython/` names it when the layouts are off.
    let flavour = if config.is_free_threaded() { "t" } else { "" };
    println!(
        "cargo::rustc-env=TREECLONE_BUILT_FOR={}.{}{}",
        version.major, version.minor, flavour
    );
}
