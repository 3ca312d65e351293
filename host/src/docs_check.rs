//! The docs checked against the repository, by test: every path they name
//! exists, and every term of art a module doc uses is in the glossary.
//! Each failure is printed with its file.
//!
//! **Paths.** Read: `README.md`, `CONTRIBUTING.md` and each `.md` under
//! `docs/` but `docs/design/` (notes of a plan, naming files it meant to
//! make; nor `CHANGELOG.md`: history names what was), fenced code blocks
//! aside; and the `#` lines of `Cargo.toml` and `host/Cargo.toml`.
//!
//! - A markdown link's target, unless a URL, must resolve against the
//!   doc's folder, and its anchor (`#…`) be a heading there (GitHub's
//!   slugs).
//! - Each word of a code span (of a `#` line, each word), stripped of
//!   quotes, brackets, end punctuation, a `:line` or a `::item`, is a path
//!   if made only of letters, digits and `._-/`, and either ending in one
//!   of [`EXTENSIONS`] or holding a `/` after a first component that a
//!   file or folder of the repository is named (not `baton.dev/role`,
//!   `HTTP/1.1`). Not paths: words starting with `/`, `~`, `$` or `-` (the
//!   machine's, variables, options); the operator's files named bare
//!   ([`OPERATOR_FILES`]: `run.toml`); anything in a [`BUILD_OUTPUT`]
//!   folder; the embedded store's run-time names ([`runtime_name`]); and
//!   [`NOT_IN_REPO`], each with its reason.
//! - A path exists if it resolves against the repository, `host/src/`,
//!   `host/` or the doc's folder; or, written with a folder, if a
//!   repository path ends with it (`kube/gate.rs`, beside its context);
//!   or, written bare (`reads.rs`), if a repository file is so named.
//!
//! **Glossary.** Its terms are the first cells of the table under
//! `## Glossary` in `docs/architecture.md`, split at commas. A module doc
//! (`//!`) of a file under `src/` that writes a term in italics (`*term*`,
//! `_term_`: words only, two letters or more, so not `*T*` nor `*n + 1*`)
//! must find it there, case aside, with or without an `s` at the end; and
//! each of [`COINED`], the words the code coins, must be there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The endings that make a word a path, with or without a `/`.
const EXTENSIONS: &[&str] = &[
    ".rs", ".md", ".sh", ".toml", ".wit", ".json", ".yaml", ".yml", ".go", ".py", ".js", ".c", ".svg",
];

/// The endings of the operator's own files: written bare (`run.toml`,
/// `config.json`), such a name is not taken for a repository file.
const OPERATOR_FILES: &[&str] = &[".toml", ".json", ".yaml", ".yml"];

/// Words that look like repository paths but name something else.
const NOT_IN_REPO: &[(&str, &str)] = &[(
    "poll_loop.py",
    "componentize-py's asyncio helpers for wasi:http, which docs/guests/python.md says not to use",
)];

/// Folders a build makes (cargo's, and `wit-bindgen c`'s in a C guest),
/// never committed.
const BUILD_OUTPUT: &[&str] = &["target", "gen"];

/// The words the code coins for its own ideas, each a glossary entry.
const COINED: &[&str] = &[
    "floor",
    "gate",
    "shed",
    "read ahead",
    "steered",
    "unsettled",
    "admission",
];

/// The repository: the folder above this crate's.
fn repo() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().expect("host/ is in the repository").to_owned()
}

/// What the index of the repository leaves out: git's folder, and what
/// `.gitignore` names (cargo's `target`, the demo's `.baton`).
const NOT_INDEXED: &[&str] = &[".git", "target", ".baton"];

/// Every file and folder of the repository, relative, `/`-separated
/// ([`NOT_INDEXED`] aside).
fn index(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("the repository is readable") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if NOT_INDEXED.contains(&name.as_ref()) {
            continue;
        }
        let relative = path.strip_prefix(root).expect("under the root");
        out.push(relative.to_string_lossy().replace('\\', "/"));
        if path.is_dir() {
            index(root, &path, out);
        }
    }
}

/// The repository as the path rules see it.
struct Repo {
    root: PathBuf,
    paths: Vec<String>,
    names: BTreeSet<String>,
}

impl Repo {
    fn new(root: PathBuf) -> Repo {
        let mut paths = Vec::new();
        index(&root, &root, &mut paths);
        let names = paths
            .iter()
            .map(|p| p.rsplit('/').next().unwrap_or_default().to_owned())
            .collect();
        Repo { root, paths, names }
    }

