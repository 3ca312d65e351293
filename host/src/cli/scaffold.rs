//! `baton new`: a new plugin project from a template, in one step.
//!
//! The templates (`templates/<lang>/` in the repository) and baton's WIT
//! contract are compiled into the binary, so `baton new` works from
//! anywhere. Each project has a `build.sh` that writes `NAME.wasm` (and
//! tests it with `baton test`), a `baton.toml` that runs it, and a
//! `scenario.toml` that `baton test` takes it through.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

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

/// The world a new plugin targets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum World {
    /// `pollable-plugin`: WASI 0.2, a blocking `run` that waits on
    /// pollables. Every language has this template.
    #[default]
    Pollable,
    /// `future-plugin`: component-model async, an `async run` that awaits
    /// the change future. Rust and Python have this template.
    Future,
}

macro_rules! file {
    ($path:literal) => {
        ($path, include_str!(concat!("../../../templates/", $path)))
    };
}

/// The template files of each language: (path under `templates/`, text).
const TEMPLATES: &[(&str, &str)] = &[
    file!("rust/Cargo.toml"),
    file!("rust/src/lib.rs"),
    file!("rust/build.sh"),
    file!("rust/baton.toml"),
    file!("rust-future/Cargo.toml"),
    file!("rust-future/src/lib.rs"),
    file!("rust-future/build.sh"),
    file!("rust-future/baton.toml"),
    file!("python/app.py"),
    file!("python/build.sh"),
    file!("python/baton.toml"),
    file!("python/wit/world.wit"),
    file!("python-future/app.py"),
    file!("python-future/build.sh"),
    file!("python-future/baton.toml"),
    file!("python-future/wit/world.wit"),
    file!("js/plugin.js"),
    file!("js/build.sh"),
    file!("js/baton.toml"),
    file!("js/wit/world.wit"),
    file!("c/plugin.c"),
    file!("c/build.sh"),
    file!("c/baton.toml"),
    file!("c/wit/world.wit"),
];

/// The scenario every project gets (`baton test`), the same in every
/// language: the templates behave alike.
const SCENARIO: &str = include_str!("../../../templates/scenario.toml");

/// The end of every project's `build.sh`: it tests what it built. Its
/// first line (which names the file) is left out.
const BUILD_TEST: &str = include_str!("../../../templates/build-test.sh");

/// baton's WIT contract and the WASI packages a plugin world may use, as
/// `wit/deps/...`: the projects of the languages that bind WIT themselves
/// (all but Rust) have their own `wit/world.wit`, which includes a world of
/// the contract and adds imports. They stay on `baton:leader@0.3.0`
/// (`wit/v0.3.0`; hosts serve every version); the Rust ones use the SDK,
/// which targets the newest.
const WIT_DEPS: &[(&str, &str)] = &[
    (
        "wit/deps/baton-leader/leader.wit",
        include_str!("../../../wit/v0.3.0/leader.wit"),
    ),
    (
        "wit/deps/clocks-0.2.12/clocks.wit",
        include_str!("../../../wit/deps/clocks-0.2.12/clocks.wit"),
    ),
    (
        "wit/deps/clocks-0.3.0/clocks.wit",
        include_str!("../../../wit/deps/clocks-0.3.0/clocks.wit"),
    ),
    (
        "wit/deps/io-0.2.12/io.wit",
        include_str!("../../../wit/deps/io-0.2.12/io.wit"),
    ),
    (
        "wit/deps/http-0.2.12/http.wit",
        include_str!("../../../wit/deps/http-0.2.12/http.wit"),
    ),
    (
        "wit/deps/cli-0.2.12/cli.wit",
        include_str!("../../../wit/deps/cli-0.2.12/cli.wit"),
    ),
    (
        "wit/deps/keyvalue-0.2.0-draft2/store.wit",
        include_str!("../../../wit/deps/keyvalue-0.2.0-draft2/store.wit"),
    ),
    (
        "wit/deps/keyvalue-0.2.0-draft2/atomic.wit",
        include_str!("../../../wit/deps/keyvalue-0.2.0-draft2/atomic.wit"),
    ),
    (
        "wit/deps/keyvalue-0.2.0-draft2/batch.wit",
        include_str!("../../../wit/deps/keyvalue-0.2.0-draft2/batch.wit"),
    ),
    (
        "wit/deps/keyvalue-0.2.0-draft2/world.wit",
        include_str!("../../../wit/deps/keyvalue-0.2.0-draft2/world.wit"),
    ),
    (
        "wit/deps/config-0.2.0-rc.1/store.wit",
        include_str!("../../../wit/deps/config-0.2.0-rc.1/store.wit"),
    ),
    (
        "wit/deps/config-0.2.0-rc.1/world.wit",
        include_str!("../../../wit/deps/config-0.2.0-rc.1/world.wit"),
    ),
];

