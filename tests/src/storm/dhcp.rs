//! The relayed DHCP engine: one UDP socket on the relay address that every
//! machine's requests leave from and every answer arrives on, answers handed
//! to the waiting machine by xid, and the firmware and iPXE resend timers.
//!
//! The engine runs on a thread and runtime of its own. Each real machine's
//! firmware has a CPU to itself; on the machines' shared runtime, answers
//! waited behind every TFTP and HTTP task in turn, and that wait, not the
//! server, decided how long DHCP took.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::AsRawFd as _,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, bail};
use dhcproto::{
    Decodable as _, Decoder,
    v4::{DhcpOption, Message, MessageType, OptionCode},
};
use tokio::{
    net::UdpSocket,
    sync::{mpsc, oneshot},
};

use super::record::{Event, Timeline};
use crate::{frame::Req, rng::Rng};

/// What a machine needs from an OFFER or ACK.
#[derive(Clone, Debug)]
pub struct Answer {
    pub msg_type: MessageType,
    pub yiaddr: Ipv4Addr,
    pub siaddr: Ipv4Addr,
    pub server_id: Option<Ipv4Addr>,
    /// Option 67, else the `file` field.
    pub bootfile: Option<String>,
    /// When it arrived, since the storm's t0.
    pub at: Duration,
}

impl Answer {
    /// Reads a BOOTREPLY; `None` when it is not one.
    pub fn parse(buf: &[u8]) -> Option<(u32, Answer)> {
        let msg = Message::decode(&mut Decoder::new(buf)).ok()?;
        let msg_type = msg.opts().msg_type()?;
        let server_id = match msg.opts().get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
            _ => None,
        };
        let bootfile = match msg.opts().get(OptionCode::BootfileName) {
            Some(DhcpOption::BootfileName(name)) => Some(name.clone()),
            _ => msg.fname().map(<[u8]>::to_vec),
        }
        .map(|name| {
            let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
            String::from_utf8_lossy(&name[..end]).into_owned()
        })
        .filter(|name| !name.is_empty());
        Some((
            msg.xid(),
            Answer {
                msg_type,
                yiaddr: msg.yiaddr(),
                siaddr: msg.siaddr(),
                server_id,
                bootfile,
                at: Duration::ZERO,
            },
        ))
    }
}

/// A resend schedule: how long to wait after each send, with a uniform
/// jitter of ±`jitter` on each wait.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub waits: &'static [f64],
    pub jitter: f64,
}

/// PXE firmware (PXE 2.1 spec): 4, 8, 16, 32 s, ±0.5 s.
pub const PXE: Schedule = Schedule {
    waits: &[4.0, 8.0, 16.0, 32.0],
    jitter: 0.5,
};

/// iPXE: 1, 2, 4, 8 s.
pub const IPXE: Schedule = Schedule {
    waits: &[1.0, 2.0, 4.0, 8.0],
    jitter: 0.0,
};

impl Schedule {
    /// The waits for one exchange, jitter drawn from `rng`.
    pub fn draw(&self, rng: &mut Rng) -> Vec<Duration> {
        self.waits
            .iter()
            .map(|wait| {
                let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                Duration::from_secs_f64((wait + (unit * 2.0 - 1.0) * self.jitter).max(0.0))
            })
            .collect()
    }
}

/// The shared relay socket and who waits for which xid.
pub struct Engine {
    socket: UdpSocket,
    server: SocketAddrV4,
    waiting: Mutex<HashMap<u32, mpsc::UnboundedSender<Answer>>>,
    timeline: Arc<Timeline>,
    /// The engine thread's runtime, where every exchange runs.
    runtime: tokio::runtime::Handle,
    stop: Mutex<Option<(oneshot::Sender<()>, std::thread::JoinHandle<()>)>>,
}

/// A machine's claim on an xid; answers to it arrive on `answers` until it
/// is dropped.
pub struct Round {
    engine: Arc<Engine>,
    xid: u32,
    answers: mpsc::UnboundedReceiver<Answer>,
}

