//! The files of `src/`, the arrows between them (file A names a path
//! into file B), and a test that no files import each other in a circle.
//!
//! **Files.** Every `.rs` file under `src/` but the unit tests': files
//! named `tests.rs`, files under a `tests/` folder, and the block of an
//! inline module declared right after `#[cfg(test)]` (the trailing
//! `mod tests { … }`). A file holds the module its path names
//! (`runtime/capability/http.rs`: `runtime::capability::http`;
//! `store/kube/mod.rs`: `store::kube`; `lib.rs` and `main.rs`: the root)
//! and each inline module written in it (`pub mod bindings { … }`).
//!
//! **Arrows.** Comments and string and character literals aside, a file
//! has an arrow to another for each path it names: every leaf of a `use`
//! declaration (`pub use` too, groups nested or not, `self`, globs), and
//! every path in code that starts with `crate::`, `super::`, `self::` or
//! a name bound to a module (a child module, a module that a `use` of the
//! same scope named or that one of its globs brings in). A path is read
//! from the module it is written in (`super::Foo` in
//! `runtime/plugin/task.rs` is `runtime::plugin::Foo`), and lands in the
//! file of its longest prefix that is a module:
//! `crate::runtime::fence::connections::Connections` in
//! `runtime/fence/connections.rs`. In `main.rs`, a crate of its own,
//! `baton::` is the library's root.
//!
//! Not arrows: `mod x;` (a parent declaring its child), a file naming
//! itself, `pub(in …)` visibilities, paths into other crates (`std::`,
//! `tokio::`, `::x`), and names this reading cannot bind (`Kind::A` of a
//! local enum; a name a glob brings in that is not a module).
//!
//! A module's arrows into its own sections (the files of its folder) are
//! not counted: a module and its sections are one unit, which may use its
//! sections (`pub use child::X`) while they use it (`use super::Y`). The
//! crate root's arrows all count.
//!
//! **Rule.** The arrows form no circle: no strongly connected component
//! (Tarjan's algorithm) holds more than one file, so siblings never use
//! each other both ways and no folder uses another that uses it back.
//! Each circle is printed with its files and, for each arrow between
//! them, the line that made it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The library's name, by which `main.rs` reaches its root.
const CRATE: &str = "baton";

/// A word of code: a name or a keyword (`r#` aside), or a number.
fn is_word(text: &str) -> bool {
    text.starts_with(|c: char| c.is_alphanumeric() || c == '_')
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with its comments and its string and character literals
/// blanked, newlines kept (lines keep their numbers).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let end = literal_end(&c, i);
        if end == i {
            out.push(c[i]);
            i += 1;
            continue;
        }
        out.extend(c[i..end].iter().map(|&x| if x == '\n' { '\n' } else { ' ' }));
        i = end;
    }
    out
}

/// Where the comment or literal that starts at `i` ends (`i` if none
/// starts there). A `'` is a character literal only if closed two
/// characters on (`'a'`) or escaped (`'\n'`): `'a` is a lifetime.
fn literal_end(c: &[char], i: usize) -> usize {
    let at = |j: usize| c.get(j).copied().unwrap_or('\0');
    let starts_word = |j: usize| j == 0 || !is_ident_char(c[j - 1]);
    match (c[i], at(i + 1)) {
        ('/', '/') => (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len()),
        ('/', '*') => block_comment_end(c, i),
        ('"', _) => quoted_end(c, i + 1, '"'),
        ('\'', '\\') => quoted_end(c, i + 1, '\''),
        ('\'', _) if at(i + 2) == '\'' => i + 3,
        ('r', '"' | '#') if starts_word(i) || (i > 0 && c[i - 1] == 'b' && starts_word(i - 1)) => {
            raw_end(c, i)
        }
        _ => i,
    }
}