/// Where the Rust SDK was when this binary was built.
fn sdk_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk")
}

impl Lang {
    fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
            Lang::C => "c",
        }
    }

    /// The template folder for `world`, or why there is none.
    fn template(self, world: World) -> Result<&'static str> {
        Ok(match (self, world) {
            (lang, World::Pollable) => lang.name(),
            (Lang::Rust, World::Future) => "rust-future",
            (Lang::Python, World::Future) => "python-future",
            (Lang::Js, World::Future) => bail!(
                "no js template for the future world: componentize-js binds only the pollable world; \
                 componentize-qjs (QuickJS) can target the future world, see examples/js-future-ticker \
                 in the baton repository and docs/guests/javascript.md"
            ),
            (Lang::C, World::Future) => bail!(
                "no c template for the future world: wit-bindgen c's component-model async support is \
                 not stable yet; use --world pollable"
            ),
        })
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

/// `baton new`: creates `parent/name` (see [`new_plugin`]) and says how
/// to build it.
pub fn execute(lang: Lang, world: World, name: &str, parent: &Path) -> Result<ExitCode> {
    let root = new_plugin(lang, world, name, parent)?;
    println!(
        "created {}: build it with {}/build.sh",
        root.display(),
        root.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Creates `parent/name` with a new `lang` plugin for `world`; returns its
/// path.
pub fn new_plugin(lang: Lang, world: World, name: &str, parent: &Path) -> Result<PathBuf> {
    check_name(name)?;
    let template = lang.template(world)?;
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
    let prefix = format!("{template}/");
    let build_test = BUILD_TEST.split_once('\n').map_or("", |(_, rest)| rest);
    let mut files: Vec<(String, String)> = TEMPLATES
        .iter()
        .filter_map(|(path, text)| {
            let path = path.strip_prefix(&prefix)?;
            let text = match path {
                "build.sh" => format!("{text}\n{build_test}"),
                _ => text.to_string(),
            };
            Some((path.to_owned(), fill(&text)))
        })
        .collect();
    if lang != Lang::Rust {
        files.extend(WIT_DEPS.iter().map(|(p, t)| (p.to_string(), t.to_string())));
    }
    files.push(("scenario.toml".into(), fill(SCENARIO)));
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
        for (lang, world, main, world_says) in [
            (Lang::Rust, World::Pollable, "src/lib.rs", "export_pollable!"),
            (Lang::Rust, World::Future, "src/lib.rs", "export_future!"),
            (Lang::Python, World::Pollable, "app.py", "TaskSync"),
            (Lang::Python, World::Future, "app.py", "TaskAsync"),
            (Lang::Js, World::Pollable, "plugin.js", "status-pollable"),
            (Lang::C, World::Pollable, "plugin.c", "pollable"),
        ] {
            let name = format!("my-{}-{world:?}", lang.name()).to_lowercase();
            let root = new_plugin(lang, world, &name, dir.path()).unwrap();
            for f in [main, "build.sh", "baton.toml", "scenario.toml"] {
                let text = std::fs::read_to_string(root.join(f)).unwrap();
                assert!(!text.contains("{{"), "{f} of {lang:?} has a placeholder left");
            }
            let code = std::fs::read_to_string(root.join(main)).unwrap();
            assert!(code.contains(world_says), "{lang:?} {world:?}: {main}");
            let build = std::fs::read_to_string(root.join("build.sh")).unwrap();
            assert!(
                build.contains(&format!(
                    "\"$baton\" test {name}.wasm --config baton.toml scenario.toml"
                )),
                "{lang:?}: {build}"
            );
            for wit in [
                "wit/world.wit",
                "wit/deps/baton-leader/leader.wit",
                "wit/deps/http-0.2.12/http.wit",
                "wit/deps/keyvalue-0.2.0-draft2/atomic.wit",
                "wit/deps/config-0.2.0-rc.1/store.wit",
            ] {
                assert_eq!(root.join(wit).is_file(), lang != Lang::Rust, "{lang:?}: {wit}");
            }
            assert!(
                new_plugin(lang, world, &name, dir.path()).is_err(),
                "no overwrite"
            );
        }
        for lang in [Lang::Js, Lang::C] {
            let err = new_plugin(lang, World::Future, "x", dir.path())
                .unwrap_err()
                .to_string();
            assert!(err.contains("for the future world"), "{err}");
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
