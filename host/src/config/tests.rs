//! Tests of [`config`](super).

use super::*;

const GOOD: &str = r#"
identity = "a"
[store]
kind = "embedded"
dir = "leases"
[defaults]
grace = "1s"
[[lease]]
name = "demo"
lease-duration = "4s"
renew-deadline = "2s"
retry-period = "500ms"
[[plugin]]
name = "ticker"
path = "t.wasm"
lease = "demo"
memory-limit = "64 MiB"
env = { A = "1" }
"#;

#[test]
fn parses_a_full_configuration() {
    let c = Config::parse(GOOD, Some(Path::new("/etc/baton/baton.toml"))).unwrap();
    assert_eq!(c.identity, "a");
    assert_eq!(
        c.store,
        StoreConfig::Embedded {
            dir: "/etc/baton/leases".into()
        }
    );
    assert_eq!(c.leases[0].timings.lease_duration, Duration::from_secs(4));
    assert_eq!(c.leases[0].timings.grace, Duration::from_secs(1));
    assert_eq!(c.plugins[0].spec.path, PathBuf::from("/etc/baton/t.wasm"));
    assert_eq!(c.plugins[0].spec.memory_limit, 64 * 1024 * 1024);
    assert_eq!(
        c.plugins[0].spec.grants.env,
        vec![("A".to_owned(), "1".to_owned())]
    );
    assert!(c.instance_pool, "the instance pool is on by default");
    assert!(c.store_declared);
    let bare = Config::parse(
        "[[lease]]\nname = \"demo\"\n",
        Some(Path::new("/etc/baton/b.toml")),
    )
    .unwrap();
    assert!(!bare.store_declared, "no [store] section");
    assert_eq!(
        bare.store,
        StoreConfig::Embedded {
            dir: "/etc/baton/.baton/leases".into()
        }
    );
    let off = Config::parse(&format!("instance-pool = false\n{GOOD}"), None).unwrap();
    assert!(!off.instance_pool);
    assert_eq!(c.control_socket, None, "the default");
    let set = Config::parse(
        &format!("control-socket = \"run/a.sock\"\n{GOOD}"),
        Some(Path::new("/etc/baton/baton.toml")),
    )
    .unwrap();
    assert_eq!(set.control_socket, Some(PathBuf::from("/etc/baton/run/a.sock")));
}

#[test]
fn unknown_fields_name_file_and_line() {
    let text = "[[lease]]\nname = \"x\"\nlease-duraton = \"4s\"\n";
    let e = Config::parse(text, Some(Path::new("b.toml")))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("b.toml:"), "{e}");
    assert!(e.contains("lease-duraton"), "{e}");
}

#[test]
fn unsafe_timings_name_the_lease_and_line() {
    let text = "[[lease]]\nname = \"x\"\nlease-duration = \"2s\"\nrenew-deadline = \"1s\"\nretry-period = \"200ms\"\ngrace = \"1s\"\n";
    let e = Config::parse(text, Some(Path::new("b.toml")))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("b.toml:2: lease \"x\": unsafe timings"), "{e}");
    assert!(
        e.contains("renew-deadline + grace + margin must be shorter than lease-duration"),
        "{e}"
    );
}

#[test]
fn undeclared_lease_is_named() {
    let text = "[[lease]]\nname = \"demo\"\n[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\nlease = \"dmo\"\n";
    let e = Config::parse(text, Some(Path::new("b.toml")))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("b.toml:6: plugin \"p\": field `lease`"), "{e}");
    assert!(e.contains("declared: demo"), "{e}");
}

