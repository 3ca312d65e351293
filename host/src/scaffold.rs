//! `baton new`: a new plugin project from a template, in one step.
//!
//! The templates (`templates/<lang>/` in the repository) and baton's WIT
//! contract are compiled into the binary, so `baton new` works from
//! anywhere. Each project has a `build.sh` that writes `NAME.wasm` and a
//! `baton.toml` that runs it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// A guest language with a template.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust, with the `baton-guest` SDK.
    Rust,
    /// Python, with componentize-py.
    Python,
    /// JavaScript, with componentize-js.
    Js,
    /// C, with `wit-bindgen c`, clang and wasi-libc.
    C,
}

macro_rules! file {
    ($path:literal) => {
        ($path, include_str!(concat!("../../templates/", $path)))
    };
}

/// The template files of each language: (path under `templates/`, text).
const TEMPLATES: &[(&str, &str)] = &[
    file!("rust/Cargo.toml"),
    file!("rust/src/lib.rs"),
    file!("rust/build.sh"),
    file!("rust/baton.toml"),
    file!("python/app.py"),
    file!("python/build.sh"),
    file!("python/baton.toml"),
    file!("js/plugin.js"),
    file!("js/build.sh"),
    file!("js/baton.toml"),
    file!("c/plugin.c"),
    file!("c/build.sh"),
    file!("c/baton.toml"),
];

/// baton's WIT contract and the WASI packages it uses, as `wit/...`.
const WIT: &[(&str, &str)] = &[
    ("wit/leader.wit", include_str!("../../wit/leader.wit")),
    (
        "wit/deps/clocks-0.2.12/clocks.wit",
        include_str!("../../wit/deps/clocks-0.2.12/clocks.wit"),
    ),
    (
        "wit/deps/clocks-0.3.0/clocks.wit",
        include_str!("../../wit/deps/clocks-0.3.0/clocks.wit"),
    ),
    (
        "wit/deps/io-0.2.12/io.wit",
        include_str!("../../wit/deps/io-0.2.12/io.wit"),
    ),
];

/// Where the Rust SDK was when this binary was built.
fn sdk_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk")
}

impl Lang {
    fn dir(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
            Lang::C => "c",
        }
    }
}

/// Checks a plugin name: lower-case ASCII letters, digits and `-`, starting
/// with a letter (it names a crate, a file and a lease).
pub fn check_name(name: &str) -> Result<()> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !ok {
        bail!("invalid plugin name {name:?}: use lower-case letters, digits and '-', starting with a letter");
    }
    Ok(())
}

/// Creates `parent/name` with a new `lang` plugin; returns its path.
pub fn new_plugin(lang: Lang, name: &str, parent: &Path) -> Result<PathBuf> {
    check_name(name)?;
    let root = parent.join(name);
    if root.exists() {
        bail!("{} already exists", root.display());
    }
    let sdk = sdk_path();
    let sdk = sdk.canonicalize().unwrap_or(sdk);
    let crate_name = name.replace('-', "_");
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{crate}}", &crate_name)
            .replace("{{sdk}}", &sdk.display().to_string())
    };
    let prefix = format!("{}/", lang.dir());
    let mut files: Vec<(String, String)> = TEMPLATES
        .iter()
        .filter_map(|(path, text)| Some((path.strip_prefix(&prefix)?.to_owned(), fill(text))))
        .collect();
    if lang != Lang::Rust {
        files.extend(WIT.iter().map(|(p, t)| (p.to_string(), t.to_string())));
    }
    files.push((
        ".gitignore".into(),
        "/target\n/gen\n/.baton\n*.wasm\n__pycache__/\n".into(),
    ));
    for (path, text) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap())
            .with_context(|| format!("create {}", path.parent().unwrap().display()))?;
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        if path.extension().is_some_and(|e| e == "sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_language_gets_its_files_with_placeholders_filled() {
        let dir = tempfile::tempdir().unwrap();
        for (lang, main) in [
            (Lang::Rust, "src/lib.rs"),
            (Lang::Python, "app.py"),
            (Lang::Js, "plugin.js"),
            (Lang::C, "plugin.c"),
        ] {
            let name = format!("my-{}", lang.dir());
            let root = new_plugin(lang, &name, dir.path()).unwrap();
            for f in [main, "build.sh", "baton.toml"] {
                let text = std::fs::read_to_string(root.join(f)).unwrap();
                assert!(!text.contains("{{"), "{f} of {lang:?} has a placeholder left");
            }
            assert_eq!(root.join("wit/leader.wit").is_file(), lang != Lang::Rust);
            assert!(new_plugin(lang, &name, dir.path()).is_err(), "no overwrite");
        }
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", "My", "1a", "a_b", "a-", "a/b", "../x"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "my-plugin", "p2"] {
            check_name(good).unwrap();
        }
    }
}
