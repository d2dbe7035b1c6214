//! Embeds `hw_specs/*.toml`, `models/*.json` and `calibration/**/*.{json,toml,json.gz}` into the
//! binary, so the CLI works from any directory with no flags. The fitted model sets are stored
//! gzipped (a quarter of the JSON's size, in the binary and in git history) and embedded as bytes.
use std::fs;
use std::path::Path;

/// Writes `pub static NAME: &[(&str, &T)]` over the files under `dir` whose names end in one of
/// `exts`, each through `include_macro` (`include_str` or `include_bytes`).
fn embed(dir: &str, exts: &[&str], const_name: &str, include_macro: &str, out: &mut String) {
    // Read when the script runs, not when it was compiled: a build-script binary reused from
    // another checkout (a shared target dir) must embed this checkout's files.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR for build scripts");
    let root = Path::new(&manifest_dir);
    let mut files = Vec::new();
    collect(&root.join(dir), exts, &mut files);
    files.sort();
    out.push_str(&format!("/// Embedded files under `{dir}/`: (path relative to it, contents).\n"));
    let ty = if include_macro == "include_bytes" { "&[u8]" } else { "&str" };
    out.push_str(&format!("pub static {const_name}: &[(&str, {ty})] = &[\n"));
    for f in files {
        let rel = f.strip_prefix(root.join(dir)).unwrap().to_string_lossy().replace('\\', "/");
        out.push_str(&format!("    ({rel:?}, {include_macro}!({:?})),\n", f.to_string_lossy()));
    }
    out.push_str("];\n");
    println!("cargo:rerun-if-changed={dir}");
}

fn collect(dir: &Path, exts: &[&str], files: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            // Traces and raw measurements are large and are read from disk, not embedded.
            if p.file_name().map(|n| n == "traces").unwrap_or(false) {
                continue;
            }
            println!("cargo:rerun-if-changed={}", p.display());
            collect(&p, exts, files);
        } else if exts.iter().any(|x| p.file_name().map(|n| n.to_string_lossy().ends_with(&format!(".{x}"))).unwrap_or(false)) {
            files.push(p);
        }
    }
}

fn main() {
    let out_dir = std::env::var("OUT_DIR").unwrap();
    let mut hw = String::new();
    embed("hw_specs", &["toml"], "EMBEDDED_HW_SPECS", "include_str", &mut hw);
    fs::write(Path::new(&out_dir).join("embedded_hw_specs.rs"), hw).unwrap();
    let mut models = String::new();
    embed("models", &["json"], "EMBEDDED_MODELS", "include_str", &mut models);
    fs::write(Path::new(&out_dir).join("embedded_models.rs"), models).unwrap();
    let mut cal = String::new();
    embed("calibration", &["json", "toml"], "EMBEDDED_CALIBRATION", "include_str", &mut cal);
    embed("calibration", &["json.gz"], "EMBEDDED_CALIBRATION_GZ", "include_bytes", &mut cal);
    fs::write(Path::new(&out_dir).join("embedded_calibration.rs"), cal).unwrap();
}