#[test]
fn spreading_is_on_with_more_than_one_lease_and_its_settings_are_checked() {
    let one = Config::parse("[[lease]]\nname = \"a\"\n", None).unwrap();
    assert!(one.spread.is_none());
    let two = "[defaults]\nretry-period = \"1s\"\n[[lease]]\nname = \"a\"\n[[lease]]\nname = \"b\"\n";
    let s = Config::parse(two, None)
        .unwrap()
        .spread
        .expect("on with two leases");
    assert_eq!(s.head_start, DEFAULT_HEAD_START);
    assert_eq!(s.settle, Duration::from_secs(2));
    assert_eq!(s.member_timings.retry_period, Duration::from_secs(1));
    assert_eq!(s.member_timings.lease_duration, Duration::from_secs(7));
    s.member_timings.validate().unwrap();
    for (ld, rd, rp) in [
        (2000, 1000, 200),
        (4000, 2000, 500),
        (1000, 500, 100),
        (3000, 2000, 1000),
    ] {
        let ms = Duration::from_millis;
        let base = Timings {
            lease_duration: ms(ld),
            renew_deadline: ms(rd),
            retry_period: ms(rp),
            grace: ms(0),
            request_timeout: ms(rp).min(ms(rd) / 2),
        };
        let m = member_timings(base);
        m.validate().unwrap_or_else(|e| panic!("{base:?}: {e}"));
        assert!(m.lease_duration <= base.lease_duration);
    }
    let off = format!("{two}[spread]\nenabled = false\n");
    assert!(Config::parse(&off, None).unwrap().spread.is_none());
    let e = Config::parse(
        &format!("{two}[spread]\nhead-start = \"20s\"\n"),
        Some(Path::new("s.toml")),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("s.toml: [spread]: field `head-start`"), "{e}");
    assert!(e.contains("below the lease duration (15s)"), "{e}");
    let e = Config::parse(
        "[[lease]]\nname = \"baton-member.x\"\n",
        Some(Path::new("m.toml")),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("m.toml:2: lease \"baton-member.x\""), "{e}");
    assert!(e.contains("membership records"), "{e}");
}

#[test]
fn the_admin_address_is_off_by_default_and_checked_naming_the_field() {
    assert_eq!(Config::parse("", None).unwrap().admin_address, None);
    let c = Config::parse("admin-address = \"127.0.0.1:9090\"\n", None).unwrap();
    assert_eq!(c.admin_address, Some("127.0.0.1:9090".parse().unwrap()));
    let c = Config::parse("admin-address = \"[::]:0\"\n", None).unwrap();
    assert_eq!(c.admin_address, Some("[::]:0".parse().unwrap()));
    for bad in ["localhost:9090", "127.0.0.1", ":9090", "127.0.0.1:99999"] {
        let e = Config::parse(
            &format!("identity = \"a\"\nadmin-address = {bad:?}\n"),
            Some(Path::new("a.toml")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("a.toml:2: field `admin-address`: "), "{e}");
        assert!(e.contains("is not an IP address and port"), "{e}");
    }
    let e = Config::parse("admin-address = 9090\n", Some(Path::new("a.toml")))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("a.toml:1: field `admin-address`: must be a string"),
        "{e}"
    );
}

