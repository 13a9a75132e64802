//! The committed `include/sdpa.h` must be what cbindgen generates from `src/lib.rs`.
//! `SDPA_BLESS_HEADER=1 cargo test -p sdpa-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn committed_header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("config");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_src(crate_dir.join("src/lib.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("utf-8 header");
    let path = crate_dir.join("../include/sdpa.h");
    if std::env::var_os("SDPA_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write header");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/sdpa.h is stale: regenerate it with \
         `SDPA_BLESS_HEADER=1 cargo test -p sdpa-capi --test header` and commit it"
    );
}