/// The end of a block comment starting at `i`, nested ones included.
fn block_comment_end(c: &[char], i: usize) -> usize {
    let (mut depth, mut j) = (0, i);
    while j + 1 < c.len() {
        match (c[j], c[j + 1]) {
            ('/', '*') => (depth, j) = (depth + 1, j + 2),
            ('*', '/') => {
                (depth, j) = (depth - 1, j + 2);
                if depth == 0 {
                    return j;
                }
            }
            _ => j += 1,
        }
    }
    c.len()
}

/// The end of a literal whose body starts at `j` and is closed by
/// `quote`, backslash escapes skipped.
fn quoted_end(c: &[char], mut j: usize, quote: char) -> usize {
    while j < c.len() {
        match c[j] {
            '\\' => j += 2,
            x if x == quote => return j + 1,
            _ => j += 1,
        }
    }
    c.len()
}

/// The end of a raw string `r#"…"#` starting at `i` (`i` if it is a raw
/// identifier, `r#for`).
fn raw_end(c: &[char], i: usize) -> usize {
    let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
    let open = i + 1 + hashes;
    if c.get(open) != Some(&'"') {
        return i;
    }
    let closes = |j: usize| {
        c.get(j + 1..j + 1 + hashes)
            .is_some_and(|s| s.iter().all(|&x| x == '#'))
    };
    (open + 1..c.len())
        .find(|&j| c[j] == '"' && closes(j))
        .map_or(c.len(), |j| j + 1 + hashes)
}

/// A token of code: a word, `::`, or one other character.
struct Token {
    text: String,
    line: usize,
}

fn tokens(code: &str) -> Vec<Token> {
    let c: Vec<char> = code.chars().collect();
    let (mut out, mut line, mut i) = (Vec::new(), 1, 0);
    while i < c.len() {
        let start = i;
        if c[i] == '\n' {
            line += 1;
        }
        if c[i].is_whitespace() {
            i += 1;
            continue;
        }
        if is_ident_char(c[i]) {
            while i < c.len() && is_ident_char(c[i]) {
                i += 1;
            }
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            i += 1;
        }
        let text = c[start..i].iter().collect();
        out.push(Token { text, line });
    }
    out
}

/// The text of token `i`, `""` past the end.
fn word(t: &[Token], i: usize) -> &str {
    t.get(i).map_or("", |t| t.text.as_str())
}

/// What a path written in a file is.
#[derive(Debug, PartialEq)]
enum Kind {
    /// A path in code.
    Inline,
    /// A leaf of a `use`, with the name it binds.
    Use(String),
    /// A glob leaf of a `use` (`x::*`): the path is the module globbed.
    Glob,
}

/// A path a file names, as written: the inline modules it is written
/// in (relative to the file's module), its words, its line.
#[derive(Debug, PartialEq)]
struct Named {
    scope: Vec<String>,
    path: Vec<String>,
    line: usize,
    kind: Kind,
}

/// What one file holds: the paths it names, and its inline modules
/// (relative to the file's module).
#[derive(Default)]
struct Scan {
    named: Vec<Named>,
    inline: Vec<Vec<String>>,
}