    /// Whether `word` (a path by [`path_in`]) names something of the
    /// repository, from a doc in folder `here` (relative).
    fn has(&self, word: &str, here: &str) -> bool {
        let trimmed = word.trim_end_matches('/');
        let here = if here.is_empty() {
            String::new()
        } else {
            format!("{here}/")
        };
        let bases = ["", "host/src/", "host/", &here];
        if bases
            .iter()
            .any(|b| self.root.join(format!("{b}{trimmed}")).exists())
        {
            return true;
        }
        if trimmed.contains('/') {
            let tail = format!("/{}", trimmed.trim_start_matches("./"));
            self.paths.iter().any(|p| p.ends_with(&tail))
        } else {
            self.names.contains(trimmed)
        }
    }
}

/// `word` as a repository path, if the rules of the module doc make it one.
fn path_in(word: &str, names: &BTreeSet<String>) -> Option<String> {
    let word = word.trim_start_matches(|c: char| "\"'([{<`".contains(c));
    let word = word.trim_end_matches(|c: char| "\"')]}>`,;.:!?".contains(c));
    let word = word.split("::").next().unwrap_or_default();
    let word = match word.rsplit_once(':') {
        Some((path, line)) if line.chars().all(|c| c.is_ascii_digit()) => path,
        _ => word,
    };
    if word.is_empty() || word.starts_with(['/', '~', '$', '-']) {
        return None;
    }
    if !word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
    {
        return None;
    }
    let word = word.trim_start_matches("./");
    let first = word.split('/').next().unwrap_or_default();
    let is_path = EXTENSIONS.iter().any(|e| word.ends_with(e))
        || (word.contains('/') && (first == ".." || names.contains(first)));
    let bare_operator_file = !word.contains('/') && OPERATOR_FILES.iter().any(|e| word.ends_with(e));
    let built = word
        .rsplit_once('/')
        .is_some_and(|(dir, _)| dir.split('/').any(|c| BUILD_OUTPUT.contains(&c)));
    if !is_path || bare_operator_file || built || runtime_name(word) {
        return None;
    }
    if NOT_IN_REPO.iter().any(|(w, _)| *w == word) {
        return None;
    }
    Some(word.to_owned())
}

/// Whether `word` names a file the embedded store makes at run time: a
/// lease's folder (`demo.lease/`) or its record before versions
/// (`demo.lease.json`), its term marks (`.demo.terms/`), a numbered
/// version (`00000000000000000042.json`), its buckets' database
/// (`buckets/buckets.sqlite3`).
fn runtime_name(word: &str) -> bool {
    word.split('/').any(|c| {
        let stem = c.strip_suffix(".json").unwrap_or(c);
        stem.ends_with(".lease")
            || (c.starts_with('.') && c.ends_with(".terms"))
            || (!stem.is_empty() && stem.chars().all(|d| d.is_ascii_digit()))
            || c == "buckets.sqlite3"
    })
}

/// The code spans of `line` (their contents) and the line with them blanked.
fn code_spans(line: &str) -> (Vec<String>, String) {
    let chars: Vec<char> = line.chars().collect();
    let (mut spans, mut prose) = (Vec::new(), String::new());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            prose.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        let mut j = i + run;
        let close = loop {
            if j >= chars.len() {
                break None;
            }
            let n = chars[j..].iter().take_while(|c| **c == '`').count();
            if n == run {
                break Some(j);
            }
            j += n.max(1);
        };
        match close {
            Some(end) => {
                spans.push(chars[i + run..end].iter().collect::<String>().trim().to_owned());
                prose.extend(std::iter::repeat_n(' ', end + run - i));
                i = end + run;
            }
            None => {
                prose.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    (spans, prose)
}

/// The targets of the markdown links in `prose` (code spans blanked).
fn link_targets(prose: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in prose.match_indices("](") {
        let rest = &prose[at + 2..];
        let Some(end) = rest.find(')') else { continue };
        let target = rest[..end].split_whitespace().next().unwrap_or_default();
        out.push(target.trim_matches(['<', '>']).to_owned());
    }
    out
}

/// The anchors of a markdown document's headings, as GitHub makes them:
/// lower case, only letters, digits, `-` and `_`, spaces as `-`, and
/// `-1`, `-2` after a repeated one.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~") {
            fenced = !fenced;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if fenced || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let slug: String = line[hashes..]
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

/// The markdown files whose paths are checked, relative to the repository.
fn docs(repo: &Repo) -> Vec<String> {
    let mut out: Vec<String> = repo
        .paths
        .iter()
        .filter(|p| p.starts_with("docs/") && !p.starts_with("docs/design/") && p.ends_with(".md"))
        .cloned()
        .collect();
    out.sort();
    out.splice(0..0, ["README.md".to_owned(), "CONTRIBUTING.md".to_owned()]);
    out
}

/// What is wrong with a markdown link of `doc` (in folder `here`) to `target`.
fn check_link(repo: &Repo, doc: &str, here: &str, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
        return None;
    }
    let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
    let relative = if file.is_empty() {
        doc.to_owned()
    } else {
        normalise(&format!("{here}/{file}"))
    };
    let path = repo.root.join(&relative);
    if !path.exists() {
        return Some(format!("link `{target}`: no {relative}"));
    }
    if anchor.is_empty() || !relative.ends_with(".md") {
        return None;
    }
    let text = std::fs::read_to_string(&path).expect("readable");
    (!anchors(&text).contains(anchor)).then(|| format!("link `{target}`: no heading #{anchor} in {relative}"))
}

/// `path` with its `.` and `..` components resolved (`docs/../x` is `x`).
fn normalise(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    parts.join("/")
}

/// What is wrong with the paths of one markdown document.
fn doc_failures(repo: &Repo, doc: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo.root.join(doc)).expect("readable");
    let here = doc.rsplit_once('/').map_or("", |(d, _)| d);
    let mut wrong = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let (spans, prose) = code_spans(line);
        for target in link_targets(&prose) {
            if let Some(why) = check_link(repo, doc, here, &target) {
                wrong.push(format!("{doc}:{}: {why}", n + 1));
            }
        }
        for word in spans.iter().flat_map(|s| s.split_whitespace()) {
            match path_in(word, &repo.names) {
                Some(path) if !repo.has(&path, here) => {
                    wrong.push(format!("{doc}:{}: `{path}` does not exist", n + 1));
                }
                _ => {}
            }
        }
    }
    wrong
}

