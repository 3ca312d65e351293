//! Publishing a component ([`Registry::push`]) as `wkg oci push` does: one
//! layer of `application/wasm`, titled with the file's name
//! (`org.opencontainers.image.title`), and a config of
//! `application/vnd.wasm.config.v0+json` in `oci-wasm`'s shape, fields in
//! its order, with what the component exports and imports; and, with a
//! signing key, a cosign signature of the manifest ([`super::sign`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use oci_client::annotations::ORG_OPENCONTAINERS_IMAGE_TITLE;
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use wasmtime::component::wit_parser::decoding::{DecodedWasm, decode};

use super::cache::sha256;
use super::client::{Connection, PullError};
use super::pull::{Registry, WASM_CONFIG, WASM_LAYER};
use super::reference::Reference;
use super::sign::{self, SigningKey};

/// What a push published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// The manifest's digest.
    pub digest: String,
    /// The signature's tag, if signed.
    pub signature: Option<String>,
}

/// What a component's config says of it (`oci-wasm`'s `Component`): its
/// top-level imports and exports, as the WIT names them
/// (`wasi:io/streams@0.2.0`, or a bare name for a function), in the
/// component's order; `target` is left out (`null`), as `oci-wasm` does.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ComponentInfo {
    /// What it exports.
    pub exports: Vec<String>,
    /// What it imports.
    pub imports: Vec<String>,
    /// The world it targets, if said.
    pub target: Option<String>,
}

/// Why a file cannot be pushed as a component; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// Not even a component's preamble.
    #[error("{}: not a WebAssembly component (`baton check` says what it is)", file.display())]
    NotAComponent {
        /// The file.
        file: PathBuf,
    },
    /// A component's preamble, but it does not decode.
    #[error("{}: cannot be decoded as a WebAssembly component: {detail}", file.display())]
    Undecodable {
        /// The file.
        file: PathBuf,
        /// What the decoder said.
        detail: String,
    },
    /// A WIT package encoded as a component, not a component.
    #[error("{}: a WIT package, not a component", file.display())]
    WitPackage {
        /// The file.
        file: PathBuf,
    },
}

/// A component to publish: its bytes, the layer's title and what its
/// config says of it.
#[derive(Clone, Debug)]
pub struct Artifact {
    bytes: Vec<u8>,
    title: String,
    component: ComponentInfo,
}

impl Artifact {
    /// The component `bytes`, read from `file`, to be pushed as
    /// `reference`: decoded (the whole binary validated) for its imports
    /// and exports, its layer titled with the file's name (else
    /// `REPOSITORY.wasm`, `/` as `_`, as `wkg` does).
    pub fn new(file: &Path, bytes: Vec<u8>, reference: &Reference) -> Result<Artifact, ArtifactError> {
        // The component binary's preamble: magic, version 0x0d, layer 1.
        if !bytes.starts_with(b"\0asm\x0d\x00\x01\x00") {
            return Err(ArtifactError::NotAComponent {
                file: file.to_owned(),
            });
        }
        let component = match decode(&bytes) {
            Ok(DecodedWasm::Component(resolve, world)) => {
                let world = &resolve.worlds[world];
                // As `oci-wasm` names them (`Component::from_world`).
                ComponentInfo {
                    exports: world.exports.keys().map(|k| resolve.name_world_key(k)).collect(),
                    imports: world.imports.keys().map(|k| resolve.name_world_key(k)).collect(),
                    target: None,
                }
            }
            Ok(DecodedWasm::WitPackage(..)) => {
                return Err(ArtifactError::WitPackage {
                    file: file.to_owned(),
                });
            }
            Err(e) => {
                return Err(ArtifactError::Undecodable {
                    file: file.to_owned(),
                    detail: format!("{e:#}"),
                });
            }
        };
        let title = file.file_name().map_or_else(
            || format!("{}.wasm", reference.repository().replace('/', "_")),
            |n| n.to_string_lossy().into_owned(),
        );
        Ok(Artifact {
            bytes,
            title,
            component,
        })
    }

    /// What its config says of it.
    pub fn component(&self) -> &ComponentInfo {
        &self.component
    }

    /// Its layer's title.
    pub fn title(&self) -> &str {
        &self.title
    }

    /// Its config, as `oci-wasm` writes it (`created` to the second).
    fn config(&self, created: SystemTime) -> Vec<u8> {
        /// `oci-wasm`'s `WasmConfig`: its fields in its order, none skipped.
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct WasmConfig<'a> {
            created: String,
            author: Option<String>,
            architecture: &'static str,
            os: &'static str,
            layer_digests: [String; 1],
            component: &'a ComponentInfo,
        }
        let config = WasmConfig {
            created: humantime::format_rfc3339_seconds(created).to_string(),
            author: None,
            architecture: "wasm",
            os: "wasip2",
            layer_digests: [sha256(&self.bytes)],
            component: &self.component,
        };
        serde_json::to_vec(&config).expect("json")
    }
}

