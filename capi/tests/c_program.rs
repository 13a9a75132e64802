//! Compiles `tests/c/capi_test.c` with the system C compiler (`$CC`, else `cc`) against the
//! committed header and this crate's static library, runs it, and requires exit status 0.
//! The C program checks GQA causal attention with LSE on ggml-like strided tensors against a
//! double-precision loop and against the f64 reference through the C API, bad inputs (status and
//! message), one-thread determinism, a split-KV merge, the element types, paged and varlen
//! calls, a plan run for two layers and the float/half conversions.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The static library cargo built for this test run: next to the test binary in
/// `target/<profile>/deps/`, or uplifted to `target/<profile>/`.
fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("test binary directory");
    let candidates = [
        deps.to_path_buf(),
        deps.parent().unwrap_or(deps).to_path_buf(),
    ];
    candidates
        .iter()
        .map(|dir| dir.join("libsdpa_capi.a"))
        .find(|lib| lib.exists())
        .unwrap_or_else(|| panic!("libsdpa_capi.a not found in {candidates:?}"))
}

#[test]
#[cfg(unix)]
fn c_program_passes() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = static_lib();
    let out_dir = lib.parent().expect("lib dir").join("capi-c-test");
    std::fs::create_dir_all(&out_dir).expect("create output dir");
    let exe = out_dir.join("capi_test");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut cmd = Command::new(&cc);
    cmd.args([
        "-std=c99",
        "-O1",
        "-Wall",
        "-Wextra",
        "-pedantic",
        "-Werror",
    ])
    .arg("-I")
    .arg(crate_dir.join("../include"))
    .arg(crate_dir.join("tests/c/capi_test.c"))
    .arg(&lib)
    .arg("-o")
    .arg(&exe)
    .args(["-lpthread", "-ldl", "-lm"]);
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(status.success(), "compiling the C test failed: {cmd:?}");
    let output = Command::new(&exe).output().expect("run the C test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "C test failed:\n{text}");
    assert!(text.contains("all checks passed"), "{text}");
}
