//! The size limits of the crate's production code, checked by test:
//!
//! - a file has at most [`FILE_LINES`] lines;
//! - a module doc (`//!`) has at most [`MODULE_DOC_LINES`] lines: the
//!   module's job and its invariants; the rest belongs in `docs/`.
//!
//! A function's length is clippy's `too_many_lines` (the workspace's lints
//! in `Cargo.toml`, the threshold in `clippy.toml`). Unit tests live in
//! `tests.rs` files and are not counted.

use std::path::{Path, PathBuf};

/// The most lines a production source file may have.
const FILE_LINES: usize = 800;
/// The most lines a module doc may have.
const MODULE_DOC_LINES: usize = 40;

/// The production source files under `dir`: every `.rs` file but the unit
/// tests' (`tests.rs`).
fn production_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            production_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
            out.push(path);
        }
    }
}

/// The lines of the module doc that opens `text`.
fn module_doc_lines(text: &str) -> usize {
    text.lines().take_while(|l| l.starts_with("//!")).count()
}

/// What breaks a limit, one line each, with the file and the figure.
fn over_limits(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    production_files(src, &mut files);
    files.sort();
    let mut over = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(src).expect("under src/").display();
        let text = std::fs::read_to_string(file).expect("readable");
        let lines = text.lines().count();
        if lines > FILE_LINES {
            over.push(format!("src/{relative}: {lines} lines (at most {FILE_LINES})"));
        }
        let doc = module_doc_lines(&text);
        if doc > MODULE_DOC_LINES {
            over.push(format!(
                "src/{relative}: a module doc of {doc} lines (at most {MODULE_DOC_LINES})"
            ));
        }
    }
    over
}

#[test]
fn production_files_and_module_docs_stay_within_their_limits() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let over = over_limits(&src);
    assert!(over.is_empty(), "over the limits:\n{}", over.join("\n"));
}

#[test]
fn a_module_doc_ends_at_its_first_other_line() {
    assert_eq!(module_doc_lines("//! one\n//!\n//! two\n\nuse x;\n//! not"), 3);
    assert_eq!(module_doc_lines("use x;\n"), 0);
}