/// What is wrong with the paths of the `#` lines of a `Cargo.toml`.
fn manifest_failures(repo: &Repo, manifest: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo.root.join(manifest)).expect("readable");
    let here = manifest.rsplit_once('/').map_or("", |(d, _)| d);
    let mut wrong = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(comment) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        for word in comment.split_whitespace() {
            match path_in(word, &repo.names) {
                Some(path) if !repo.has(&path, here) => {
                    wrong.push(format!("{manifest}:{}: `{path}` does not exist", n + 1));
                }
                _ => {}
            }
        }
    }
    wrong
}

/// The glossary's terms, lower case.
fn glossary(architecture: &str) -> Vec<String> {
    let section = architecture
        .split("\n## ")
        .find(|s| s.starts_with("Glossary"))
        .expect("docs/architecture.md has a ## Glossary");
    let mut terms = Vec::new();
    for row in section.lines().filter(|l| l.starts_with('|')).skip(2) {
        let first = row.split('|').nth(1).unwrap_or_default();
        terms.extend(
            first
                .split(',')
                .map(|t| t.trim().to_lowercase())
                .filter(|t| !t.is_empty()),
        );
    }
    terms
}

/// Whether `term` is one of `terms`, case aside, with or without an `s`.
fn in_glossary(term: &str, terms: &[String]) -> bool {
    let term = term.to_lowercase();
    let term = term.split_whitespace().collect::<Vec<_>>().join(" ");
    terms
        .iter()
        .any(|t| *t == term || format!("{t}s") == term || format!("{term}s") == *t)
}

/// The terms `text` (a module doc, code spans blanked) writes in italics.
fn italics(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '*' && chars.get(i + 1) == Some(&'*') {
            i += 2;
            continue;
        }
        let before = i.checked_sub(1).map(|b| chars[b]);
        let opens = (c == '*' || c == '_')
            && !before.is_some_and(|b| b.is_alphanumeric() || b == c)
            && chars.get(i + 1).is_some_and(|n| !n.is_whitespace());
        if !opens {
            i += 1;
            continue;
        }
        let close = (i + 1..chars.len()).find(|&j| {
            chars[j] == c
                && !chars[j - 1].is_whitespace()
                && chars.get(j + 1) != Some(&c)
                && !(c == '_' && chars.get(j + 1).is_some_and(|n| n.is_alphanumeric()))
        });
        let Some(end) = close else {
            i += 1;
            continue;
        };
        let span: String = chars[i + 1..end].iter().collect();
        let span = span.split_whitespace().collect::<Vec<_>>().join(" ");
        let words = span.chars().all(|x| x.is_alphabetic() || " -'".contains(x));
        if words && span.chars().filter(|x| x.is_alphabetic()).count() >= 2 {
            out.push(span);
        }
        i = end + 1;
    }
    out
}

