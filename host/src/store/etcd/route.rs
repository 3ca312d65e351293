//! Which member the store's requests go to: one client per endpoint, and
//! every request to the current one until a request to it fails.
//!
//! A balanced channel spreads requests over the members at random and
//! keeps a connection to a hung member (its kernel still accepts) as ready
//! as any: a third of the requests would wait out their timeout, and a
//! leader would lose its term to a single stalled disk. Here a request
//! that fails for the connection's sake (unavailable, no leader, cut off
//! by its timeout) moves the store to the member that failed least
//! recently, so the elector's retry goes elsewhere; a member is tried again
//! only when every other failed since.

use std::future::Future;
use std::sync::Mutex;

use etcd_client::{Client, ConnectOptions};
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// The members' clients and the one in use.
pub(super) struct Route {
    endpoints: Vec<String>,
    connect: ConnectOptions,
    /// The bound on connecting one client (and authenticating).
    bound: std::time::Duration,
    clients: Vec<OnceCell<Client>>,
    state: Mutex<State>,
}

struct State {
    current: usize,
    /// When a request to each member last failed.
    failed: Vec<Option<Instant>>,
}

impl Route {
    pub(super) fn new(endpoints: Vec<String>, connect: ConnectOptions, bound: std::time::Duration) -> Route {
        let n = endpoints.len();
        Route {
            clients: (0..n).map(|_| OnceCell::new()).collect(),
            state: Mutex::new(State {
                current: 0,
                failed: vec![None; n],
            }),
            endpoints,
            connect,
            bound,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request to member `i` failed: unless the store moved on already,
    /// it moves to the member that failed least recently (never, first).
    pub(super) fn failed(&self, i: usize) {
        let mut state = self.state();
        state.failed[i] = Some(Instant::now());
        if state.current != i {
            return;
        }
        let next = (0..state.failed.len())
            .map(|k| (i + 1 + k) % state.failed.len())
            .min_by_key(|&k| state.failed[k])
            .unwrap_or(i);
        if next != i {
            tracing::debug!(from = %self.endpoints[i], to = %self.endpoints[next], "etcd requests move to another member");
        }
        state.current = next;
    }

    /// The current member's index and client, connected if it was not.
    pub(super) async fn attempt(&self) -> Result<Attempt<'_>, etcd_client::Error> {
        let i = self.state().current;
        let mut attempt = Attempt {
            route: self,
            index: i,
            client: None,
            done: false,
        };
        let endpoint = &self.endpoints[i];
        let client = self.clients[i]
            .get_or_try_init(|| async {
                match tokio::time::timeout(
                    self.bound,
                    Client::connect([endpoint], Some(self.connect.clone())),
                )
                .await
                {
                    Ok(connected) => connected,
                    Err(_) => Err(etcd_client::Error::IoError(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "connecting to {endpoint} timed out after {}",
                            crate::support::rounding::human(self.bound)
                        ),
                    ))),
                }
            })
            .await?;
        attempt.client = Some(client.clone());
        Ok(attempt)
    }

    /// Runs `request` on the current member's client; a failure for the
    /// connection's sake, or the request dropped before its answer (cut
    /// off by a timeout), moves the store on.
    pub(super) async fn send<T, F, R>(&self, request: F) -> Result<T, etcd_client::Error>
    where
        F: FnOnce(Client) -> R,
        R: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempt = self.attempt().await?;
        let answer = request(attempt.client()).await;
        if answer.as_ref().map_or_else(|e| !of_the_connection(e), |_| true) {
            attempt.succeeded();
        }
        answer
    }
}

/// One request's use of a member: unless it [`succeeded`](Self::succeeded),
/// its drop counts as the member's failure.
pub(super) struct Attempt<'r> {
    route: &'r Route,
    index: usize,
    client: Option<Client>,
    done: bool,
}

impl Attempt<'_> {
    /// The member's client.
    pub(super) fn client(&mut self) -> Client {
        self.client.clone().expect("a connected attempt")
    }

    /// The member's index, for [`Route::failed`].
    pub(super) fn index(&self) -> usize {
        self.index
    }

    /// The member answered.
    pub(super) fn succeeded(&mut self) {
        self.done = true;
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.route.failed(self.index);
        }
    }
}

/// Whether `e` says the member or the path to it failed, rather than the
/// request.
fn of_the_connection(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Unknown
                | Code::Internal
                | Code::Cancelled
                | Code::Aborted
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}
