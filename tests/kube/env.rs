//! The Kubernetes test environment started by `scripts/kube-testenv.sh`
//! (scripts/test.sh starts it before the tests and stops it after): a real
//! kube-apiserver on loopback, its admin, and token users without roles.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// What the env file of a started test server says.
pub struct KubeEnv {
    pub admin_kubeconfig: PathBuf,
    pub kubeconfig_dir: PathBuf,
    pub apiserver_pid: i32,
    pub etcd_pid: i32,
    /// etcd's client URL.
    pub etcd_url: String,
    pub file: PathBuf,
    /// kubectl, if the test environment has one.
    pub kubectl: Option<PathBuf>,
}

impl KubeEnv {
    /// Reads the env file (`BATON_KUBE_ENV`, default
    /// `$BATON_CACHE/kube/run/env.sh`) and checks that the API server runs.
    /// Fails (never skips) when it does not.
    pub fn load() -> KubeEnv {
        let file = std::env::var_os("BATON_KUBE_ENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache_dir().join("kube/run/env.sh"));
        KubeEnv::load_from(file)
    }

    /// Reads the env file `file`; see [`KubeEnv::load`].
    pub fn load_from(file: PathBuf) -> KubeEnv {
        let help = "start the test API server first: scripts/kube-testenv.sh start \
                    (scripts/test.sh does it before running the tests)";
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            panic!(
                "no Kubernetes test environment: cannot read {}: {e}; {help}",
                file.display()
            )
        });
        let vars: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.trim_matches(['"', '\'']).to_owned()))
            .collect();
        let var = |k: &str| {
            vars.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("{} does not set {k}; {help}", file.display()))
        };
        let env = KubeEnv {
            admin_kubeconfig: var("KUBE_TEST_KUBECONFIG").into(),
            kubeconfig_dir: var("KUBE_TEST_KUBECONFIG_DIR").into(),
            apiserver_pid: var("KUBE_TEST_APISERVER_PID").parse().expect("a pid"),
            etcd_pid: var("KUBE_TEST_ETCD_PID").parse().expect("a pid"),
            etcd_url: vars.get("KUBE_TEST_ETCD_URL").cloned().unwrap_or_default(),
            file: file.clone(),
            kubectl: vars
                .get("KUBE_TEST_KUBECTL")
                .filter(|k| !k.is_empty())
                .map(PathBuf::from),
        };
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(env.apiserver_pid, 0) } == 0;
        assert!(
            alive,
            "the test API server (pid {}, from {}) is not running; {help}",
            env.apiserver_pid,
            file.display()
        );
        env
    }

    /// The kubeconfig of a token user: baton-a, baton-b, baton-c or nobody.
    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        let path = self.kubeconfig_dir.join(format!("{user}.kubeconfig"));
        assert!(
            path.is_file(),
            "{} is missing (from {})",
            path.display(),
            self.file.display()
        );
        path
    }

    pub async fn client(&self, kubeconfig: &std::path::Path) -> Client {
        let kc = Kubeconfig::read_from(kubeconfig).unwrap();
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        config.default_retry = false;
        Client::try_from(config).unwrap()
    }

    pub async fn admin(&self) -> Client {
        self.client(&self.admin_kubeconfig).await
    }

    /// The admin kubeconfig's text and its `server:` URL.
    pub fn admin_server(&self) -> (String, String) {
        let admin = std::fs::read_to_string(&self.admin_kubeconfig).unwrap();
        let server = admin
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .expect("a server in the admin kubeconfig")
            .trim_matches('"')
            .to_owned();
        (admin, server)
    }

    /// `kubectl delete leases --all -n NS` as the admin, or, without
    /// kubectl, the same through the API (a delete of the collection).
    /// Returns how it was done.
    pub async fn delete_all_leases(&self, ns: &TestNamespace) -> &'static str {
        match &self.kubectl {
            Some(kubectl) => {
                let out = std::process::Command::new(kubectl)
                    .arg("--kubeconfig")
                    .arg(&self.admin_kubeconfig)
                    .args(["delete", "leases", "--all", "-n", &ns.name])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "kubectl delete leases --all: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                "kubectl delete leases --all"
            }
            None => {
                ns.leases()
                    .delete_collection(&DeleteParams::default(), &Default::default())
                    .await
                    .unwrap();
                "a delete of every Lease through the API (no kubectl here)"
            }
        }
    }
}

