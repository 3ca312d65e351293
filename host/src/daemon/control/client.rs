//! The client side, for `baton yield` and `baton status`: finding the
//! socket of a host and asking it.

use super::*;

/// Sends `request` to the host listening on `path` and returns its reply,
/// waiting at most `limit` for it.
pub async fn request(path: &Path, request: &Request, limit: Duration) -> Result<Reply, ClientError> {
    let exchange = async {
        let mut stream = UnixStream::connect(path).await.map_err(|e| match e.kind() {
            ErrorKind::ConnectionRefused => ClientError::Gone(path.to_owned()),
            ErrorKind::NotFound => ClientError::Missing(path.to_owned()),
            _ => ClientError::Io(path.to_owned(), format!("connecting: {e}")),
        })?;
        let mut line = serde_json::to_vec(request).expect("a request serializes");
        line.push(b'\n');
        stream
            .write_all(&line)
            .await
            .map_err(|e| ClientError::Io(path.to_owned(), format!("sending the request: {e}")))?;
        let mut answer = String::new();
        BufReader::new(stream.take(16 * 1024 * 1024))
            .read_line(&mut answer)
            .await
            .map_err(|e| ClientError::Io(path.to_owned(), format!("reading the reply: {e}")))?;
        serde_json::from_str::<Reply>(answer.trim()).map_err(|e| {
            ClientError::Io(
                path.to_owned(),
                format!("the reply is not one of baton's ({e}): {:?}", answer.trim()),
            )
        })
    };
    timeout(limit, exchange)
        .await
        .map_err(|_| ClientError::Io(path.to_owned(), format!("no reply within {}", human(limit))))?
}

/// The control socket of the host of `config_file` that `baton yield
/// LEASE --config FILE` means: `socket` (the file's `control-socket`) if
/// set; otherwise, among the live default sockets of hosts running that
/// file on this machine (of `identity` only, if given), the only one, or
/// the one that leads `lease`. The error says what was found.
pub async fn find_socket(
    config_file: &Path,
    socket: Option<&Path>,
    identity: Option<&str>,
    lease: &str,
) -> Result<PathBuf, String> {
    if let Some(p) = socket {
        return Ok(p.to_owned());
    }
    let want = std::fs::canonicalize(config_file).unwrap_or_else(|_| config_file.to_owned());
    let dirs = default_dirs(Some(config_file));
    let mut candidates = Vec::new();
    for dir in &dirs {
        match identity {
            Some(id) => candidates.push(dir.join(socket_name(id))),
            None => {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                let mut paths: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                    .collect();
                paths.sort();
                candidates.extend(paths);
            }
        }
    }
    let mut found: Vec<(PathBuf, Reply)> = Vec::new();
    for path in candidates {
        if let Ok(reply) = request(&path, &Request::Leases, Duration::from_secs(5)).await
            && reply.ok
            && reply
                .config
                .as_deref()
                .map(|c| std::fs::canonicalize(c).unwrap_or_else(|_| PathBuf::from(c)))
                .as_deref()
                == Some(want.as_path())
        {
            found.push((path, reply));
        }
    }
    let places = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(" or ");
    if found.len() == 1 {
        return Ok(found.remove(0).0);
    }
    if found.is_empty() {
        return Err(format!(
            "no running host of {} found on this machine{}: no control socket in {places} answers for it \
             (give --socket PATH, or set `control-socket` in the file)",
            config_file.display(),
            identity
                .map(|i| format!(" under identity {i}"))
                .unwrap_or_default()
        ));
    }
    let leads = |r: &Reply| {
        r.leases
            .iter()
            .any(|l| l.lease == lease && l.role == Role::Leading)
    };
    let leaders: Vec<&(PathBuf, Reply)> = found.iter().filter(|(_, r)| leads(r)).collect();
    if let [(path, _)] = leaders[..] {
        return Ok(path.clone());
    }
    let each: Vec<String> = found
        .iter()
        .map(|(_, r)| match r.leases.iter().find(|l| l.lease == lease) {
            None => format!("{}: no such lease", r.identity),
            Some(l) => match &l.holder {
                Some(h) => format!("{}: {} (held by {h}, term {})", r.identity, l.role, l.term),
                None => format!("{}: {} (term {})", r.identity, l.role, l.term),
            },
        })
        .collect();
    Err(format!(
        "{} hosts of {} run on this machine and {} of them leads {lease} ({}); name one with --identity \
         or --socket",
        found.len(),
        config_file.display(),
        if leaders.is_empty() {
            "none"
        } else {
            "more than one"
        },
        each.join("; ")
    ))
}

/// Why a host could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing at the path.
    #[error("no control socket at {0}: is the host running, with this socket?")]
    Missing(PathBuf),
    /// A socket file nobody listens on (its process is gone).
    #[error("nobody answers on the control socket {0}: the host that made it is gone")]
    Gone(PathBuf),
    /// Anything else.
    #[error("control socket {0}: {1}")]
    Io(PathBuf, String),
}
