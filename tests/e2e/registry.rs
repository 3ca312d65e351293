//! Plugins from OCI registries, on real registries on loopback (Debian's
//! `docker-registry`; scripts/registry-testenv.sh starts three for the
//! suite: plain HTTP, basic authentication, TLS with a test CA; the tests
//! of a registry that goes down start one of their own):
//!
//! - a component pushed with `baton push` runs on two hosts from a tag; the
//!   tag moved to a new version is seen by both (`--watch`), runs from the
//!   next term only, and a host restarted while the registry is down runs
//!   the tag's last digest from the cache; the guests' records show no
//!   two terms side by side and nothing after a force-stop;
//! - a missing tag, a wrong digest, a missing or wrong signature, missing
//!   credentials, a container image and a registry that never answers
//!   are each refused in one line naming the plugin
//!   and the reference, while the other plugins run (over TLS, signed);
//!   credentials added to the file and a reload run the refused one;
//! - `baton push` writes what `wkg oci push` writes (the layer's title, the
//!   config's `component`: exports, imports, target), read back over HTTP,
//!   and refuses a file that does not decode, naming it;
//! - a Spin application pushed over HTTP (its locked app as the config,
//!   one wasm layer) is refused as one, by the host and by `baton pull`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::status::status;
use crate::support::*;
use crate::witness::{check_records, records_dir};
use crate::yielding::{socket_of, yield_cmd};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The registries scripts/registry-testenv.sh started.
struct Registries {
    plain: String,
    auth: String,
    user: String,
    password: String,
    tls: String,
    ca: PathBuf,
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: start the test registries with \
             `eval \"$(scripts/registry-testenv.sh start)\"` (scripts/test.sh does)"
        )
    })
}

fn registries() -> Registries {
    Registries {
        plain: var("BATON_REGISTRY_PLAIN"),
        auth: var("BATON_REGISTRY_AUTH"),
        user: var("BATON_REGISTRY_AUTH_USER"),
        password: var("BATON_REGISTRY_AUTH_PASSWORD"),
        tls: var("BATON_REGISTRY_TLS"),
        ca: PathBuf::from(var("BATON_REGISTRY_CA")),
    }
}

/// A plain-HTTP registry of the test's own, which it may stop and start.
struct OwnRegistry {
    child: Option<Child>,
    config: PathBuf,
    addr: String,
}

impl OwnRegistry {
    fn start(dir: &Path) -> OwnRegistry {
        registries(); // the same installation
        let addr = format!("127.0.0.1:{}", free_port());
        let config = dir.join("registry.yml");
        let text = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {addr}\n",
            dir.join("storage").display()
        );
        std::fs::write(&config, text).unwrap();
        let mut r = OwnRegistry {
            child: None,
            config,
            addr,
        };
        r.resume();
        r
    }

    /// Starts it (again, on the same port and storage); waits until it answers.
    fn resume(&mut self) {
        let child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start docker-registry (scripts/registry-testenv.sh install)");
        self.child = Some(child);
        let deadline = Instant::now() + SECS(20);
        while http_get(&self.addr, "/v2/").map(|(code, _)| code).ok() != Some(200) {
            assert!(
                Instant::now() < deadline,
                "the registry on {} never answered",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `baton push FILE REF ARGS…`: the digest it printed.
fn push(file: &Path, reference: &str, args: &[&str]) -> String {
    let out = baton()
        .arg("push")
        .arg(file)
        .arg(reference)
        .args(args)
        .output()
        .expect("run baton push");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "baton push {reference}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = stdout.lines().next().unwrap_or_default().to_owned();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{stdout}");
    digest
}

/// Pushes a container image's manifest (one tar layer) as `reference`,
/// with the OCI client itself: what a registry may hold besides components.
fn push_image(reference: &str) {
    use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let r: oci_client::Reference = reference.trim_start_matches("oci://").parse().unwrap();
    let client = oci_client::Client::try_from(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    })
    .unwrap();
    let layers = [ImageLayer::oci_v1(b"not a component".to_vec(), None)];
    let config = Config::oci_v1(b"{}".to_vec(), None);
    let auth = oci_client::secrets::RegistryAuth::Anonymous;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(client.push(&r, &layers, config, &auth, None))
        .unwrap();
}

/// A repository name no other run has used.
fn unique(what: &str) -> String {
    format!("e2e/{what}-{:08x}", rand_u32())
}

fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.subsec_nanos() ^ std::process::id().rotate_left(16)
}