#[test]
fn the_advertise_address_is_any_text_without_whitespace_and_the_command_line_wins() {
    assert_eq!(Config::parse("", None).unwrap().advertise_address, None);
    for good in ["10.1.2.3:8080", "http://node-a:8080/x", "10.1.2.3"] {
        let c = Config::parse(&format!("advertise-address = {good:?}\n"), None).unwrap();
        assert_eq!(c.advertise_address.as_deref(), Some(good));
        assert_eq!(c.advertised().as_deref(), Some(good));
    }
    for (bad, why) in [("", "is empty"), ("10.1.2.3 :80", "holds whitespace")] {
        let e = Config::parse(
            &format!("identity = \"a\"\nadvertise-address = {bad:?}\n"),
            Some(Path::new("a.toml")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("a.toml:2: field `advertise-address`: "), "{e}");
        assert!(e.contains(why), "{e}");
    }
    let mut c = Config::parse("advertise-address = \"a:1\"\n", None).unwrap();
    let over = |address: &str| Overrides {
        advertise_address: Some(address.to_owned()),
        ..Overrides::default()
    };
    over("b:2").apply(&mut c).unwrap();
    assert_eq!(c.advertise_address.as_deref(), Some("b:2"));
    let e = over(" ").apply(&mut c).unwrap_err().to_string();
    assert!(
        e.starts_with("--advertise-address (or BATON_ADVERTISE_ADDRESS): "),
        "{e}"
    );
}

#[test]
fn a_blank_identity_is_refused() {
    let e = Config::parse("identity = \" \"\n", Some(Path::new("b.toml")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("field `identity` is empty"), "{e}");
}

#[test]
fn a_kubernetes_store_is_parsed_with_defaults_and_paths() {
    let text = "[store]\nkind = \"kubernetes\"\nnamespace = \"baton\"\nkubeconfig = \"kube.yaml\"\n\
                    labels = { app = \"baton\" }\n[[lease]]\nname = \"demo\"\n";
    let c = Config::parse(text, Some(Path::new("/etc/baton/baton.toml"))).unwrap();
    assert_eq!(
        c.store,
        StoreConfig::Kubernetes {
            namespace: Some("baton".into()),
            kubeconfig: Some("/etc/baton/kube.yaml".into()),
            labels: [("app".to_owned(), "baton".to_owned())].into(),
            pod: None,
            pod_namespace: None,
        }
    );
    let c = Config::parse("[store]\nkind = \"kubernetes\"\n", None).unwrap();
    assert_eq!(
        c.store,
        StoreConfig::Kubernetes {
            namespace: None,
            kubeconfig: None,
            labels: BTreeMap::new(),
            pod: None,
            pod_namespace: None,
        }
    );
    let e = Config::parse(
        "[store]\nkind = \"kubernetes\"\nnamespace = \"Bad_NS\"\n",
        Some(Path::new("k.toml")),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("k.toml: [store]: field `namespace`: invalid namespace"),
        "{e}"
    );
    let e = Config::parse(
        "[store]\nkind = \"kubernetes\"\ndir = \"x\"\n",
        Some(Path::new("k.toml")),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("unknown field `dir`"), "{e}");
    // baton's own label is not the operator's to set.
    let e = Config::parse(
        "[store]\nkind = \"kubernetes\"\nlabels = { \"baton.dev/role\" = \"x\" }\n",
        Some(Path::new("k.toml")),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("\"baton.dev/role\" is baton's own label"), "{e}");
}

#[test]
fn a_kubernetes_store_refuses_lease_durations_in_fractions_of_a_second() {
    let text = "[store]\nkind = \"kubernetes\"\n[[lease]]\nname = \"demo\"\nlease-duration = \"4500ms\"\n\
                    renew-deadline = \"2s\"\nretry-period = \"500ms\"\ngrace = \"1s\"\n";
    let e = Config::parse(text, Some(Path::new("k.toml")))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("k.toml:4: lease \"demo\": lease-duration 4s 500ms is not a whole number of seconds"),
        "{e}"
    );
    assert!(e.contains("use 4s or 5s"), "{e}");
    // The embedded store takes it.
    Config::parse(&text.replace("kubernetes", "embedded"), None).unwrap();
}

#[test]
fn default_identities_differ() {
    assert_ne!(default_identity(), default_identity());
}

#[test]
fn prefer_avoid_and_weight_are_read_and_checked() {
    let text = "weight = 3\n[[lease]]\nname = \"a\"\nprefer = [\"h1\", \"h2\"]\navoid = [\"h3\"]\n[[lease]]\nname = \"b\"\n";
    let c = Config::parse(text, None).unwrap();
    assert_eq!(c.weight, 3);
    assert_eq!(c.leases[0].placement.prefer, ["h1", "h2"]);
    assert_eq!(c.leases[0].placement.avoid, ["h3"]);
    assert!(c.leases[1].placement.is_empty());
    assert_eq!(Config::parse("", None).unwrap().weight, 1);
    let bad = |text: &str| Config::parse(text, None).unwrap_err().to_string();
    let e = bad("[[lease]]\nname = \"a\"\nprefer = [\"h1\"]\navoid = [\"h2\", \"h1\"]\n");
    assert!(
        e.contains("lease \"a\"") && e.contains("\"h1\"") && e.contains("both"),
        "{e}"
    );
    assert!(e.contains("<configuration>:2"), "{e}");
    let e = bad("[[lease]]\nname = \"a\"\navoid = [\"\"]\n");
    assert!(e.contains("lease \"a\": field `avoid`"), "{e}");
    for w in ["0", "1001", "-2"] {
        let e = bad(&format!("weight = {w}\n"));
        assert!(e.contains("field `weight`") && e.contains("1 to 1000"), "{e}");
    }
    let e = bad("[[lease]]\nname = \"a\"\nprefers = [\"h1\"]\n");
    assert!(e.contains("prefers"), "{e}");
}

#[test]
fn route_label_needs_the_kubernetes_store_and_names_its_pod() {
    let kube = "[store]\nkind = \"kubernetes\"\npod = \"baton-0\"\npod-namespace = \"apps\"\n";
    let c = Config::parse(
        &format!("{kube}[[lease]]\nname = \"a\"\nroute-label = true\n[[lease]]\nname = \"b\"\n"),
        None,
    )
    .unwrap();
    assert!(c.leases[0].route_label && !c.leases[1].route_label);
    assert!(matches!(
        &c.store,
        StoreConfig::Kubernetes { pod: Some(p), pod_namespace: Some(n), .. } if p == "baton-0" && n == "apps"
    ));
    let e = Config::parse(
        "[[lease]]\nname = \"a\"\nroute-label = true\n",
        Some(Path::new("e.toml")),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("e.toml:2: lease \"a\": field `route-label`") && e.contains("kind = \"kubernetes\""),
        "{e}"
    );
    let e = Config::parse(
        "[store]\nkind = \"kubernetes\"\npod-namespace = \"Bad_NS\"\n",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("invalid namespace"), "{e}");
}

#[test]
fn relative_paths_are_taken_from_the_files_folder_made_absolute() {
    let text = "cache-dir = \"compiled\"\ncoredump-dir = \"dumps\"\n[store]\nkind = \"embedded\"\ndir = \"leases\"\n";
    let cwd = std::env::current_dir().unwrap();
    // `--config run.toml`: the file's folder is the current one.
    let c = Config::parse(text, Some(Path::new("run.toml"))).unwrap();
    assert_eq!(c.cache_dir.as_deref(), Some(cwd.join("compiled").as_path()));
    assert_eq!(c.coredump_dir.as_deref(), Some(cwd.join("dumps").as_path()));
    let c = Config::parse(text, Some(Path::new("etc/baton/run.toml"))).unwrap();
    assert_eq!(
        c.cache_dir.as_deref(),
        Some(cwd.join("etc/baton/compiled").as_path())
    );
    let c = Config::parse(text, Some(Path::new("/srv/run.toml"))).unwrap();
    assert_eq!(c.cache_dir.as_deref(), Some(Path::new("/srv/compiled")));
}

/// A plugin table after `GOOD`'s lease with `extra` lines, parsed.
fn plugin_with(extra: &str) -> Result<Config, String> {
    let text = format!(
        "[[lease]]\nname = \"demo\"\n[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\nlease = \"demo\"\n{extra}"
    );
    Config::parse(&text, Some(Path::new("b.toml"))).map_err(|e| e.to_string())
}

#[test]
fn a_plugin_table_shares_its_keys_with_the_capabilities_and_refuses_the_rest_where_written() {
    // Each capability reads its own keys.
    let c = plugin_with(
        "connect = [\"10.0.0.0/8:5432\"]\nsend-buffer = \"128 KiB\"\nkeyvalue = [\"shared\"]\n\
         output-line = \"4 KiB\"\nconfig = { region = \"eu\" }\ndirs = [{ host = \"d\", guest = \"/d\" }]\n",
    )
    .unwrap();
    let grants = &c.plugins[0].spec.grants;
    assert_eq!(grants.sockets.send_buffer, 128 << 10);
    assert_eq!(grants.sockets.network.connect.len(), 1);
    assert_eq!(grants.keyvalue.buckets, ["shared"]);
    assert_eq!(grants.output.limits.line, 4 << 10);
    assert_eq!(grants.config.keys().collect::<Vec<_>>(), ["region"]);
    assert!(grants.files[0].host.is_absolute() && grants.files[0].host.ends_with("d"));
    // A key nobody reads is refused on its own line, with the keys known.
    let e = plugin_with("name-lookup = true\nconect = [\"x\"]\n").unwrap_err();
    assert!(
        e.contains("b.toml:8") && e.contains("unknown field `conect`"),
        "{e}"
    );
    assert!(e.contains("`connect`") && e.contains("`verify-key`"), "{e}");
    // A capability's entry that does not parse is pointed at, by line.
    let e = plugin_with("connect = [\n  \"10.0.0.0/8:5432\",\n  \"nowhere\",\n]\n").unwrap_err();
    assert!(e.contains("b.toml:9") && e.contains("field `connect`"), "{e}");
    // A capability's check names its key.
    let e = plugin_with("send-buffer = \"1 KiB\"\n").unwrap_err();
    assert!(e.contains("plugin \"p\": field `send-buffer`"), "{e}");
    let e = plugin_with("kubernetes = { allow = [{ verbs = [\"poke\"], groups = [\"\"], resources = [\"pods\"], namespaces = [\"a\"] }] }\n").unwrap_err();
    assert!(
        e.contains("field `kubernetes.allow[0].verbs`: \"poke\" is not a verb"),
        "{e}"
    );
    // A value of the wrong type names the key; a missing key of the
    // plugin's own is named too.
    let e = plugin_with("name-lookup = \"yes\"\n").unwrap_err();
    assert!(e.contains("b.toml:7"), "{e}");
    let e = Config::parse(
        "[[lease]]\nname = \"demo\"\n[[plugin]]\npath = \"p.wasm\"\nlease = \"demo\"\n",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("missing field `name`"), "{e}");
}
