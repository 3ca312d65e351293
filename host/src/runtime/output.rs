//! Guest stdout and stderr, turned into log events tagged with the
//! plugin's name: one event per line.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

/// Lines longer than this are logged in pieces, so a guest that never
/// writes a newline cannot make the host buffer without bound.
pub const MAX_LINE: usize = 16 * 1024;

/// Which guest stream.
#[derive(Clone, Copy, Debug)]
pub enum GuestStream {
    /// The guest's stdout.
    Stdout,
    /// The guest's stderr.
    Stderr,
}

/// A WASI output stream that logs each line the guest writes.
#[derive(Clone, Debug)]
pub struct GuestOutput {
    plugin: Arc<str>,
    stream: GuestStream,
}

impl GuestOutput {
    /// Output of `plugin` on `stream`.
    pub fn new(plugin: Arc<str>, stream: GuestStream) -> GuestOutput {
        GuestOutput { plugin, stream }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(LineLogger {
            out: self.clone(),
            buf: Vec::new(),
        })
    }
}

struct LineLogger {
    out: GuestOutput,
    buf: Vec<u8>,
}

impl LineLogger {
    fn emit(&self, line: &[u8]) {
        let line = String::from_utf8_lossy(line);
        let line = line.trim_end_matches('\r');
        let plugin = &*self.out.plugin;
        match self.out.stream {
            GuestStream::Stdout => tracing::info!(target: "guest", plugin, stream = "stdout", "{line}"),
            GuestStream::Stderr => tracing::warn!(target: "guest", plugin, stream = "stderr", "{line}"),
        }
    }

    fn flush_partial(&mut self) {
        if !self.buf.is_empty() {
            let buf = std::mem::take(&mut self.buf);
            self.emit(&buf);
        }
    }
}

impl AsyncWrite for LineLogger {
    fn poll_write(mut self: Pin<&mut Self>, _cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        for &b in data {
            if b == b'\n' {
                let line = std::mem::take(&mut self.buf);
                self.emit(&line);
            } else {
                self.buf.push(b);
                if self.buf.len() >= MAX_LINE {
                    self.flush_partial();
                }
            }
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.flush_partial();
        Poll::Ready(Ok(()))
    }
}

impl Drop for LineLogger {
    fn drop(&mut self) {
        self.flush_partial();
    }
}
