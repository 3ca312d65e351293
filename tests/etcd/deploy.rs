//! `deploy/systemd/`: the unit verifies with `systemd-analyze`, and the
//! example configuration, pointed at the test cluster's TLS endpoints and
//! certificates, runs three hosts that elect one leader and hand over.

use std::time::Duration;

use super::*;
use crate::support::{Host, Opts, free_port, guest, http_get};

/// The repository's `deploy/systemd/` folder.
fn deploy_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd")
}

#[test]
fn the_systemd_unit_verifies_and_the_example_runs_three_hosts_over_tls() {
    // The unit, with the binary built here in place of /usr/local/bin.
    let t = EtcdTest::new("deploy");
    let unit = std::fs::read_to_string(deploy_dir().join("baton.service")).unwrap();
    let bin = support::baton().get_program().to_owned();
    let unit_file = t.scratch.write(
        "baton.service",
        &unit.replace("/usr/local/bin/baton", &bin.to_string_lossy()),
    );
    let verify = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit_file)
        .output()
        .expect("systemd-analyze (the systemd package)");
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "systemd-analyze verify baton.service: {}",
        String::from_utf8_lossy(&verify.stderr)
    );

    // The example configuration, with the test cluster's endpoints,
    // certificates, prefix and a test guest; shorter timings so that the
    // hand-over takes seconds.
    let example = std::fs::read_to_string(deploy_dir().join("baton.toml.example")).unwrap();
    let quoted = |v: &[String]| v.iter().map(|e| format!("{e:?}")).collect::<Vec<_>>().join(", ");
    let mut text = String::new();
    for line in example.lines() {
        let key = line.split('=').next().unwrap_or_default().trim();
        let replaced = match key {
            "endpoints" => format!("endpoints = [{}]", quoted(&t.env.tls_endpoints)),
            "prefix" => format!("prefix = {:?}", t.prefix),
            "ca" => format!("ca = {:?}", t.env.ca.display().to_string()),
            "cert" => format!("cert = {:?}", t.env.client_cert.display().to_string()),
            "key" => format!("key = {:?}", t.env.client_key.display().to_string()),
            "path" => format!(
                "path = {:?}",
                guest("rust_pollable_ticker.wasm").display().to_string()
            ),
            "lease-duration" => "lease-duration = \"4s\"".into(),
            "renew-deadline" => "renew-deadline = \"2s\"".into(),
            "retry-period" => "retry-period = \"500ms\"".into(),
            "grace" => "grace = \"1s\"".into(),
            "request-timeout" if text.contains("[defaults]") => "request-timeout = \"500ms\"".into(),
            _ => line.to_owned(),
        };
        text.push_str(&replaced);
        text.push('\n');
    }
    for value in [
        "\"https://10.0.0.1:2379\"",
        "\"/etc/baton/etcd-ca.pem\"",
        "\"/etc/baton/baton.pem\"",
        "\"/run/credentials/baton.service/baton-key.pem\"",
        "\"/opt/baton/plugins/",
    ] {
        assert!(
            !text.contains(value),
            "{value} was not replaced in the example:\n{text}"
        );
    }
    let cfg = t.scratch.write("baton.toml", &text);

    // Three hosts, each with its admin address and control socket (the
    // example's are one machine's).
    let mut hosts = Vec::new();
    for name in ["vm1", "vm2", "vm3"] {
        let admin = format!("127.0.0.1:{}", free_port());
        let socket = t.scratch.dir.path().join(format!("{name}.sock"));
        let socket = socket.display().to_string();
        let env = [
            ("BATON_ADMIN_ADDRESS", admin.as_str()),
            ("BATON_CONTROL_SOCKET", socket.as_str()),
        ];
        let host = Host::start_opts(
            name,
            &cfg,
            Opts {
                env: &env,
                ..Opts::default()
            },
        );
        hosts.push((host, admin));
    }
    let leading = |h: &Host| {
        h.all(|e| e.message() == "lease status changed" && e.str("lease") == Some("demo"))
            .last()
            .is_some_and(|e| e.str("role") == Some("leading"))
    };
    let ready = |admin: &str| http_get(admin, "/readyz").is_ok_and(|(code, _)| code == 200);
    let until = std::time::Instant::now() + Duration::from_secs(90);
    while !(hosts.iter().all(|(_, a)| ready(a)) && hosts.iter().filter(|(h, _)| leading(h)).count() == 1) {
        assert!(
            std::time::Instant::now() < until,
            "not three ready hosts with one leader within 90 s: ready {:?}, leading {:?}",
            hosts.iter().map(|(_, a)| ready(a)).collect::<Vec<_>>(),
            hosts.iter().map(|(h, _)| leading(h)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let first = hosts.iter().position(|(h, _)| leading(h)).unwrap();
    hosts[first]
        .0
        .wait_for(Duration::from_secs(30), "the ticker ticking", |e| {
            e.guest_line("ticker", "tick term=")
        });
    // SIGTERM, as systemd stops the unit: another host leads, by release.
    let stop = hosts[first].0.sigterm();
    assert!(hosts[first].0.wait_exit(Duration::from_secs(30)).success());
    let (old, rest) = {
        let (old, _) = hosts.remove(first);
        (old, hosts)
    };
    let next = rest
        .iter()
        .map(|(h, _)| h)
        .find(|h| {
            h.try_wait_for(Duration::from_secs(20), &|e: &support::Event| {
                e.message() == "lease status changed" && e.str("role") == Some("leading") && e.at >= stop
            })
            .is_some()
        })
        .expect("another host leads after the SIGTERM");
    let ms = support::assert_handed_over_by_release(&old, next, "demo", stop);
    println!(
        "deploy: the example configuration on 3 hosts over TLS: {} handed over to {} in {ms:.1} ms",
        old.name, next.name
    );
}
