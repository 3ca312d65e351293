//! Tests of [`control`](super).

use super::*;

#[test]
fn socket_names_are_file_names_and_distinct() {
    assert_eq!(socket_name("host-a"), "host-a.sock");
    let odd = socket_name("../x/Y");
    assert!(!odd.contains('/'), "{odd}");
    assert_ne!(socket_name("Node_A"), socket_name("node_a"));
}

#[test]
fn the_protocol_reads_as_documented() {
    let r: Request = serde_json::from_str(r#"{"command":"yield","lease":"demo","for_ms":30000}"#).unwrap();
    assert_eq!(
        r,
        Request::Yield {
            lease: "demo".into(),
            for_ms: Some(30000)
        }
    );
    let r: Request = serde_json::from_str(r#"{"command":"yield","lease":"demo"}"#).unwrap();
    assert_eq!(
        r,
        Request::Yield {
            lease: "demo".into(),
            for_ms: None
        }
    );
    let r: Request = serde_json::from_str(r#"{"command":"leases"}"#).unwrap();
    assert_eq!(r, Request::Leases);
    let reply = Reply::failed("a", Failure::NotLeader, "no".into());
    let text = serde_json::to_string(&reply).unwrap();
    assert_eq!(
        text,
        r#"{"version":1,"ok":false,"identity":"a","message":"no","failure":"not-leader"}"#
    );
}

#[tokio::test]
async fn a_socket_is_owner_only_stale_ones_are_replaced_live_ones_kept_and_it_is_removed_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub").join("h.sock");
    let first = ControlSocket::bind(&path).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let stop = CancellationToken::new();
    let host = ControlledHost {
        identity: "h".into(),
        config: None,
        leases: SharedLeases::default(),
        host: crate::election::HostHandle::default(),
    };
    let served = tokio::spawn(first.serve(host, stop.clone()));
    // A second host on the same path is refused, naming it and the pid.
    let e = ControlSocket::bind(&path).unwrap_err().to_string();
    assert!(e.contains(&path.display().to_string()), "{e}");
    assert!(e.contains("in use by a live process"), "{e}");
    // It answers.
    let reply = request(&path, &Request::Leases, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(reply.ok && reply.identity == "h", "{reply:?}");
    let reply = request(
        &path,
        &Request::Yield {
            lease: "nope".into(),
            for_ms: None,
        },
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(reply.failure, Some(Failure::NoSuchLease));
    assert!(
        reply.message.starts_with("no such lease on host h"),
        "{}",
        reply.message
    );
    stop.cancel();
    served.await.unwrap();
    assert!(!path.exists(), "removed on exit");
    assert!(!path.with_file_name("h.sock.lock").exists());

    // A socket file left by a dead process (bound, never removed) is
    // replaced; a file that is no socket is not.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let again = ControlSocket::bind(&path).unwrap();
    drop(again);
    std::fs::write(&path, "not a socket").unwrap();
    let e = ControlSocket::bind(&path).unwrap_err().to_string();
    assert!(e.contains("not a socket"), "{e}");
    // Too long a path is named.
    let long = dir.path().join("x".repeat(120));
    let e = ControlSocket::bind(&long).unwrap_err().to_string();
    assert!(e.contains("at most 107"), "{e}");
}

#[test]
fn a_default_socket_goes_beside_the_file_or_else_to_the_runtime_folder_never_into_a_shared_folder() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("baton.toml");
    let id = format!("test-{:08x}", rand::random::<u32>());
    let s = ControlSocket::bind_default(Some(&cfg), &id).unwrap().unwrap();
    assert_eq!(
        s.path(),
        dir.path().join(".baton/control").join(format!("{id}.sock"))
    );
    let mode = std::fs::metadata(dir.path().join(".baton/control"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    // Taken (by a process under the same identity): none, not another.
    assert!(ControlSocket::bind_default(Some(&cfg), &id).unwrap().is_none());
    drop(s);
    // Others may write to it: not used; the runtime folder is.
    std::fs::set_permissions(
        dir.path().join(".baton/control"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let s = ControlSocket::bind_default(Some(&cfg), &id).unwrap().unwrap();
    assert_eq!(s.path(), default_dirs(None)[0].join(format!("{id}.sock")));
    let path = s.path().to_owned();
    drop(s);
    assert!(!path.exists());
}