impl Registry {
    /// Publishes `artifact` as `reference` (a tag), signed with `key` if
    /// given.
    pub async fn push(
        &self,
        artifact: Artifact,
        reference: &Reference,
        key: Option<&SigningKey>,
    ) -> Result<Pushed, PullError> {
        let c = Connection::open(self.settings(), reference)?;
        let auth = c.auth(reference);
        let config = Config::new(artifact.config(SystemTime::now()), WASM_CONFIG.to_owned(), None);
        let title = BTreeMap::from([(ORG_OPENCONTAINERS_IMAGE_TITLE.to_owned(), artifact.title)]);
        let layers = [ImageLayer::new(
            artifact.bytes,
            WASM_LAYER.to_owned(),
            Some(title),
        )];
        let mut manifest = OciImageManifest::build(&layers, &config, None);
        manifest.media_type = Some(OCI_IMAGE_MEDIA_TYPE.to_owned());
        manifest.artifact_type = Some(WASM_CONFIG.to_owned());
        let oci = reference.oci();
        c.call(
            reference,
            c.client.push(&oci, &layers, config, &auth, Some(manifest)),
        )
        .await?;
        let digest = c
            .call(reference, c.client.fetch_manifest_digest(&oci, &auth))
            .await?;
        let signature = match key {
            Some(key) => Some(sign_manifest(&c, reference, &digest, key).await?),
            None => None,
        };
        Ok(Pushed { digest, signature })
    }
}

/// Pushes a signature of `digest` by `key` to `sha256-HEX.sig`.
async fn sign_manifest(
    c: &Connection,
    reference: &Reference,
    digest: &str,
    key: &SigningKey,
) -> Result<String, PullError> {
    let tag = sign::signature_tag(digest);
    let sig_ref = reference.tagged(&tag);
    let payload = sign::payload(&reference.name(), digest);
    let annotations = BTreeMap::from([(sign::SIGNATURE_ANNOTATION.to_owned(), key.sign(&payload))]);
    let layers = [ImageLayer::new(
        payload.clone(),
        sign::PAYLOAD_MEDIA_TYPE.to_owned(),
        Some(annotations),
    )];
    let config = serde_json::json!({
        "architecture": "",
        "os": "",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [sha256(&payload)]},
    });
    let config = Config::oci_v1(serde_json::to_vec(&config).expect("json"), None);
    let mut manifest = OciImageManifest::build(&layers, &config, None);
    manifest.media_type = Some(OCI_IMAGE_MEDIA_TYPE.to_owned());
    let auth = c.auth(&sig_ref);
    c.call(
        &sig_ref,
        c.client
            .push(&sig_ref.oci(), &layers, config, &auth, Some(manifest)),
    )
    .await?;
    Ok(tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::test_guests::guest;

    fn reference() -> Reference {
        Reference::parse("oci://r.io/team/probe:1").unwrap()
    }

    #[test]
    fn the_config_is_oci_wasms_with_what_the_component_exports_and_imports() {
        let file = guest("probe_pollable.wasm");
        let bytes = std::fs::read(&file).unwrap();
        let digest = sha256(&bytes);
        let artifact = Artifact::new(&file, bytes, &reference()).unwrap();
        assert_eq!(artifact.title(), "probe_pollable.wasm");
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_786_000_000);
        let config = String::from_utf8(artifact.config(at)).unwrap();
        // `oci-wasm`'s fields in its order, the absent ones `null`.
        let head = format!(
            "{{\"created\":\"2026-08-06T07:06:40Z\",\"author\":null,\"architecture\":\"wasm\",\
             \"os\":\"wasip2\",\"layerDigests\":[\"{digest}\"],\"component\":{{\"exports\":["
        );
        assert!(config.starts_with(&head), "{config}");
        let exports = config.find("\"exports\"").unwrap();
        let imports = config.find("\"imports\"").unwrap();
        let target = config.find("\"target\":null}}").unwrap();
        assert!(
            exports < imports && imports < target && config.ends_with("\"target\":null}}"),
            "{config}"
        );
        // The top-level interfaces, named with their versions, in the
        // component's order.
        let json: serde_json::Value = serde_json::from_str(&config).unwrap();
        let component = &json["component"];
        assert_eq!(
            component["exports"],
            serde_json::json!(["baton:leader/health-sync@0.4.0", "baton:leader/task-sync@0.4.0"])
        );
        let imports: Vec<&str> = component["imports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_str().unwrap())
            .collect();
        assert!(
            imports.iter().any(|i| i.starts_with("baton:leader/"))
                && imports.iter().any(|i| i.starts_with("wasi:io/streams@0.2."))
                && imports.iter().all(|i| i.contains(':') && i.contains('@')),
            "{imports:?}"
        );
        assert_eq!(artifact.component().imports, imports);
    }

    #[test]
    fn what_is_not_a_component_is_refused_naming_the_file() {
        let r = reference();
        let core = Artifact::new(Path::new("core.wasm"), b"\0asm\x01\0\0\0".to_vec(), &r).unwrap_err();
        assert!(matches!(core, ArtifactError::NotAComponent { .. }), "{core}");
        assert!(
            core.to_string()
                .starts_with("core.wasm: not a WebAssembly component"),
            "{core}"
        );
        // A component's preamble, then nothing that decodes.
        let mut broken = b"\0asm\x0d\x00\x01\x00".to_vec();
        broken.extend_from_slice(&[0x7f, 0x05, 1, 2]);
        let e = Artifact::new(Path::new("dir/broken.wasm"), broken, &r).unwrap_err();
        assert!(matches!(e, ArtifactError::Undecodable { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("dir/broken.wasm: cannot be decoded as a WebAssembly component: "),
            "{e}"
        );
    }

    #[test]
    fn a_path_without_a_file_name_titles_the_layer_as_wkg_does() {
        let empty = b"\0asm\x0d\x00\x01\x00".to_vec();
        let a = Artifact::new(Path::new(".."), empty, &reference()).unwrap();
        assert_eq!(a.title(), "team_probe.wasm");
        assert_eq!(
            a.component(),
            &ComponentInfo {
                exports: vec![],
                imports: vec![],
                target: None,
            }
        );
    }
}