/// What one DISCOVER/REQUEST round gave.
#[derive(Debug)]
pub struct Dora {
    /// When the first DISCOVER left, since t0.
    pub started: Duration,
    pub discover_tx: u32,
    pub request_tx: u32,
    /// The OFFER, or why there was none.
    pub offer: anyhow::Result<Answer>,
    /// The ACK, or why there was none; `None` without an OFFER.
    pub ack: Option<anyhow::Result<Answer>>,
}

impl Engine {
    /// Binds `relay:67`, sends to `server:67`, and starts the engine's
    /// thread; [`Engine::stop`] ends it.
    pub fn start(
        relay: Ipv4Addr,
        server: Ipv4Addr,
        timeline: Arc<Timeline>,
    ) -> anyhow::Result<Arc<Engine>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("failed to start the DHCP engine's runtime")?;
        let std_socket = std::net::UdpSocket::bind((relay, 67))
            .with_context(|| format!("failed to bind the relay socket {relay}:67"))?;
        std_socket.set_nonblocking(true)?;
        // A storm's answers arrive in bursts: give the kernel room to queue them.
        let size: libc::c_int = 32 << 20;
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
            // SAFETY: setsockopt on an open socket with a c_int value.
            unsafe {
                libc::setsockopt(
                    std_socket.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        let socket = {
            let _inside = runtime.enter();
            UdpSocket::from_std(std_socket)?
        };
        let engine = Arc::new(Engine {
            socket,
            server: SocketAddrV4::new(server, 67),
            waiting: Mutex::new(HashMap::new()),
            timeline,
            runtime: runtime.handle().clone(),
            stop: Mutex::new(None),
        });
        let (stop, stopped) = oneshot::channel();
        let receiver = Arc::clone(&engine);
        let thread = std::thread::Builder::new()
            .name("storm-dhcp".into())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = receiver.receive() => {}
                        _ = stopped => {}
                    }
                });
            })
            .context("failed to start the DHCP engine's thread")?;
        *engine.stop.lock().unwrap_or_else(|e| e.into_inner()) = Some((stop, thread));
        Ok(engine)
    }

    /// Ends the engine's thread; exchanges still running end with it.
    pub fn stop(&self) {
        let taken = self.stop.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((stop, thread)) = taken {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }

    /// Hands answers to the machines waiting on their xid until stopped.
    async fn receive(self: Arc<Engine>) {
        let mut buf = vec![0u8; 2048];
        loop {
            let Ok((len, _)) = self.socket.recv_from(&mut buf).await else {
                continue;
            };
            let Some((xid, mut answer)) = Answer::parse(&buf[..len]) else {
                self.timeline.count(Event::Recv);
                continue;
            };
            answer.at = self.timeline.now();
            self.timeline.count(Event::DhcpAnswer);
            let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(tx) = waiting.get(&xid) {
                let _ = tx.send(answer);
            }
        }
    }

    /// Runs DISCOVER→OFFER then REQUEST→ACK for `req` on the engine's
    /// thread, with `waits[0]` between DISCOVERs and `waits[1]` between
    /// REQUESTs; the REQUEST asks for the offered address of the offering
    /// server.
    pub async fn dora(self: &Arc<Engine>, mut req: Req, waits: [Vec<Duration>; 2]) -> Dora {
        let engine = Arc::clone(self);
        let exchange = self.runtime.spawn(async move {
            let mut round = engine.round(req.xid);
            let started = engine.timeline.now();
            req.msg_type = MessageType::Discover;
            let (offer, discover_tx) = round
                .exchange(&req.payload(), &waits[0], MessageType::Offer)
                .await;
            let mut dora = Dora {
                started,
                discover_tx,
                request_tx: 0,
                offer,
                ack: None,
            };
            let Ok(offer) = &dora.offer else {
                return dora;
            };
            req.server_id = offer.server_id;
            match leased(offer) {
                Ok(ip) => req.requested_ip = Some(ip),
                Err(err) => {
                    dora.offer = Err(err);
                    return dora;
                }
            }
            req.msg_type = MessageType::Request;
            let (ack, request_tx) = round
                .exchange(&req.payload(), &waits[1], MessageType::Ack)
                .await;
            dora.request_tx = request_tx;
            dora.ack = Some(ack);
            dora
        });
        match exchange.await {
            Ok(dora) => dora,
            Err(err) => Dora {
                started: self.timeline.now(),
                discover_tx: 0,
                request_tx: 0,
                offer: Err(anyhow::anyhow!("DHCP engine stopped: {err}")),
                ack: None,
            },
        }
    }

    /// Claims `xid` for one DHCP round.
    fn round(self: &Arc<Engine>, xid: u32) -> Round {
        let (tx, answers) = mpsc::unbounded_channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(xid, tx);
        Round {
            engine: Arc::clone(self),
            xid,
            answers,
        }
    }
}