fn starts_of(h: &Host) -> Vec<Event> {
    h.all(|e| e.is("leader task started", Some("probe")))
}

#[test]
fn a_moved_tag_runs_from_the_next_term_on_both_hosts_and_from_the_cache_when_the_registry_is_down() {
    let s = Scratch::new();
    let mut registry = OwnRegistry::start(s.dir.path());
    let r = &registry.addr.clone();
    let tag = format!("oci://{r}/{}:stable", unique("probe"));
    let plain = ["--plain-http", r.as_str()];
    let d1 = push(&guest("probe_pollable.wasm"), &tag, &plain);
    let out = baton().arg("check").arg(&tag).args(plain).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains(&format!("{tag}: ok: targets")),
        "{said}"
    );
    let data = records_dir(&s);
    let cfg = s.write(
        "baton.toml",
        &format!(
            "[store]\nkind = \"embedded\"\ndir = {store:?}\n[defaults]\nlease-duration = \"2s\"\n\
             renew-deadline = \"1s\"\nretry-period = \"200ms\"\ngrace = \"500ms\"\n\
             [registry]\nplain-http = [{r:?}]\ncache-dir = {cache:?}\npoll = \"1s\"\n\
             [[lease]]\nname = \"demo\"\n[[plugin]]\nname = \"probe\"\npath = {tag:?}\nlease = \"demo\"\n\
             inherit-env = [\"PROBE_HOST\"]\n\
             env = {{ PROBE_MODE = \"append\", PROBE_TICK_MS = \"20\", PROBE_TAG = \"probe\" }}\n\
             dirs = [{{ host = {data:?}, guest = \"/data\" }}]\n",
            store = s.store().display().to_string(),
            cache = s.dir.path().join("oci").display().to_string(),
            data = data.display().to_string(),
        ),
    );
    let start = |name: &str| {
        Host::start_opts(
            name,
            &cfg,
            Opts {
                args: &[
                    "--watch".as_ref(),
                    "--admin-address".as_ref(),
                    "127.0.0.1:0".as_ref(),
                ],
                env: &[("PROBE_HOST", name)],
                ..Opts::default()
            },
        )
    };
    let a = start("host-a");
    let first = a.wait_for(SECS(60), "a leads with the first version", |e| {
        e.is("leader task started", Some("probe"))
    });
    assert_eq!(first.str("digest"), Some(d1.as_str()), "{:?}", first.json);
    let mut b = start("host-b");
    let loaded = b.wait_for(SECS(60), "b loaded", |e| e.is("plugin loaded", Some("probe")));
    assert_eq!(loaded.str("digest"), Some(d1.as_str()));
    assert!(
        a.scrape().contains(&format!(
            "baton_plugin_source_info{{plugin=\"probe\",reference=\"{tag}\",digest=\"{d1}\"}} 1"
        )),
        "{}",
        a.scrape()
    );

    // The tag moves: both hosts see it within the poll and load the new
    // version; the running term keeps the old one.
    let d2 = push(&guest("probe_future.wasm"), &tag, &plain);
    assert_ne!(d1, d2);
    for h in [&a, &b] {
        let e = h.wait_for(SECS(30), "the new version loaded", |e| {
            e.message() == "new plugin version loaded" && e.str("digest") == Some(d2.as_str())
        });
        assert!(h.all(|e| e.message() == "a tag moved").len() == 1, "{:?}", e.json);
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(starts_of(&a).len(), 1, "the running term kept its version");
    assert!(starts_of(&b).is_empty());
    // `baton status` says which digest the leader has loaded.
    let deadline = Instant::now() + SECS(10);
    loop {
        let json: serde_json::Value =
            serde_json::from_str(&status(&cfg, &["-o".as_ref(), "json".as_ref()])).unwrap();
        let rows = json["versions"].as_array().cloned().unwrap_or_default();
        let want = serde_json::json!({"plugin": "probe", "host": "host-a", "digest": d2});
        if rows.contains(&want) {
            break;
        }
        assert!(Instant::now() < deadline, "status never showed {want}: {json}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The next term, on host-b: the new version.
    let out = yield_cmd(&[
        "demo".as_ref(),
        "--socket".as_ref(),
        socket_of(&cfg, "host-a").as_os_str(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let second = b.wait_for(SECS(30), "b leads", |e| {
        e.is("leader task started", Some("probe"))
    });
    assert_eq!(second.str("digest"), Some(d2.as_str()), "{:?}", second.json);
    assert!(second.u64("term").unwrap() > first.u64("term").unwrap());

    // The registry goes down; host-a restarts and runs the tag's last
    // digest from the cache.
    registry.stop();
    // `baton pull` with the configuration's [registry]: the cache answers.
    let out = baton()
        .arg("pull")
        .arg(&tag)
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.starts_with(&d2) && said.contains("from the cache"),
        "{said}"
    );
    let mut a = a;
    a.sigterm();
    assert!(a.wait_exit(SECS(30)).success());
    let mut a2 = start("host-a");
    let stale = a2.wait_for(SECS(60), "a runs from the cache", |e| {
        e.is("plugin loaded", Some("probe"))
    });
    assert_eq!(stale.str("digest"), Some(d2.as_str()));
    let warned = a2.wait_for(SECS(1), "the stale warning", |e| {
        e.message().starts_with("the registry cannot be asked")
    });
    assert!(
        warned.str("error").unwrap().contains(r.as_str()),
        "{:?}",
        warned.json
    );
    let out = yield_cmd(&[
        "demo".as_ref(),
        "--socket".as_ref(),
        socket_of(&cfg, "host-b").as_os_str(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let third = a2.wait_for(SECS(30), "a leads again", |e| {
        e.is("leader task started", Some("probe"))
    });
    assert_eq!(third.str("digest"), Some(d2.as_str()));
    std::thread::sleep(Duration::from_millis(300));
    for h in [&mut a2, &mut b] {
        h.sigterm();
        assert!(h.wait_exit(SECS(30)).success());
    }
    // One term at a time, and nothing after a term's force-stop time.
    let seen = check_records(&data.join("records"), &[a, a2, b]);
    assert!(seen.terms.len() >= 3, "records of three terms: {:?}", seen.terms);
}

#[test]
fn bad_references_signatures_and_credentials_are_named_and_the_others_run() {
    let reg = registries();
    let s = Scratch::new();
    let dir = s.dir.path();
    // Two P-256 key pairs, as `cosign generate-key-pair` would make (unencrypted).
    for k in ["a", "b"] {
        let key = dir.join(format!("{k}.key"));
        let ok = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out {0} && \
                 openssl ec -in {0} -pubout -out {1} 2>/dev/null",
                key.display(),
                dir.join(format!("{k}.pub")).display()
            ))
            .status()
            .unwrap();
        assert!(ok.success(), "openssl");
    }
    let wasm = guest("probe_pollable.wasm");
    let plain = ["--plain-http", reg.plain.as_str()];
    let unsigned = format!("oci://{}/{}:v1", reg.plain, unique("unsigned"));
    push(&wasm, &unsigned, &plain);
    let signed = format!("oci://{}/{}:v1", reg.plain, unique("signed"));
    let key_a = dir.join("a.key").display().to_string();
    push(
        &wasm,
        &signed,
        &["--plain-http", &reg.plain, "--sign-key", &key_a],
    );
    let over_tls = format!("oci://{}/{}:v1", reg.tls, unique("tls"));
    push(&wasm, &over_tls, &["--ca", &reg.ca.display().to_string()]);
    let creds = s.write(
        "auth.json",
        &format!(
            "{{\"auths\":{{{:?}:{{\"username\":{:?},\"password\":{:?}}}}}}}",
            reg.auth, reg.user, reg.password
        ),
    );
    let behind_auth = format!("oci://{}/{}:v1", reg.auth, unique("auth"));
    push(
        &wasm,
        &behind_auth,
        &[
            "--plain-http",
            &reg.auth,
            "--auth-file",
            &creds.display().to_string(),
        ],
    );
    let no_creds = s.write("none.json", "{\"auths\":{}}");
    let missing = format!("oci://{}/{}:v1", reg.plain, unique("missing"));
    let image = format!("oci://{}/{}:v1", reg.plain, unique("image"));
    push_image(&image);
    // A registry that takes connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow_addr = silent.local_addr().unwrap().to_string();
    let slow = format!("oci://{slow_addr}/e2e/slow:v1");
    let wrong_digest = unsigned.replace(":v1", &format!("@sha256:{}", "0".repeat(64)));
    let table = |name: &str, path: &str, extra: &str| {
        format!("\n[[plugin]]\nname = {name:?}\npath = {path:?}\nlease = \"demo\"\n{extra}")
    };
    let pub_a = format!("verify-key = {:?}\n", dir.join("a.pub").display().to_string());
    let pub_b = format!("verify-key = {:?}\n", dir.join("b.pub").display().to_string());
    let head = format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n[defaults]\nlease-duration = \"2s\"\nrenew-deadline = \"1s\"\n\
         retry-period = \"200ms\"\ngrace = \"500ms\"\n[registry]\nplain-http = [{:?}, {:?}, {:?}]\nca = {:?}\n\
         cache-dir = {:?}\nauth-file = {:?}\ntimeout = \"2s\"\n[[lease]]\nname = \"demo\"\n",
        s.store().display().to_string(),
        reg.plain,
        reg.auth,
        slow_addr,
        reg.ca.display().to_string(),
        dir.join("oci").display().to_string(),
        no_creds.display().to_string(),
    );
    let good = [table("over-tls", &over_tls, ""), table("signed", &signed, &pub_a)].concat();
    let bad = [
        table("wrong-key", &signed, &pub_b),
        table("unsigned", &unsigned, &pub_a),
        table("missing", &missing, ""),
        table("image", &image, ""),
        table("slow", &slow, ""),
        table("wrong-digest", &wrong_digest, ""),
        table("behind-auth", &behind_auth, ""),
    ]
    .concat();
    let cfg = s.write("baton.toml", &format!("{head}{good}{bad}"));
    let mut h = Host::start("host-a", &cfg);
    for p in ["over-tls", "signed"] {
        h.wait_for(SECS(60), p, |e| e.is("leader task started", Some(p)));
    }
    let refusal = |plugin: &str| -> String {
        let e = h.wait_for(SECS(5), plugin, |e| {
            e.message().starts_with("cannot pull the plugin's component") && e.str("plugin") == Some(plugin)
        });
        e.str("error").unwrap().to_owned()
    };
    let said = |plugin: &str, reference: &str, words: &[&str]| {
        let error = refusal(plugin);
        assert!(error.contains(reference), "{plugin}: {error}");
        for w in words {
            assert!(error.contains(w), "{plugin}: {w:?} not in: {error}");
        }
    };
    said(
        "wrong-key",
        &signed,
        &["signature not verified", "b.pub", "none of its 1 signature(s)"],
    );
    said("unsigned", &unsigned, &["it is not signed", ".sig"]);
    said("missing", &missing, &["not found in the registry (404"]);
    said(
        "image",
        &image,
        &[
            "not a WebAssembly component",
            "application/vnd.oci.image.layer.v1.tar",
        ],
    );
    said("slow", &slow, &["did not answer within 2s"]);
    drop(silent);
    said("wrong-digest", &wrong_digest, &["not found in the registry (404"]);
    said(
        "behind-auth",
        &behind_auth,
        &["refused access (401/403", "none.json"],
    );
    let text = h.output();
    assert!(!text.contains(&reg.password), "a password reached the log");
    // Credentials in the file, the broken plugins out: a reload runs it.
    s.write("none.json", &std::fs::read_to_string(&creds).unwrap());
    s.write(
        "baton.toml",
        &format!("{head}{good}{}", table("behind-auth", &behind_auth, "")),
    );
    h.signal(libc::SIGHUP);
    h.wait_for(SECS(60), "the reload", |e| e.message() == "reload applied");
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
    assert!(
        h.all(|e| e.message() == "new plugin version loaded" && e.str("plugin") == Some("behind-auth"))
            .len()
            == 1,
        "{}",
        tail(&h.output(), 30)
    );
}

/// One HTTP/1.1 exchange with a plain-HTTP registry: the status, the
/// headers (names in lower case) and the body.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(SECS(10))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: not an HTTP answer"));
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: {head}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    assert!(
        !headers
            .iter()
            .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked")),
        "{method} {path}: a chunked answer: {head}"
    );
    (status, headers, answer[end + 4..].to_vec())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// The manifest of `repo:reference` in the registry at `addr`, parsed.
fn get_manifest(addr: &str, repo: &str, reference: &str) -> serde_json::Value {
    let (status, _, body) = http(
        addr,
        "GET",
        &format!("/v2/{repo}/manifests/{reference}"),
        &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
        b"",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// The blob `digest` of `repo`, as the registry serves it.
fn get_blob(addr: &str, repo: &str, digest: &str) -> Vec<u8> {
    let (status, headers, body) = http(addr, "GET", &format!("/v2/{repo}/blobs/{digest}"), &[], b"");
    if (300..400).contains(&status) {
        let to = header(&headers, "location").expect("a redirect's location");
        let path = to.find("/v2/").map_or(to, |i| &to[i..]);
        let (status, _, body) = http(addr, "GET", path, &[], b"");
        assert_eq!(status, 200, "{to}");
        return body;
    }
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    body
}

/// Uploads `bytes` as a blob of `repo` (a POST, then one PUT); its digest.
fn put_blob(addr: &str, repo: &str, bytes: &[u8]) -> String {
    let digest = baton::oci::sha256(bytes);
    let (status, headers, _) = http(addr, "POST", &format!("/v2/{repo}/blobs/uploads/"), &[], b"");
    assert_eq!(status, 202, "{headers:?}");
    let location = header(&headers, "location").expect("an upload location");
    let path = location.find("/v2/").map_or(location, |i| &location[i..]);
    let sep = if path.contains('?') { '&' } else { '?' };
    let (status, _, body) = http(
        addr,
        "PUT",
        &format!("{path}{sep}digest={digest}"),
        &[("Content-Type", "application/octet-stream")],
        bytes,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    digest
}

#[test]
fn a_pushed_component_says_what_it_exports_and_imports_and_its_file_name() {
    let reg = registries();
    let repo = unique("described");
    let tag = format!("oci://{}/{repo}:v1", reg.plain);
    let plain = ["--plain-http", reg.plain.as_str()];
    let file = guest("probe_pollable.wasm");
    let digest = push(&file, &tag, &plain);
    let manifest = get_manifest(&reg.plain, &repo, &digest);
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.wasm.config.v0+json"
    );
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(layers[0]["mediaType"], "application/wasm");
    assert_eq!(
        layers[0]["annotations"]["org.opencontainers.image.title"], "probe_pollable.wasm",
        "{manifest}"
    );
    let raw = get_blob(&reg.plain, &repo, manifest["config"]["digest"].as_str().unwrap());
    let text = String::from_utf8(raw).unwrap();
    // oci-wasm's fields, in its order, the absent ones null.
    let order = [
        "\"created\":",
        "\"author\":null,",
        "\"architecture\":\"wasm\",",
        "\"os\":\"wasip2\",",
        "\"layerDigests\":",
        "\"component\":{\"exports\":",
        "\"imports\":",
        "\"target\":null}",
    ];
    let at: Vec<Option<usize>> = order.iter().map(|k| text.find(k)).collect();
    assert!(
        at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
        "{text}"
    );
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(config["layerDigests"], serde_json::json!([layers[0]["digest"]]));
    let component = &config["component"];
    assert_eq!(
        component["exports"],
        serde_json::json!(["baton:leader/health-sync@0.4.0", "baton:leader/task-sync@0.4.0"]),
        "{text}"
    );
    let imports = component["imports"].as_array().unwrap();
    assert!(
        imports
            .iter()
            .any(|i| i.as_str().unwrap().starts_with("baton:leader/"))
            && imports.iter().any(|i| i.as_str().unwrap().starts_with("wasi:")),
        "{text}"
    );
    assert!(component["target"].is_null());

    // A file with a component's preamble that does not decode: refused,
    // named, nothing pushed.
    let s = Scratch::new();
    let broken = s.dir.path().join("broken.wasm");
    std::fs::write(&broken, b"\0asm\x0d\x00\x01\x00\x7f\x05\x01\x02").unwrap();
    let broken_tag = format!("oci://{}/{repo}:broken", reg.plain);
    let out = baton()
        .arg("push")
        .arg(&broken)
        .arg(&broken_tag)
        .args(plain)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && said.contains(&format!(
                "{}: cannot be decoded as a WebAssembly component",
                broken.display()
            )),
        "{said}"
    );
    let (status, _, _) = http(
        &reg.plain,
        "GET",
        &format!("/v2/{repo}/manifests/broken"),
        &[],
        b"",
    );
    assert_eq!(status, 404);
}

#[test]
fn a_spin_application_is_refused_as_one() {
    let reg = registries();
    let s = Scratch::new();
    // Spin 1's layout: the locked app as the config, the component as a
    // wasm-to-oci layer (a real component: the layout alone refuses it).
    let repo = unique("spin");
    let spin = "application/vnd.fermyon.spin.application.v1+config";
    let locked = br#"{"spin_lock_version":0,"metadata":{"name":"hello"},"triggers":[],"components":[]}"#;
    let wasm = std::fs::read(guest("probe_pollable.wasm")).unwrap();
    let config = put_blob(&reg.plain, &repo, locked);
    let layer = put_blob(&reg.plain, &repo, &wasm);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": spin, "digest": config, "size": locked.len()},
        "layers": [{
            "mediaType": "application/vnd.wasm.content.layer.v1+wasm",
            "digest": layer,
            "size": wasm.len(),
        }],
    });
    let (status, _, body) = http(
        &reg.plain,
        "PUT",
        &format!("/v2/{repo}/manifests/v1"),
        &[("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
        manifest.to_string().as_bytes(),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let reference = format!("oci://{}/{repo}:v1", reg.plain);
    let words = format!("{reference}: a Spin application (config {spin}), not a component: ");

    let out = baton()
        .arg("pull")
        .arg(&reference)
        .args(["--plain-http", reg.plain.as_str()])
        .env("BATON_CACHE_DIR", s.dir.path().join("compiled"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains(&words), "{said}");

    let cfg = s.write(
        "baton.toml",
        &format!(
            "[store]\nkind = \"embedded\"\ndir = {:?}\n[defaults]\nlease-duration = \"2s\"\n\
             renew-deadline = \"1s\"\nretry-period = \"200ms\"\ngrace = \"500ms\"\n\
             [registry]\nplain-http = [{:?}]\ncache-dir = {:?}\n[[lease]]\nname = \"demo\"\n\
             [[plugin]]\nname = \"spin\"\npath = {reference:?}\nlease = \"demo\"\n\
             [[plugin]]\nname = \"file\"\npath = {:?}\nlease = \"demo\"\n",
            s.store().display().to_string(),
            reg.plain,
            s.dir.path().join("oci").display().to_string(),
            guest("probe_pollable.wasm").display().to_string(),
        ),
    );
    let mut h = Host::start("host-a", &cfg);
    h.wait_for(SECS(60), "the other plugin runs", |e| {
        e.is("leader task started", Some("file"))
    });
    let refused = h.wait_for(SECS(5), "the refusal", |e| {
        e.message().starts_with("cannot pull the plugin's component") && e.str("plugin") == Some("spin")
    });
    let error = refused.str("error").unwrap();
    assert!(error.contains(&words), "{error}");
    assert!(
        h.all(|e| e.is("leader task started", Some("spin"))).is_empty(),
        "{}",
        tail(&h.output(), 30)
    );
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
}