/// The paths `code` (comments and literals blanked) names, and its inline
/// modules; the block of a module declared after `#[cfg(test)]` skipped.
fn scan(code: &str) -> Scan {
    let t = tokens(code);
    let mut scan = Scan::default();
    // The inline modules open here, each with the depth of its `{`.
    let mut open: Vec<(String, usize)> = Vec::new();
    let (mut depth, mut i) = (0, 0);
    while i < t.len() {
        let scope: Vec<String> = open.iter().map(|(m, _)| m.clone()).collect();
        match word(&t, i) {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if open.last().is_some_and(|(_, d)| *d == depth) {
                    open.pop();
                }
            }
            "#" if is_test_module(&t, i) => {
                i = block_end(&t, i);
                continue;
            }
            "pub" if word(&t, i + 1) == "(" && word(&t, i + 2) == "in" => {
                i = (i..t.len()).find(|&j| word(&t, j) == ")").unwrap_or(t.len());
            }
            "mod" if word(&t, i + 2) == "{" => {
                let name = word(&t, i + 1).to_owned();
                let mut inline = scope.clone();
                inline.push(name.clone());
                scan.inline.push(inline);
                open.push((name, depth));
            }
            "use" => {
                i += 1;
                use_tree(&t, &mut i, &[], &scope, &mut scan.named);
                continue;
            }
            w if is_word(w)
                && word(&t, i + 1) == "::"
                && !matches!(word(&t, i.wrapping_sub(1)), "::" | ".") =>
            {
                let (path, next) = inline_path(&t, i);
                let line = t[i].line;
                scan.named.push(Named {
                    scope,
                    path,
                    line,
                    kind: Kind::Inline,
                });
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

/// Whether token `i` starts `#[cfg(test)]` followed by `mod name {`.
fn is_test_module(t: &[Token], i: usize) -> bool {
    let attribute = ["#", "[", "cfg", "(", "test", ")", "]"];
    attribute.iter().enumerate().all(|(k, w)| word(t, i + k) == *w)
        && word(t, i + 7) == "mod"
        && word(t, i + 9) == "{"
}

/// The token after the `}` that closes the first `{` from `i`.
fn block_end(t: &[Token], i: usize) -> usize {
    let mut depth = 0;
    for (j, token) in t.iter().enumerate().skip(i) {
        match token.text.as_str() {
            "{" => depth += 1,
            "}" if depth == 1 => return j + 1,
            "}" => depth -= 1,
            _ => {}
        }
    }
    t.len()
}

/// The words of the path in code that starts at `i` (`a::b::c`, up to
/// generics or anything else), and the token after it.
fn inline_path(t: &[Token], i: usize) -> (Vec<String>, usize) {
    let mut path = vec![t[i].text.clone()];
    let mut j = i + 1;
    while word(t, j) == "::" && is_word(word(t, j + 1)) {
        path.push(t[j + 1].text.clone());
        j += 2;
    }
    (path, j)
}

/// Reads one use tree from `i` (past it on return), under `prefix`: a
/// path, then a group `{…}`, a glob `*`, or an end (`as name` or not).
fn use_tree(t: &[Token], i: &mut usize, prefix: &[String], scope: &[String], out: &mut Vec<Named>) {
    let mut path = prefix.to_vec();
    while let Some(token) = t.get(*i) {
        *i += 1;
        let (scope, line) = (scope.to_vec(), token.line);
        match token.text.as_str() {
            "::" if path.is_empty() => path.push("::".to_owned()),
            "::" => {}
            "{" => {
                while !matches!(word(t, *i), "}" | "") {
                    use_tree(t, i, &path, &scope, out);
                    if word(t, *i) == "," {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            "*" => {
                return out.push(Named {
                    scope,
                    path,
                    line,
                    kind: Kind::Glob,
                });
            }
            name if is_word(name) => {
                path.push(name.to_owned());
                if word(t, *i) == "::" {
                    continue;
                }
                let bound = if word(t, *i) == "as" {
                    *i += 2;
                    word(t, *i - 1).to_owned()
                } else {
                    path.iter()
                        .rev()
                        .find(|w| *w != "self")
                        .cloned()
                        .unwrap_or_default()
                };
                return out.push(Named {
                    scope,
                    path,
                    line,
                    kind: Kind::Use(bound),
                });
            }
            _ => return,
        }
    }
}

/// Every module of the crate, by its path, with the index of its file.
type Modules = BTreeMap<Vec<String>, usize>;

/// What names stand for in one module's scope, from its `use`s: the
/// paths they bind, and the modules they glob.
#[derive(Default)]
struct Names {
    bound: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
}

/// The absolute path (from the root) of `path`, written in module
/// `scope`; `None` if it leaves the crate or its first name is not bound.
fn absolute(
    path: &[String],
    scope: &[String],
    names: &BTreeMap<Vec<String>, Names>,
    modules: &Modules,
) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    let mut abs = match first.as_str() {
        "crate" | CRATE => Vec::new(),
        "self" => scope.to_vec(),
        "super" => scope.split_last()?.1.to_vec(),
        "::" => return None,
        name => bind(name, scope, names, modules)?,
    };
    for w in rest {
        match w.as_str() {
            "super" => {
                abs.pop()?;
            }
            "self" => {}
            _ => abs.push(w.clone()),
        }
    }
    Some(abs)
}

/// What `name`, first in a path written in module `scope`, stands for:
/// a name a `use` bound, else a child module, else a module a glob
/// brings in.
fn bind(
    name: &str,
    scope: &[String],
    names: &BTreeMap<Vec<String>, Names>,
    modules: &Modules,
) -> Option<Vec<String>> {
    let own = names.get(scope);
    if let Some(path) = own.and_then(|n| n.bound.get(name)) {
        return Some(path.clone());
    }
    let child = [scope, &[name.to_owned()]].concat();
    if modules.contains_key(&child) {
        return Some(child);
    }
    let globs = own.map(|n| n.globs.as_slice()).unwrap_or_default();
    globs
        .iter()
        .map(|g| [g.as_slice(), &[name.to_owned()]].concat())
        .find(|p| modules.contains_key(p))
}

/// The file of the longest prefix of `abs` that is a module.
fn file_of(abs: &[String], modules: &Modules) -> Option<usize> {
    (0..=abs.len())
        .rev()
        .find_map(|n| modules.get(&abs[..n]).copied())
}

/// A file of `src/`: its path (`/`-separated, from `src/`), its module,
/// its lines, and what it names.
struct Source {
    relative: String,
    module: Vec<String>,
    lines: Vec<String>,
    scan: Scan,
}

/// The module a file holds: `store/kube/mod.rs`: `store::kube`.
fn module_path(relative: &str) -> Vec<String> {
    let stem = relative.strip_suffix(".rs").unwrap_or(relative);
    let mut path: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if path.last().is_some_and(|l| l == "mod") || matches!(stem, "lib" | "main") {
        path.pop();
    }
    path
}

/// The `.rs` files under `dir` but the unit tests' (`tests.rs`, and
/// anything under a `tests/` folder).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() && !path.ends_with("tests") {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
            out.push(path);
        }
    }
}

/// The crate under `src`: its files, sorted, and its modules.
struct Crate {
    files: Vec<Source>,
    modules: Modules,
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut paths = Vec::new();
        rust_files(src, &mut paths);
        paths.sort();
        let files: Vec<Source> = paths.iter().map(|p| Crate::source(src, p)).collect();
        let mut modules = Modules::new();
        for (k, file) in files.iter().enumerate() {
            // `lib.rs` sorts before `main.rs`: the root is the library's.
            modules.entry(file.module.clone()).or_insert(k);
            for inline in &file.scan.inline {
                modules
                    .entry([file.module.as_slice(), inline].concat())
                    .or_insert(k);
            }
        }
        Crate { files, modules }
    }

    fn source(src: &Path, path: &Path) -> Source {
        let relative = path.strip_prefix(src).expect("under src/");
        let relative: Vec<String> = relative
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        let relative = relative.join("/");
        let text = std::fs::read_to_string(path).expect("readable");
        Source {
            module: module_path(&relative),
            lines: text.lines().map(str::to_owned).collect(),
            scan: scan(&code_only(&text)),
            relative,
        }
    }

    /// What the names of each scope of file `k` stand for: each `use` of
    /// the file read with no name bound yet.
    fn names(&self, k: usize) -> BTreeMap<Vec<String>, Names> {
        let file = &self.files[k];
        let mut names: BTreeMap<Vec<String>, Names> = BTreeMap::new();
        for n in &file.scan.named {
            let scope = [file.module.as_slice(), &n.scope].concat();
            let Some(abs) = absolute(&n.path, &scope, &BTreeMap::new(), &self.modules) else {
                continue;
            };
            let here = names.entry(scope).or_default();
            match &n.kind {
                Kind::Use(bound) => {
                    here.bound.insert(bound.clone(), abs);
                }
                Kind::Glob => here.globs.push(abs),
                Kind::Inline => {}
            }
        }
        names
    }

    /// Every arrow between two files, with the first line that makes it.
    fn arrows(&self) -> BTreeMap<(usize, usize), usize> {
        let mut arrows = BTreeMap::new();
        for (k, file) in self.files.iter().enumerate() {
            let names = self.names(k);
            for n in &file.scan.named {
                let scope = [file.module.as_slice(), &n.scope].concat();
                let to = absolute(&n.path, &scope, &names, &self.modules)
                    .and_then(|abs| file_of(&abs, &self.modules));
                // A module's arrows into its own sections (its folder) are
                // no arrows: a module and its sections are one unit.
                let below =
                    |to: usize| !file.module.is_empty() && self.files[to].module.starts_with(&file.module);
                if let Some(to) = to.filter(|&to| to != k && !below(to)) {
                    arrows.entry((k, to)).or_insert(n.line);
                }
            }
        }
        arrows
    }

    fn index(&self, relative: &str) -> usize {
        let found = self.files.iter().position(|f| f.relative == relative);
        found.unwrap_or_else(|| panic!("no file src/{relative}"))
    }
}

/// Tarjan's walk over a graph: the strongly connected components found.
struct Tarjan<'a> {
    next: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    count: usize,
    found: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.count);
        self.low[v] = self.count;
        self.count += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &u in self.next[v].iter() {
            match self.index[u] {
                None => {
                    self.visit(u);
                    self.low[v] = self.low[v].min(self.low[u]);
                }
                Some(i) if self.on_stack[u] => self.low[v] = self.low[v].min(i),
                Some(_) => {}
            }
        }
        if self.index[v] == Some(self.low[v]) {
            let mut component = Vec::new();
            while let Some(u) = self.stack.pop() {
                self.on_stack[u] = false;
                component.push(u);
                if u == v {
                    break;
                }
            }
            component.sort_unstable();
            self.found.push(component);
        }
    }
}