impl Drop for Round {
    fn drop(&mut self) {
        self.engine
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.xid);
    }
}

impl Round {
    /// Sends `payload` on `waits` until an answer of type `want` arrives (a
    /// NAK fails); returns it and how many times the request was sent.
    async fn exchange(
        &mut self,
        payload: &[u8],
        waits: &[Duration],
        want: MessageType,
    ) -> (anyhow::Result<Answer>, u32) {
        let engine = &self.engine;
        let mut sent = 0;
        for wait in waits {
            if let Err(err) = engine.socket.send_to(payload, engine.server).await {
                return (Err(err).context("relay send failed"), sent);
            }
            engine.timeline.count(if sent == 0 {
                Event::Sent
            } else {
                Event::Retransmission
            });
            sent += 1;
            let deadline = tokio::time::Instant::now() + *wait;
            loop {
                match tokio::time::timeout_at(deadline, self.answers.recv()).await {
                    Ok(Some(answer)) if answer.msg_type == want => return (Ok(answer), sent),
                    Ok(Some(answer)) if answer.msg_type == MessageType::Nak => {
                        return (Err(anyhow::anyhow!("NAK")), sent);
                    }
                    Ok(Some(_)) => continue,
                    Ok(None) => return (Err(anyhow::anyhow!("engine stopped")), sent),
                    Err(_) => break,
                }
            }
        }
        (Err(anyhow::anyhow!("no {want:?} after {sent} sends")), sent)
    }
}

/// Machine `index`'s xid for DHCP round `round` (0: firmware, 1: iPXE):
/// unique across the storm (an odd multiplier is a bijection of u32), and
/// scattered like random ones.
pub fn xid(seed: u64, index: usize, round: u32) -> u32 {
    let key = (round << 24) | (index as u32 & 0x00ff_ffff);
    key.wrapping_mul(0x9e37_79b1) ^ (seed as u32).wrapping_mul(0x85eb_ca6b)
}

/// Fails unless `answer` leased an address.
pub fn leased(answer: &Answer) -> anyhow::Result<Ipv4Addr> {
    if answer.yiaddr.is_unspecified() {
        bail!("answer without an address");
    }
    Ok(answer.yiaddr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pxe_waits_stay_within_their_jitter() {
        let mut rng = Rng(7);
        for _ in 0..100 {
            let waits = PXE.draw(&mut rng);
            for (wait, base) in waits.iter().zip(PXE.waits) {
                let s = wait.as_secs_f64();
                assert!((base - 0.5..=base + 0.5).contains(&s), "{s} around {base}");
            }
        }
        let ipxe = IPXE.draw(&mut rng);
        assert_eq!(ipxe, [1, 2, 4, 8].map(Duration::from_secs));
    }

    #[test]
    fn xids_are_unique_across_machines_and_rounds() {
        let mut seen = std::collections::HashSet::new();
        for index in 0..100_000 {
            for round in 0..2 {
                assert!(seen.insert(xid(1, index, round)), "{index} {round}");
            }
        }
    }
}
