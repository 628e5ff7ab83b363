//! The server on a thread of its own with a single-threaded tokio runtime,
//! for callers that have no runtime (synchronous tools, privileged tests
//! that bind the socket inside a network namespace). It owns that thread and
//! stops it on drop; the server itself is [`Server`].

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use crate::{
    shutdown::{Shutdown, Trigger},
    sync::lock,
};

use super::{ServeError, Server, Stats, TftpConfig, TransferEvent};

/// Events kept for [`ServerThread::next_event`] before new ones are dropped.
const EVENT_QUEUE: usize = 1024;

/// A running server on its own thread; stopped and joined on drop.
pub struct ServerThread {
    stop: Trigger,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
    stats: Arc<Stats>,
    events: Mutex<mpsc::Receiver<TransferEvent>>,
    local: SocketAddr,
}

impl ServerThread {
    /// Starts serving `socket` (already bound, in whatever network
    /// namespace it was made) with `cfg`.
    pub fn spawn(socket: std::net::UdpSocket, cfg: TftpConfig) -> Result<ServerThread, ServeError> {
        let server = Server::new(cfg)?;
        let stats = server.stats();
        let local = socket.local_addr().map_err(ServeError::LocalAddr)?;
        socket.set_nonblocking(true).map_err(ServeError::Thread)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ServeError::Thread)?;
        let (stop, stopped) = Shutdown::new();
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let thread = std::thread::Builder::new()
            .name("tftp".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let socket =
                        tokio::net::UdpSocket::from_std(socket).map_err(ServeError::Thread)?;
                    server.serve(socket, Some(events_tx), stopped).await
                })
            })
            .map_err(ServeError::Thread)?;
        Ok(ServerThread {
            stop,
            thread: Some(thread),
            stats,
            events: Mutex::new(events),
            local,
        })
    }

    /// The listening address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The next transfer event, waiting up to `timeout` for one.
    pub fn next_event(&self, timeout: Duration) -> Option<TransferEvent> {
        let deadline = Instant::now() + timeout;
        let mut events = lock(&self.events);
        loop {
            if let Ok(event) = events.try_recv() {
                return Some(event);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the server and returns how it ended.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.join()
    }

    fn join(&mut self) -> Result<(), ServeError> {
        self.stop.stop();
        match self.thread.take() {
            Some(thread) => thread.join().map_err(|_| ServeError::Panicked)?,
            None => Ok(()),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Err(err) = self.join() {
            tracing::warn!("TFTP server thread: {err}");
        }
    }
}