impl KubeEnv {
    /// Removes the labels `keys` from the Lease `lease` as an operator
    /// would, `kubectl label lease NAME KEY- ...` (a PATCH), or, without
    /// kubectl, as a raw client would: a PUT of the object read, without
    /// them (read again on a 409). Returns how it was done.
    pub async fn drop_labels(&self, ns: &TestNamespace, lease: &str, keys: &[&str]) -> &'static str {
        match &self.kubectl {
            Some(kubectl) => {
                let out = std::process::Command::new(kubectl)
                    .arg("--kubeconfig")
                    .arg(&self.admin_kubeconfig)
                    .args(["label", "lease", lease, "-n", &ns.name])
                    .args(keys.iter().map(|k| format!("{k}-")))
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "kubectl label: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                "kubectl label"
            }
            None => loop {
                let mut object = ns.leases().get(lease).await.unwrap();
                if let Some(labels) = &mut object.metadata.labels {
                    labels.retain(|k, _| !keys.contains(&k.as_str()));
                }
                match ns.leases().replace(lease, &PostParams::default(), &object).await {
                    Ok(_) => break "a PUT without the labels (no kubectl here)",
                    Err(kube::Error::Api(status)) if status.code == 409 => continue,
                    Err(e) => panic!("dropping the labels of {lease}: {e}"),
                }
            },
        }
    }
}

/// An API server and etcd of a test's own (`scripts/kube-testenv.sh` under
/// an env file of its own), to kill, restart or configure without
/// disturbing other tests; stopped when dropped.
pub struct OwnServer {
    file: PathBuf,
}

impl OwnServer {
    /// Starts one; `apiserver_args` are added to kube-apiserver's.
    pub fn start(apiserver_args: &str) -> OwnServer {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let file = cache_dir().join(format!("kube/run/own-{}-{n}.env", std::process::id()));
        let server = OwnServer { file };
        server.script("start", apiserver_args);
        server
    }

    /// Runs `scripts/kube-testenv.sh COMMAND` on this server.
    pub fn script(&self, command: &str, apiserver_args: &str) {
        let out =
            std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kube-testenv.sh"))
                .arg(command)
                .env("BATON_KUBE_ENV", &self.file)
                .env("KUBE_TEST_APISERVER_ARGS", apiserver_args)
                .output()
                .unwrap();
        assert!(
            out.status.success(),
            "scripts/kube-testenv.sh {command} (BATON_KUBE_ENV={}): {}",
            self.file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Its env file, read afresh (a revive changes the pids).
    pub fn env(&self) -> KubeEnv {
        KubeEnv::load_from(self.file.clone())
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ =
            std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kube-testenv.sh"))
                .arg("stop")
                .env("BATON_KUBE_ENV", &self.file)
                .output();
    }
}

/// `BATON_CACHE`, as scripts/env.sh sets it.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("BATON_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/baton"))
}

/// A fresh namespace for one test, deleted when dropped (best effort).
pub struct TestNamespace {
    pub name: String,
    pub admin: Client,
    rt: tokio::runtime::Handle,
}

impl TestNamespace {
    pub async fn create(admin: Client, prefix: &str) -> TestNamespace {
        let name = format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let api: Api<Namespace> = Api::all(admin.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        api.create(&PostParams::default(), &ns).await.unwrap();
        TestNamespace {
            name,
            admin,
            rt: tokio::runtime::Handle::current(),
        }
    }

    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.admin.clone(), &self.name)
    }

