//! The content-addressed cache of pulled components, shared by every
//! plugin and every host of one machine:
//!
//! - `blobs/sha256/HEX`: a component's bytes, named by their digest;
//! - `manifests/sha256/HEX`: a manifest, named by its digest;
//! - `tags/REGISTRY/REPOSITORY/TAG`: the manifest digest a tag last
//!   resolved to (what a host restarting while the registry is down runs);
//! - `verified/REGISTRY/REPOSITORY/HEX.KEY`: a signature of the manifest
//!   `HEX`, found in that repository (where cosign keeps it), verified
//!   with the key whose fingerprint is `KEY`. Per repository: the same
//!   bytes pushed to another repository unsigned are not signed there.
//!
//! Invariants: every file is written whole to a temporary name and renamed
//! into place, so a reader (another host) sees all of it or nothing; a
//! blob is used only after its bytes hash to its name, and a blob that
//! does not is deleted.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::reference::{Reference, is_sha256};

/// The cache in one directory.
#[derive(Clone, Debug)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// The cache in `root` (made when first written).
    pub fn new(root: PathBuf) -> Cache {
        Cache { root }
    }

    /// Its directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn by_digest(&self, kind: &str, digest: &str) -> Option<PathBuf> {
        if !is_sha256(digest) {
            return None;
        }
        Some(
            self.root
                .join(kind)
                .join("sha256")
                .join(&digest["sha256:".len()..]),
        )
    }

    /// Where the blob `digest` is (whether or not it is there).
    pub fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        self.by_digest("blobs", digest)
    }

    /// The blob `digest`'s file, if it is there and its bytes hash to its
    /// name; a blob that does not is deleted (and `None`).
    pub fn checked_blob(&self, digest: &str) -> Option<PathBuf> {
        let path = self.blob_path(digest)?;
        let bytes = std::fs::read(&path).ok()?;
        if sha256(&bytes) == digest {
            return Some(path);
        }
        tracing::warn!(blob = %path.display(), digest, "a cached component does not match its digest; deleted, to be pulled again");
        let _ = std::fs::remove_file(&path);
        None
    }

    /// Keeps `bytes` as the blob `digest` after checking they hash to it.
    pub fn put_blob(&self, digest: &str, bytes: &[u8]) -> Result<PathBuf, CacheError> {
        let actual = sha256(bytes);
        if actual != digest {
            return Err(CacheError::Mismatch {
                expected: digest.to_owned(),
                actual,
            });
        }
        let path = self
            .blob_path(digest)
            .ok_or_else(|| CacheError::NotSha256(digest.to_owned()))?;
        write_whole(&path, bytes)?;
        Ok(path)
    }

    /// The manifest `digest`, if cached (its bytes hash to it).
    pub fn manifest(&self, digest: &str) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.by_digest("manifests", digest)?).ok()?;
        (sha256(&bytes) == digest).then_some(bytes)
    }

    /// Keeps the manifest `digest`.
    pub fn put_manifest(&self, digest: &str, bytes: &[u8]) -> Result<(), CacheError> {
        let path = self
            .by_digest("manifests", digest)
            .ok_or_else(|| CacheError::NotSha256(digest.to_owned()))?;
        write_whole(&path, bytes)
    }

    fn tag_path(&self, reference: &Reference) -> Option<PathBuf> {
        let tag = reference.tag()?;
        Some(
            self.root
                .join("tags")
                .join(reference.registry().replace(':', "_"))
                .join(reference.repository())
                .join(tag),
        )
    }

    /// The digest `reference`'s tag last resolved to here.
    pub fn tag(&self, reference: &Reference) -> Option<String> {
        let text = std::fs::read_to_string(self.tag_path(reference)?).ok()?;
        let digest = text.trim().to_owned();
        is_sha256(&digest).then_some(digest)
    }

    /// Records that `reference`'s tag resolved to `digest`.
    pub fn set_tag(&self, reference: &Reference, digest: &str) -> Result<(), CacheError> {
        match self.tag_path(reference) {
            Some(path) => write_whole(&path, digest.as_bytes()),
            None => Ok(()),
        }
    }

    fn verified_path(&self, reference: &Reference, digest: &str, key: &str) -> Option<PathBuf> {
        let hex = digest.strip_prefix("sha256:").filter(|_| is_sha256(digest))?;
        Some(
            self.root
                .join("verified")
                .join(reference.registry().replace(':', "_"))
                .join(reference.repository())
                .join(format!("{hex}.{key}")),
        )
    }

    /// Whether a signature of `digest` by the key `key` (a fingerprint) was
    /// found in `reference`'s repository and verified here.
    pub fn is_verified(&self, reference: &Reference, digest: &str, key: &str) -> bool {
        self.verified_path(reference, digest, key)
            .is_some_and(|p| p.is_file())
    }

    /// Records such a verification.
    pub fn set_verified(&self, reference: &Reference, digest: &str, key: &str) -> Result<(), CacheError> {
        match self.verified_path(reference, digest, key) {
            Some(path) => write_whole(&path, b""),
            None => Ok(()),
        }
    }
}