/// The strongly connected components of the graph of `n` nodes and
/// these edges, each sorted.
fn components(n: usize, edges: impl Iterator<Item = (usize, usize)>) -> Vec<Vec<usize>> {
    let mut next = vec![Vec::new(); n];
    for (from, to) in edges {
        next[from].push(to);
    }
    let mut walk = Tarjan {
        next: &next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        count: 0,
        found: Vec::new(),
    };
    for v in 0..n {
        if walk.index[v].is_none() {
            walk.visit(v);
        }
    }
    walk.found
}

/// Each circle among the files, printed: its files, then each arrow
/// between two of them with the line that makes it.
fn circles(krate: &Crate, arrows: &BTreeMap<(usize, usize), usize>) -> Vec<String> {
    let mut found = components(krate.files.len(), arrows.keys().copied());
    found.retain(|c| c.len() > 1);
    found.sort();
    let name = |k: usize| format!("src/{}", krate.files[k].relative);
    let mut out = Vec::new();
    for circle in found {
        let files: Vec<String> = circle.iter().map(|&k| name(k)).collect();
        let mut text = format!("a circle of {} files: {}", circle.len(), files.join(", "));
        for (&(from, to), &line) in arrows {
            if circle.contains(&from) && circle.contains(&to) {
                let written = krate.files[from].lines[line - 1].trim();
                text += &format!("\n  {}:{line} -> {}\n      {written}", name(from), name(to));
            }
        }
        out.push(text);
    }
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_file_imports_another_in_a_circle() {
    let krate = Crate::read(&src());
    let arrows = krate.arrows();
    let circles = circles(&krate, &arrows);
    println!(
        "{} arrows between the {} files of src/",
        arrows.len(),
        krate.files.len()
    );
    assert!(
        circles.is_empty(),
        "{} circle(s) of files importing each other ({} arrows between the {} files of src/); \
         a file may name only files that do not name it back, directly or not:\n\n{}",
        circles.len(),
        arrows.len(),
        krate.files.len(),
        circles.join("\n\n")
    );
}

#[test]
fn the_resolver_sees_known_arrows() {
    let krate = Crate::read(&src());
    let arrows = krate.arrows();
    let arrow = |from: &str, to: &str| arrows.contains_key(&(krate.index(from), krate.index(to)));
    let known = [
        // `use crate::runtime::guest::{GuestState, PluginParts};`
        ("runtime/plugin/task.rs", "runtime/guest.rs"),
        // `use super::sockets::lookup::{self, LookupError};`
        (
            "runtime/capability/http.rs",
            "runtime/capability/sockets/lookup.rs",
        ),
        // `use crate::runtime::fence::connections::{Connections, …};`
        ("runtime/plugin/task.rs", "runtime/fence/connections.rs"),
        // `use super::*;`
        ("daemon/control/client.rs", "daemon/control/mod.rs"),
        // `use baton::cli::run::Triggers;`
        ("main.rs", "cli/run.rs"),
    ];
    for (from, to) in known {
        assert!(arrow(from, to), "no arrow seen from src/{from} to src/{to}");
    }
    // `super::OpenBucket` in the inline `pub mod bindings { … }` is the
    // file's own.
    let own = ("runtime/capability/keyvalue.rs", "runtime/capability.rs");
    assert!(
        !arrow(own.0, own.1),
        "an arrow seen from src/{} to src/{}",
        own.0,
        own.1
    );
}

#[test]
fn paths_are_read_from_code_as_written() {
    let code = code_only(concat!(
        "use crate::{a::b, c::{self, d as e}};\n",
        "pub use super::super::f::*; // use crate::g;\n",
        "mod h;\n",
        "pub(in crate::i) fn j() { let _ = (\"crate::k\", '{', r#\"}\"#, x.l::<u8>(), m::n::O::<P>::q); }\n",
        "pub mod r { fn s() { super::t::u(); } }\n",
        "/* crate::v /* w */ crate::x */ #[cfg(test)]\nmod tests { use crate::y; }\n",
        "fn z<'a>(v: &'a str) { self::aa::bb(); }\n",
    ));
    let scan = scan(&code);
    let found: Vec<(String, usize, String)> = scan
        .named
        .iter()
        .map(|n| (n.path.join("::"), n.line, format!("{:?}", n.kind)))
        .collect();
    let expected = [
        ("crate::a::b", 1, "Use(\"b\")"),
        ("crate::c::self", 1, "Use(\"c\")"),
        ("crate::c::d", 1, "Use(\"e\")"),
        ("super::super::f", 2, "Glob"),
        ("m::n::O", 4, "Inline"),
        ("super::t::u", 5, "Inline"),
        ("self::aa::bb", 8, "Inline"),
    ];
    let expected: Vec<(String, usize, String)> = expected
        .iter()
        .map(|(p, l, k)| (p.to_string(), *l, k.to_string()))
        .collect();
    assert_eq!(found, expected);
    assert_eq!(scan.named[5].scope, ["r"]);
    assert_eq!(scan.inline, [["r"]]);

    let modules: Modules = [
        (vec![], 0),
        (vec!["f".to_owned()], 1),
        (vec!["f".to_owned(), "g".to_owned()], 2),
    ]
    .into_iter()
    .collect();
    let path = |p: &str| p.split("::").map(str::to_owned).collect::<Vec<_>>();
    let names = BTreeMap::new();
    let resolve = |p: &str, scope: &str| {
        let abs = absolute(&path(p), &path(scope), &names, &modules)?;
        file_of(&abs, &modules)
    };
    assert_eq!(resolve("super::super::Z", "f::g::h"), Some(1));
    assert_eq!(resolve("crate::f::g::Z", "f"), Some(2));
    assert_eq!(resolve("g::Z", "f"), Some(2));
    assert_eq!(resolve("tokio::Z", "f"), None);
    assert_eq!(module_path("store/kube/mod.rs"), ["store", "kube"]);
    assert_eq!(
        module_path("runtime/capability/http.rs"),
        ["runtime", "capability", "http"]
    );
    assert!(module_path("lib.rs").is_empty() && module_path("main.rs").is_empty());
}
