use super::*;

fn config(dir: &Path, grant: &str) -> Config {
    let text = format!(
        "[store]\nkind = \"embedded\"\ndir = \"leases\"\n[[lease]]\nname = \"demo\"\n[[plugin]]\n\
         name = \"p\"\npath = \"p.wasm\"\nlease = \"demo\"\ndirs = [{{ host = {grant:?}, guest = \"/data\" }}]\n"
    );
    Config::parse(&text, Some(&dir.join("baton.toml"))).unwrap()
}

fn check(dir: &Path, grant: &str) -> Result<(), String> {
    let c = config(dir, grant);
    check_grants(&c, &dir.join("cache"), Some(&dir.join("run/h.sock"))).map_err(|e| e.to_string())
}

#[test]
fn resolve_follows_symlinks_and_missing_tails() {
    let t = tempfile::tempdir().unwrap();
    let real = std::fs::canonicalize(t.path()).unwrap();
    std::fs::create_dir(real.join("a")).unwrap();
    std::os::unix::fs::symlink(real.join("a"), real.join("link")).unwrap();
    assert_eq!(resolve(&real.join("link/x/../y")), real.join("a/y"));
    assert_eq!(resolve(&real.join("link/./z")), real.join("a/z"));
    // A dangling symlink: where it points.
    std::os::unix::fs::symlink(real.join("later"), real.join("dangling")).unwrap();
    assert_eq!(resolve(&real.join("dangling/q")), real.join("later/q"));
}

#[test]
fn grants_over_or_inside_the_hosts_own_files_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    std::fs::create_dir_all(d.join("data")).unwrap();
    std::fs::create_dir_all(d.join("leases/demo.lease")).unwrap();
    // A folder of its own: granted.
    check(d, "data").unwrap();
    // Containing the store (and the file, the cache, the socket).
    let e = check(d, ".").unwrap_err();
    assert!(
        e.contains("plugin \"p\": field `dirs`: the grant { host = "),
        "{e}"
    );
    assert!(e.contains("guest = \"/data\""), "{e}");
    assert!(e.contains("contains the embedded store's directory"), "{e}");
    assert!(e.contains("stops every host from leading"), "{e}");
    assert!(e.contains("contains the configuration file"), "{e}");
    assert!(e.contains("contains the compiled-code cache"), "{e}");
    assert!(e.contains("contains the control socket "), "{e}");
    assert!(e.contains("contains the control socket's lock file"), "{e}");
    // Inside the store, and the store itself.
    let e = check(d, "leases/demo.lease").unwrap_err();
    assert!(e.contains("lies inside the embedded store's directory"), "{e}");
    assert!(!e.contains("configuration file"), "{e}");
    let e = check(d, "leases").unwrap_err();
    assert!(e.contains("is the embedded store's directory"), "{e}");
    // Inside a cache that does not exist yet.
    let e = check(d, "cache/sub").unwrap_err();
    assert!(e.contains("lies inside the compiled-code cache"), "{e}");
    // A symlink to the store, and one to a folder above it.
    std::os::unix::fs::symlink(d.join("leases"), d.join("data/store")).unwrap();
    let e = check(d, "data/store").unwrap_err();
    assert!(e.contains("is the embedded store's directory"), "{e}");
    assert!(e.contains("(resolved: "), "{e}");
    let up = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(d, up.path().join("up")).unwrap();
    let e = check(d, &up.path().join("up").display().to_string()).unwrap_err();
    assert!(e.contains("contains the embedded store's directory"), "{e}");
}

/// A self-signed certificate (P-256), for a CA file that parses.
const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBhzCCAS2gAwIBAgIUAQitSUYBSDVnENl6H+CmtKHJiNowCgYIKoZIzj0EAwIw
GDEWMBQGA1UEAwwNYmF0b24gdGVzdCBDQTAgFw0yNjEyMDIwNTExMTlaGA8yMTI2
MTEwODA1MTExOVowGDEWMBQGA1UEAwwNYmF0b24gdGVzdCBDQTBZMBMGByqGSM49
AgEGCCqGSM49AwEHA0IABAxS08NhO2SJtBBHPDzuiKLd963qxb633DhfP5FwnUVI
Mc08bqB0G5hftierm2zeSGBjNLoIzRTgF3Fn3YMuRTqjUzBRMB0GA1UdDgQWBBSz
GEQVIdqnYsBSsy/+oXTviYFOMTAfBgNVHSMEGDAWgBSzGEQVIdqnYsBSsy/+oXTv
iYFOMTAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIQC6d8k/MTuC
jmH5mF+aKAMYSdUYGL0tdkBkN98t9IkwdAIgA/I5JdSBqyXdlejKoyxS9E8bzHIy
cToc32njV4kUTis=
-----END CERTIFICATE-----
";

#[test]
fn kubeconfigs_ca_files_and_core_dumps_are_the_hosts_own() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    std::fs::create_dir_all(d.join("certs")).unwrap();
    std::fs::write(d.join("certs/ca.pem"), TEST_CA).unwrap();
    let text = "coredump-dir = \"dumps\"\n[store]\nkind = \"kubernetes\"\nkubeconfig = \"kube/config\"\n\
                [[lease]]\nname = \"demo\"\n[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\nlease = \"demo\"\n\
                http = [{ url = \"https://x.example\", ca = \"certs/ca.pem\" }]\n\
                dirs = [{ host = \"kube\", guest = \"/k\" }, { host = \"certs\", guest = \"/c\" }, \
                { host = \"dumps/x\", guest = \"/d\" }, { host = \"ok\", guest = \"/ok\" }]\n";
    let c = Config::parse(text, Some(&d.join("baton.toml"))).unwrap();
    let refused = refused_grants(&c, &own_files(&c, &d.join("cache"), None));
    assert_eq!(refused.len(), 3, "{refused:#?}");
    assert!(
        refused[0].contains("contains the store's kubeconfig"),
        "{}",
        refused[0]
    );
    assert!(refused[0].contains("credentials"), "{}", refused[0]);
    assert!(
        refused[1].contains("contains the CA file of plugin \"p\"'s `http` grant"),
        "{}",
        refused[1]
    );
    assert!(
        refused[2].contains("lies inside the core-dump directory"),
        "{}",
        refused[2]
    );
}