    /// Creates `role` in this namespace and binds it to the token user `user`.
    pub async fn bind(&self, mut role: Role, user: &str) {
        let role_name = role.metadata.name.clone().expect("a role name");
        role.metadata.namespace = Some(self.name.clone());
        role.metadata.resource_version = None;
        Api::<Role>::namespaced(self.admin.clone(), &self.name)
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
        let binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some(format!("{role_name}-{user}")),
                namespace: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: role_name,
            },
            subjects: Some(vec![Subject {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "User".into(),
                name: user.into(),
                namespace: None,
            }]),
        };
        Api::<RoleBinding>::namespaced(self.admin.clone(), &self.name)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let api: Api<Namespace> = Api::all(self.admin.clone());
        let name = self.name.clone();
        let rt = self.rt.clone();
        // Dropped inside or outside the runtime: run the request on a thread.
        let _ = std::thread::spawn(move || {
            rt.block_on(async {
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    api.delete(&name, &DeleteParams::default()),
                )
                .await;
            })
        })
        .join();
    }
}

/// `apiserver_request_total` for `resource="leases"`, summed per verb.
pub async fn lease_requests(admin: &Client) -> BTreeMap<String, f64> {
    requests_to(admin, "leases").await
}

/// `apiserver_request_total` for `resource` (`leases`, `configmaps`),
/// summed per verb.
pub async fn requests_to(admin: &Client, resource: &str) -> BTreeMap<String, f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    requests_in(&admin.request_text(req).await.unwrap(), resource)
}

/// `apiserver_request_total` for `resource` in the API server's metrics
/// `text`, summed per verb.
pub fn requests_in(text: &str, resource: &str) -> BTreeMap<String, f64> {
    let wanted = format!("resource=\"{resource}\"");
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        if !labels.contains(&wanted) {
            continue;
        }
        let verb = labels
            .split(',')
            .find_map(|l| l.strip_prefix("verb=\""))
            .map(|v| v.trim_end_matches('"').to_owned())
            .unwrap_or_default();
        *counts.entry(verb).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    counts
}

/// `after - before`, per verb, leaving out zeros.
pub fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(verb, n)| {
            (
                verb.clone(),
                (n - before.get(verb).copied().unwrap_or(0.0)).round() as u64,
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Compacts etcd's history up to `revision` (a resourceVersion), as the
/// API server does every few minutes: watches from before it get 410 Gone.
pub fn compact_etcd(env: &KubeEnv, revision: &str) {
    assert!(
        !env.etcd_url.is_empty(),
        "{} names no etcd URL",
        env.file.display()
    );
    let out = std::process::Command::new("curl")
        .args([
            "-fsS",
            "-X",
            "POST",
            &format!("{}/v3/kv/compaction", env.etcd_url),
            "-d",
        ])
        .arg(format!("{{\"revision\": \"{revision}\", \"physical\": true}}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compacting etcd at {revision}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `baton run` configuration on the Kubernetes store in `namespace`:
/// lease duration, renew deadline, retry period and grace, and `leases`
/// leases named `lease-0000`, `lease-0001`, ...
#[allow(dead_code)] // for the benches
pub fn leases_config(
    namespace: &str,
    [ld, rd, rp, grace]: [std::time::Duration; 4],
    leases: usize,
) -> String {
    let mut text = format!(
        "[store]\nkind = \"kubernetes\"\nnamespace = {namespace:?}\n\n[defaults]\nlease-duration = \"{}ms\"\n\
         renew-deadline = \"{}ms\"\nretry-period = \"{}ms\"\ngrace = \"{}ms\"\n",
        ld.as_millis(),
        rd.as_millis(),
        rp.as_millis(),
        grace.as_millis()
    );
    for i in 0..leases {
        text.push_str(&format!("\n[[lease]]\nname = \"lease-{i:04}\"\n"));
    }
    text
}