/// Why the cache could not keep something.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The bytes do not hash to the digest they were served under.
    #[error("the content's digest is {actual}, not {expected}")]
    Mismatch {
        /// The digest they should have.
        expected: String,
        /// The one they have.
        actual: String,
    },
    /// Not a `sha256:` digest.
    #[error("{0:?} is not a sha256 digest")]
    NotSha256(String),
    /// A file could not be written.
    #[error("cannot write {}: {error}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

/// `sha256:HEX` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Writes `bytes` to a temporary file beside `path`, then renames it over.
fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), CacheError> {
    let err = |error| CacheError::Write {
        path: path.to_path_buf(),
        error,
    };
    let dir = path.parent().expect("cache paths have a parent");
    std::fs::create_dir_all(dir).map_err(err)?;
    let temp = dir.join(format!(
        ".{}.{:016x}.tmp",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        rand::random::<u64>()
    ));
    let written = std::fs::write(&temp, bytes).and_then(|()| std::fs::rename(&temp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_kept_by_digest_and_a_corrupted_one_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().to_path_buf());
        let digest = sha256(b"component");
        assert!(cache.put_blob(&sha256(b"other"), b"component").is_err());
        let path = cache.put_blob(&digest, b"component").unwrap();
        assert_eq!(cache.checked_blob(&digest), Some(path.clone()));
        std::fs::write(&path, b"tampered").unwrap();
        assert_eq!(cache.checked_blob(&digest), None);
        assert!(!path.exists());
    }

    #[test]
    fn tags_and_verifications_are_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().to_path_buf());
        let r = Reference::parse("oci://127.0.0.1:5000/team/x:1").unwrap();
        let digest = sha256(b"manifest");
        assert_eq!(cache.tag(&r), None);
        cache.set_tag(&r, &digest).unwrap();
        assert_eq!(cache.tag(&r), Some(digest.clone()));
        assert!(!cache.is_verified(&r, &digest, "k1"));
        cache.set_verified(&r, &digest, "k1").unwrap();
        assert!(cache.is_verified(&r, &digest, "k1") && !cache.is_verified(&r, &digest, "k2"));
        // Another tag of the repository: verified; another repository: not.
        let same = Reference::parse("oci://127.0.0.1:5000/team/x:2").unwrap();
        let other = Reference::parse("oci://127.0.0.1:5000/team/y:1").unwrap();
        assert!(cache.is_verified(&same, &digest, "k1"));
        assert!(!cache.is_verified(&other, &digest, "k1"));
        cache.put_manifest(&digest, b"manifest").unwrap();
        assert_eq!(cache.manifest(&digest).as_deref(), Some(&b"manifest"[..]));
    }
}
