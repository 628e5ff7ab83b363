//! The JSON API's TLS listener, for `axum::serve`: TCP connections are
//! accepted here and each handshakes in a task of its own, under a
//! deadline, so a slow or failing client delays nobody else; only
//! connections that finished their handshake reach the server. Failed
//! handshakes are counted, logged at debug and forgotten. What certificate
//! is served is [`tls`](super::tls)'s.

use std::{
    io,
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use rustls::ServerConfig;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Semaphore, mpsc},
    task::JoinHandle,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tracing::debug;

use super::tls::TlsStats;

/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at most; past it, connections wait in the
/// kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// Connections that completed their TLS handshake, with their peer's
/// address.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    /// Accepts and starts the handshakes; ended when the server drops the
    /// listener at shutdown.
    accepting: JoinHandle<()>,
}

impl TlsListener {
    pub fn new(
        tcp: TcpListener,
        config: Arc<ServerConfig>,
        stats: Arc<TlsStats>,
    ) -> io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(MAX_HANDSHAKES);
        let accepting = tokio::spawn(accept(tcp, TlsAcceptor::from(config), stats, tx));
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accepting task ended: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Accepts connections until the listener is dropped, each handshaking in
/// its own task.
async fn accept(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    stats: Arc<TlsStats>,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (conn, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, most likely: give connections
                // time to close, as axum's own listener does.
                debug!(error = %e, "API accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let stats = stats.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(conn)).await;
            drop(slot);
            match handshake {
                Ok(Ok(tls)) => {
                    // Fails only when the server is gone.
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => {
                    stats.handshake_errors.fetch_add(1, Ordering::Relaxed);
                    debug!(%peer, error = %e, "API TLS handshake failed");
                }
                Err(_) => {
                    stats.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
                    debug!(%peer, "API TLS handshake timed out");
                }
            }
        });
    }
}
