//! A component's reference in a registry: `oci://REGISTRY/REPOSITORY:TAG`
//! or `oci://REGISTRY/REPOSITORY@sha256:HEX` (both, and the tag is kept
//! for people while the digest decides).

use std::fmt;

/// What a plugin's `path` starts with when it names a registry.
pub const SCHEME: &str = "oci://";

/// A reference that parses: a registry, a repository, and a tag or a
/// digest.
///
/// ```
/// use baton::oci::Reference;
/// let r = Reference::parse("oci://127.0.0.1:5000/team/reconciler:1.4").unwrap();
/// assert_eq!(r.registry(), "127.0.0.1:5000");
/// assert_eq!(r.repository(), "team/reconciler");
/// assert_eq!(r.tag().as_deref(), Some("1.4"));
/// assert!(!r.is_pinned());
/// assert_eq!(r.to_string(), "oci://127.0.0.1:5000/team/reconciler:1.4");
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Reference {
    /// As written, without the scheme.
    text: String,
}

/// Why a reference does not parse.
#[derive(Debug, thiserror::Error)]
#[error(
    "{text:?} is not an OCI reference ({why}); write oci://REGISTRY/REPOSITORY:TAG or oci://REGISTRY/REPOSITORY@sha256:HEX"
)]
pub struct ReferenceError {
    /// The text.
    pub text: String,
    /// What is wrong with it.
    pub why: String,
}

impl Reference {
    /// Parses `oci://…` (the scheme may be left out). The registry must be
    /// written out (a host name with a dot or a port, or `localhost`): a
    /// reference never goes to Docker Hub by default.
    pub fn parse(text: &str) -> Result<Reference, ReferenceError> {
        let rest = text.strip_prefix(SCHEME).unwrap_or(text);
        let error = |why: &str| ReferenceError {
            text: text.to_owned(),
            why: why.to_owned(),
        };
        let first = rest.split('/').next().unwrap_or_default();
        let explicit = first.contains('.') || first.contains(':') || first == "localhost";
        if !rest.contains('/') || !explicit {
            return Err(error(
                "no registry: the first part must be a host name or host:port",
            ));
        }
        // The client would read no tag as `latest`: a version is written out.
        let last = rest.rsplit('/').next().unwrap_or_default();
        if !rest.contains('@') && !last.contains(':') {
            return Err(error("neither a tag nor a digest"));
        }
        let parsed: oci_client::Reference = rest.parse().map_err(|e| error(&format!("{e}")))?;
        if let Some(d) = parsed.digest()
            && !is_sha256(d)
        {
            return Err(error("the digest is not sha256: and 64 lower-case hex digits"));
        }
        Ok(Reference {
            text: rest.to_owned(),
        })
    }

    fn parsed(&self) -> oci_client::Reference {
        self.text.parse().expect("parsed when made")
    }

    /// The registry: `host` or `host:port`.
    pub fn registry(&self) -> String {
        self.parsed().resolve_registry().to_owned()
    }

    /// The repository within it.
    pub fn repository(&self) -> String {
        self.parsed().repository().to_owned()
    }

    /// The tag, if it has one.
    pub fn tag(&self) -> Option<String> {
        self.parsed().tag().map(str::to_owned)
    }

    /// The digest it pins, if any.
    pub fn digest(&self) -> Option<String> {
        self.parsed().digest().map(str::to_owned)
    }

    /// Whether a digest pins it: then the registry is asked nothing once
    /// the component is cached.
    pub fn is_pinned(&self) -> bool {
        self.digest().is_some()
    }

    /// The same repository at `digest`.
    pub fn at(&self, digest: &str) -> Reference {
        Reference {
            text: format!("{}/{}@{digest}", self.registry(), self.repository()),
        }
    }

    /// The same repository at `tag`.
    pub fn tagged(&self, tag: &str) -> Reference {
        Reference {
            text: format!("{}/{}:{tag}", self.registry(), self.repository()),
        }
    }

    /// `registry/repository`, as a signature names it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry(), self.repository())
    }

    /// The client's form.
    pub(super) fn oci(&self) -> oci_client::Reference {
        self.parsed()
    }
}

/// Whether `d` is `sha256:` and 64 lower-case hex digits.
pub fn is_sha256(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}", self.text)
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_with_a_registry_and_a_tag_or_digest() {
        let hex = "a".repeat(64);
        let r = Reference::parse(&format!("oci://reg.example.com/a/b@sha256:{hex}")).unwrap();
        assert!(r.is_pinned());
        assert_eq!(r.digest().unwrap(), format!("sha256:{hex}"));
        assert_eq!(r.name(), "reg.example.com/a/b");
        let both = Reference::parse(&format!("localhost/x:1@sha256:{hex}")).unwrap();
        assert_eq!(both.tag().as_deref(), Some("1"));
        assert!(both.is_pinned());
        assert_eq!(
            r.at("sha256:00").to_string(),
            "oci://reg.example.com/a/b@sha256:00"
        );
    }

    #[test]
    fn references_without_a_registry_or_version_are_refused() {
        for bad in [
            "oci://team/reconciler:1",
            "oci://reconciler:1",
            "oci://reg.example.com/x",
            "oci://reg.example.com/x@sha256:abc",
            "oci://reg.example.com/X:1",
        ] {
            let e = Reference::parse(bad).expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
