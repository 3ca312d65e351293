//! Cosign key signatures, in cosign's classic layout: a signature of the
//! manifest `sha256:HEX` is an artifact tagged `sha256-HEX.sig` in the same
//! repository, each layer a *simple signing* payload (JSON naming the
//! manifest's digest) with its ECDSA P-256 / SHA-256 signature (ASN.1,
//! base64) in the `dev.cosignproject.cosign/signature` annotation. What
//! `cosign sign --key` writes (cosign 2; cosign 3 with
//! `--new-bundle-format=false`) verifies here, and what `baton push
//! --sign-key` writes verifies with `cosign verify --key`.
//!
//! Invariant: a signature counts only if its payload names the very
//! manifest digest being verified; keys are P-256 (cosign's default).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, UnparsedPublicKey,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The media type of a simple signing payload layer.
pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";

/// The annotation that holds a layer's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// The DER of a P-256 public key's algorithm, up to its point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
    0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// A public key signatures are checked with (`verify-key`).
#[derive(Clone, PartialEq, Eq)]
pub struct VerifyKey {
    point: Vec<u8>,
    /// The file it was read from.
    pub file: PathBuf,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifyKey({}, {})", self.file.display(), self.fingerprint())
    }
}

/// Why a key cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("key {}: {why}", file.display())]
pub struct KeyError {
    /// The file.
    pub file: PathBuf,
    /// What is wrong.
    pub why: String,
}

impl VerifyKey {
    /// Reads a PEM public key (`-----BEGIN PUBLIC KEY-----`, as `cosign
    /// generate-key-pair` writes `cosign.pub`).
    pub fn read(file: &Path) -> Result<VerifyKey, KeyError> {
        let error = |why: String| KeyError {
            file: file.to_path_buf(),
            why,
        };
        let text = std::fs::read(file).map_err(|e| error(format!("cannot read it: {e}")))?;
        let der = SubjectPublicKeyInfoDer::from_pem_slice(&text)
            .map_err(|e| error(format!("not a PEM public key: {e:?}")))?;
        let der: &[u8] = der.as_ref();
        match der.strip_prefix(&P256_SPKI_PREFIX[..]) {
            Some(point) if point.len() == 65 && point[0] == 4 => Ok(VerifyKey {
                point: point.to_vec(),
                file: file.to_path_buf(),
            }),
            _ => Err(error(
                "not an ECDSA P-256 public key (cosign's default kind)".to_owned(),
            )),
        }
    }

    /// A short name for the key: the first 16 hex digits of the SHA-256 of
    /// its point (cache markers, logs).
    pub fn fingerprint(&self) -> String {
        let d = Sha256::digest(&self.point);
        d.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `signature` (base64, ASN.1 DER) signs `payload`.
    pub fn verifies(&self, payload: &[u8], signature: &str) -> bool {
        let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(signature.trim()) else {
            return false;
        };
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &self.point)
            .verify(payload, &sig)
            .is_ok()
    }
}

/// A private key to sign with (`baton push --sign-key`): PKCS#8 PEM, not
/// encrypted (`-----BEGIN PRIVATE KEY-----`).
pub struct SigningKey {
    pair: EcdsaKeyPair,
}

impl SigningKey {
    /// Reads a PKCS#8 PEM P-256 private key.
    pub fn read(file: &Path) -> Result<SigningKey, KeyError> {
        let error = |why: String| KeyError {
            file: file.to_path_buf(),
            why,
        };
        let text = std::fs::read(file).map_err(|e| error(format!("cannot read it: {e}")))?;
        let der = PrivatePkcs8KeyDer::from_pem_slice(&text).map_err(|e| {
            error(format!(
                "not an unencrypted PKCS#8 PEM private key ({e:?}); cosign's encrypted keys sign with `cosign sign --key`"
            ))
        })?;
        let pair = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_ASN1_SIGNING,
            der.secret_pkcs8_der(),
            &ring::rand::SystemRandom::new(),
        )
        .map_err(|e| error(format!("not an ECDSA P-256 key: {e}")))?;
        Ok(SigningKey { pair })
    }

    /// The signature of `payload`, base64.
    pub fn sign(&self, payload: &[u8]) -> String {
        let sig = self
            .pair
            .sign(&ring::rand::SystemRandom::new(), payload)
            .expect("signing with a valid key");
        base64::engine::general_purpose::STANDARD.encode(sig.as_ref())
    }
}

/// The tag of the signatures of `digest` (`sha256:HEX` → `sha256-HEX.sig`).
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

#[derive(Serialize, Deserialize)]
struct Payload {
    critical: Critical,
    optional: Option<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Serialize, Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Serialize, Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// The simple signing payload for the manifest `digest` of `name`
/// (`registry/repository`).
pub fn payload(name: &str, digest: &str) -> Vec<u8> {
    serde_json::to_vec(&Payload {
        critical: Critical {
            identity: Identity {
                docker_reference: name.to_owned(),
            },
            image: Image {
                docker_manifest_digest: digest.to_owned(),
            },
            kind: "cosign container image signature".to_owned(),
        },
        optional: None,
    })
    .expect("a payload serialises")
}

/// The manifest digest a payload names, if it is one.
pub fn signed_digest(payload: &[u8]) -> Option<String> {
    let p: Payload = serde_json::from_slice(payload).ok()?;
    Some(p.critical.image.docker_manifest_digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(dir: &Path) -> (SigningKey, VerifyKey) {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let pem = |label: &str, der: &[u8]| {
            let b = base64::engine::general_purpose::STANDARD.encode(der);
            format!("-----BEGIN {label}-----\n{b}\n-----END {label}-----\n")
        };
        use ring::signature::KeyPair;
        let mut spki = P256_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(pair.public_key().as_ref());
        std::fs::write(dir.join("k.key"), pem("PRIVATE KEY", pkcs8.as_ref())).unwrap();
        std::fs::write(dir.join("k.pub"), pem("PUBLIC KEY", &spki)).unwrap();
        (
            SigningKey::read(&dir.join("k.key")).unwrap(),
            VerifyKey::read(&dir.join("k.pub")).unwrap(),
        )
    }

    #[test]
    fn a_signature_verifies_with_its_key_and_names_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        let (signing, verify) = keys(dir.path());
        let digest = format!("sha256:{}", "b".repeat(64));
        let p = payload("reg.example.com/a", &digest);
        let sig = signing.sign(&p);
        assert!(verify.verifies(&p, &sig));
        assert_eq!(signed_digest(&p).as_deref(), Some(digest.as_str()));
        let other = payload("reg.example.com/a", &format!("sha256:{}", "c".repeat(64)));
        assert!(!verify.verifies(&other, &sig));
        assert!(!verify.verifies(&p, "bm90IGEgc2lnbmF0dXJl"));
        assert_eq!(signature_tag(&digest), format!("sha256-{}.sig", "b".repeat(64)));
    }

    #[test]
    fn other_keys_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x.pub"), "not pem").unwrap();
        let e = VerifyKey::read(&dir.path().join("x.pub"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.pub") && e.contains("PEM"), "{e}");
    }
}
