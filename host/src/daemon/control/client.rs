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
) -> Result<PathBuf, FindError> {
    if let Some(p) = socket {
        return Ok(p.to_owned());
    }
    let dirs = default_dirs(Some(config_file));
    let mut found = answering(candidates(&dirs, identity), config_file).await;
    if found.len() == 1 {
        return Ok(found.remove(0).0);
    }
    if found.is_empty() {
        return Err(FindError::NoHost {
            file: config_file.to_owned(),
            identity: identity.map(str::to_owned),
            places: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(" or "),
        });
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
    Err(FindError::NoOneLeader {
        hosts: found.len(),
        file: config_file.to_owned(),
        lease: lease.to_owned(),
        none: leaders.is_empty(),
        each: found
            .iter()
            .map(|(_, r)| what_it_says(r, lease))
            .collect::<Vec<_>>()
            .join("; "),
    })
}

/// The control socket of the host of `config_file` that `baton drain
/// --config FILE` means: `socket` (the file's `control-socket`) if set;
/// otherwise the only live default socket of a host running that file on
/// this machine (of `identity` only, if given). The error says what was
/// found.
pub async fn find_host_socket(
    config_file: &Path,
    socket: Option<&Path>,
    identity: Option<&str>,
) -> Result<PathBuf, FindError> {
    if let Some(p) = socket {
        return Ok(p.to_owned());
    }
    let dirs = default_dirs(Some(config_file));
    let mut found = answering(candidates(&dirs, identity), config_file).await;
    match found.len() {
        1 => Ok(found.remove(0).0),
        0 => Err(FindError::NoHost {
            file: config_file.to_owned(),
            identity: identity.map(str::to_owned),
            places: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(" or "),
        }),
        hosts => Err(FindError::Several {
            hosts,
            file: config_file.to_owned(),
            identities: found
                .iter()
                .map(|(_, r)| r.identity.clone())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The sockets that may be a host's: its identity's default socket in each
/// of `dirs`, or, without an identity, every socket there (sorted).
fn candidates(dirs: &[PathBuf], identity: Option<&str>) -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    for dir in dirs {
        if let Some(id) = identity {
            candidates.push(dir.join(socket_name(id)));
            continue;
        }
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
    candidates
}

/// The candidates whose host answers and runs `config_file`, with their
/// answers.
async fn answering(candidates: Vec<PathBuf>, config_file: &Path) -> Vec<(PathBuf, Reply)> {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let want = canonical(config_file);
    let mut found = Vec::new();
    for path in candidates {
        if let Ok(reply) = request(&path, &Request::Leases, Duration::from_secs(5)).await
            && reply.ok
            && reply.config.as_deref().map(|c| canonical(Path::new(c))) == Some(want.clone())
        {
            found.push((path, reply));
        }
    }
    found
}

/// What a host's answer says of `lease`, in an error.
fn what_it_says(r: &Reply, lease: &str) -> String {
    match r.leases.iter().find(|l| l.lease == lease) {
        None => format!("{}: no such lease", r.identity),
        Some(l) => match &l.holder {
            Some(h) => format!("{}: {} (held by {h}, term {})", r.identity, l.role, l.term),
            None => format!("{}: {} (term {})", r.identity, l.role, l.term),
        },
    }
}

/// Why no host's control socket was chosen.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// No host of the file answers.
    #[error(
        "no running host of {} found on this machine{}: no control socket in {places} answers for it \
         (give --socket PATH, or set `control-socket` in the file)",
        file.display(),
        identity.as_ref().map(|i| format!(" under identity {i}")).unwrap_or_default()
    )]
    NoHost {
        /// The configuration file.
        file: PathBuf,
        /// The identity asked for, if any.
        identity: Option<String>,
        /// The directories searched.
        places: String,
    },
    /// Several hosts answer, and the command is for one host.
    #[error(
        "{hosts} hosts of {} run on this machine ({identities}); name one with --identity or --socket",
        file.display()
    )]
    Several {
        /// How many answer.
        hosts: usize,
        /// The configuration file.
        file: PathBuf,
        /// Their identities.
        identities: String,
    },
    /// Several hosts answer, and not exactly one of them leads the lease.
    #[error(
        "{hosts} hosts of {} run on this machine and {} of them leads {lease} ({each}); name one with \
         --identity or --socket",
        file.display(),
        if *none { "none" } else { "more than one" }
    )]
    NoOneLeader {
        /// How many answer.
        hosts: usize,
        /// The configuration file.
        file: PathBuf,
        /// The lease.
        lease: String,
        /// Whether none of them leads it (otherwise more than one does).
        none: bool,
        /// What each says of the lease.
        each: String,
    },
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