/// A file's module doc, its `//!` prefixes taken off, code spans and link
/// targets blanked.
fn module_doc(text: &str) -> String {
    let mut doc = String::new();
    for line in text.lines().take_while(|l| l.starts_with("//!")) {
        let (_, prose) = code_spans(&line["//!".len()..]);
        doc.push_str(&prose);
        doc.push('\n');
    }
    let mut out = String::new();
    let mut rest = doc.as_str();
    while let Some(at) = rest.find("](") {
        out.push_str(&rest[..at + 1]);
        rest = &rest[at + 2..];
        rest = rest.find(')').map_or("", |end| &rest[end + 1..]);
    }
    out.push_str(rest);
    out
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

#[test]
fn every_path_the_docs_name_exists() {
    let repo = Repo::new(repo());
    let mut wrong = Vec::new();
    for doc in docs(&repo) {
        wrong.extend(doc_failures(&repo, &doc));
    }
    for manifest in ["Cargo.toml", "host/Cargo.toml"] {
        wrong.extend(manifest_failures(&repo, manifest));
    }
    assert!(
        wrong.is_empty(),
        "{} paths not found:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn every_term_a_module_doc_italicises_is_in_the_glossary() {
    let root = repo();
    let architecture = std::fs::read_to_string(root.join("docs/architecture.md")).expect("readable");
    let terms = glossary(&architecture);
    let src = root.join("host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable");
        let relative = file.strip_prefix(&root).expect("under the root").display();
        for term in italics(&module_doc(&text)) {
            if !in_glossary(&term, &terms) {
                wrong.push(format!("{relative}: *{term}* is not in the glossary"));
            }
        }
    }
    for word in COINED {
        if !in_glossary(word, &terms) {
            wrong.push(format!(
                "docs/architecture.md: the coined word `{word}` has no glossary entry"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} terms not in docs/architecture.md's ## Glossary:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn words_are_paths_by_the_rules() {
    let names: BTreeSet<String> = ["tests", "store", "scripts"].map(String::from).into();
    let path = |w: &str| path_in(w, &names);
    assert_eq!(path("scripts/test.sh"), Some("scripts/test.sh".into()));
    assert_eq!(path("(runtime/http.rs),"), Some("runtime/http.rs".into()));
    assert_eq!(path("tests/kube"), Some("tests/kube".into()));
    assert_eq!(path("reads.rs"), Some("reads.rs".into()));
    assert_eq!(path("election/term.rs:42"), Some("election/term.rs".into()));
    assert_eq!(
        path("tests/e2e/terms.rs::one_leader"),
        Some("tests/e2e/terms.rs".into())
    );
    for not in [
        "baton.dev/role",
        "HTTP/1.1",
        "wasi:config/store",
        "https://example.com/x.md",
        "/etc/baton/baton.toml",
        "~/.cache/baton",
        "$BATON_CACHE/kube/run/env.sh",
        "examples/*",
        "target/debug/baton",
        "demo.lease/00000000000000000042.json",
        ".demo.terms/",
        "PLUGIN.wasm",
        "run.toml",
        "gen/plugin.c",
        "examples/c-kv-counter/gen/plugin.h",
        "demo.lease.json",
        "<lease>.md",
    ] {
        assert_eq!(path(not), None, "{not}");
    }
}

#[test]
fn markdown_is_read_as_github_renders_it() {
    let (spans, prose) = code_spans("see `a.rs` and ``b`c`` [x](y.md#z)");
    assert_eq!(spans, ["a.rs", "b`c"]);
    assert_eq!(link_targets(&prose), ["y.md#z"]);
    let slugs = anchors("# Top\n## The live hosts (0.2.0)\n```\n# not\n```\n## Top\n");
    let want: BTreeSet<String> = ["top", "the-live-hosts-020", "top-1"].map(String::from).into();
    assert_eq!(slugs, want);
    assert_eq!(normalise("docs/guests/../../examples/a.py"), "examples/a.py");
}

#[test]
fn italics_are_terms_and_terms_match_the_glossary() {
    let doc = module_doc(
        "//! a *term floor*, **bold**, `*code*`, *T*, *n + 1*, lead_until_x,\n//! _shed_ and *read\n//! ahead*; [x](a_b_c)\nuse x;\n",
    );
    assert_eq!(italics(&doc), ["term floor", "shed", "read ahead"]);
    let terms =
        glossary("# A\n## Glossary\n\n| Term | Meaning |\n|---|---|\n| claim, floor | x |\n## Next\n");
    assert_eq!(terms, ["claim", "floor"]);
    assert!(in_glossary("Claims", &terms) && in_glossary("floor", &terms));
    assert!(!in_glossary("gate", &terms));
}
