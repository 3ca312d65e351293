//! The layers of the crate, lowest first, and a test that no module uses
//! one above its own: every `crate::` path in code (comments aside) of
//! every file under `src/` is checked against the table.

use std::path::{Path, PathBuf};

/// Each top-level module and its layer: a module may use those of its own
/// layer number or lower. The edges are ordered too, so that none of them
/// depends on one above it (`cli` uses `daemon`, never the reverse).
const LAYERS: &[(&str, u8)] = &[
    ("support", 0),
    ("store", 1),
    ("oci", 1),
    ("election", 2),
    ("schedule", 2),
    ("runtime", 3),
    ("supervisor", 4),
    ("config", 5),
    ("ops", 6),
    ("daemon", 7),
    ("harness", 7),
    ("cli", 8),
];

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// The top-level module a source file belongs to (`store/kube/mod.rs`:
/// `store`; `supervisor.rs`: `supervisor`).
fn module_of(relative: &Path) -> String {
    let first = relative.components().next().expect("a path");
    let first = first.as_os_str().to_string_lossy();
    first.strip_suffix(".rs").unwrap_or(&first).to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules that a line of code names through `crate::`,
/// in `crate::x::…` paths and in `use crate::{x, y::…}` groups.
fn used_modules(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or_default();
    let mut used = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or_default();
            for item in group.split(',') {
                let name = item.trim().split("::").next().unwrap_or_default();
                used.push(name.trim().to_owned());
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            used.push(name);
        }
    }
    used.retain(|m| !m.is_empty());
    used
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let module = module_of(relative);
        if matches!(
            module.as_str(),
            "lib" | "main" | "layers" | "shape" | "docs_check" | "imports"
        ) {
            continue;
        }
        let own = layer(&module).unwrap_or_else(|| {
            panic!(
                "src/{}: module `{module}` has no layer in LAYERS",
                relative.display()
            )
        });
        let text = std::fs::read_to_string(file).expect("readable");
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for used in used_modules(line) {
                match layer(&used) {
                    Some(l) if l > own => wrong.push(format!(
                        "src/{}:{}: `{module}` (layer {own}) uses `{used}` (layer {l})",
                        relative.display(),
                        n + 1
                    )),
                    _ => {}
                }
            }
        }
    }
    assert!(wrong.is_empty(), "upward uses:\n{}", wrong.join("\n"));
}

#[test]
fn paths_are_read_as_the_modules_they_name() {
    assert_eq!(used_modules("use crate::store::LeaseStore;"), ["store"]);
    assert_eq!(
        used_modules("use crate::{election::Term, support::rounding::human};"),
        ["election", "support"]
    );
    assert_eq!(
        used_modules("let x = 1; // crate::daemon is above"),
        Vec::<String>::new()
    );
    assert_eq!(module_of(Path::new("store/kube/mod.rs")), "store");
    assert_eq!(module_of(Path::new("supervisor.rs")), "supervisor");
}
