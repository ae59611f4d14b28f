//! The kubelet's probes on a listener of their own (`--health-bind-address`, default :8081), which
//! nothing else can starve. The operations port serves `/metrics` to whoever reaches it, and a caller
//! holding its connections made every `/readyz` time out, so replicas went unready and were
//! restarted in a loop. Here each connection gets one request: its head must arrive within
//! [`HEAD_TIMEOUT`], the answer closes it, one address holds at most [`PER_ADDRESS`] connections and
//! all together at most [`TOTAL`]. When all are held, a connection from an address that holds fewer
//! than the busiest one ends that one's oldest ([`FairSlots`]): the kubelet, calling from its node's
//! address with one probe at a time, always finds room, however many addresses hold the rest.
//!
//! Hand-written rather than a second actix server: what is needed is a per-address cap at accept,
//! which actix-web's listener has no hook for, and two fixed paths (a request line) need no parser.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::state::State;

/// Connections one address may hold at once.
pub const PER_ADDRESS: usize = 8;
/// Connections held at once in all.
pub const TOTAL: usize = 512;
/// The request head must arrive within this (the kubelet's probe timeout is 2 s).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest request head read.
const MAX_HEAD: usize = 4096;

/// What `/healthz` and `/readyz` answer: the status and the text.
pub fn answer(state: &State, path: &str) -> (u16, String) {
    match path {
        "/healthz" => (200, "ok\n".to_owned()),
        "/readyz" => {
            let mut reasons = state.readiness.reasons();
            if !state.resolver.is_loaded() {
                reasons.push("certificate: no serving certificate loaded".to_owned());
            }
            if reasons.is_empty() {
                (200, "ok\n".to_owned())
            } else {
                (503, reasons.join("\n") + "\n")
            }
        }
        _ => (404, "not found\n".to_owned()),
    }
}

/// The connections held, by address, oldest first, each with the sender whose drop ends it. The
/// operations port keeps its connections in one too (`ops.rs`).
pub(super) struct FairSlots {
    held: Mutex<Held>,
    per_address: usize,
    total: usize,
}

#[derive(Default)]
struct Held {
    by_address: HashMap<IpAddr, VecDeque<(u64, oneshot::Sender<()>)>>,
    count: usize,
    next_id: u64,
}

/// One held connection; dropped when it ends.
pub(super) struct FairSlot {
    table: Arc<FairSlots>,
    ip: IpAddr,
    id: u64,
}

impl FairSlots {
    pub(super) fn new(per_address: usize, total: usize) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::default(),
            per_address,
            total,
        })
    }

    /// A slot for a connection from `ip`, and what resolves when it is ended to make room; `None`
    /// when `ip` holds its maximum, or all are held and no address holds more than `ip`. Among the
    /// busiest addresses, the one whose oldest connection is oldest gives it up.
    pub(super) fn take(self: &Arc<Self>, ip: IpAddr) -> Option<(FairSlot, oneshot::Receiver<()>)> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mine = held.by_address.get(&ip).map_or(0, VecDeque::len);
        if mine >= self.per_address {
            return None;
        }
        if held.count >= self.total {
            let busiest = held
                .by_address
                .iter_mut()
                .max_by_key(|(_, conns)| {
                    let oldest = conns.front().map_or(u64::MAX, |(id, _)| *id);
                    (conns.len(), std::cmp::Reverse(oldest))
                })
                .filter(|(_, conns)| conns.len() > mine)?;
            // Dropping its sender ends the busiest address's oldest connection.
            busiest.1.pop_front();
            held.count -= 1;
        }
        let (end, ended) = oneshot::channel();
        let id = held.next_id;
        held.next_id += 1;
        held.by_address.entry(ip).or_default().push_back((id, end));
        held.count += 1;
        let slot = FairSlot {
            table: self.clone(),
            ip,
            id,
        };
        Some((slot, ended))
    }
}

impl Drop for FairSlot {
    fn drop(&mut self) {
        let mut held = self.table.held.lock().unwrap_or_else(|e| e.into_inner());
        let Some(conns) = held.by_address.get_mut(&self.ip) else {
            return;
        };
        // Absent when it was ended to make room (already uncounted).
        if let Some(at) = conns.iter().position(|(id, _)| *id == self.id) {
            conns.remove(at);
            let empty = conns.is_empty();
            if empty {
                held.by_address.remove(&self.ip);
            }
            held.count -= 1;
        }
    }
}

/// Serves the probes on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, state: Arc<State>) {
    let held = FairSlots::new(PER_ADDRESS, TOTAL);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: try again shortly rather than spin.
                tracing::warn!(error = %e, "probe listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some((slot, ended)) = held.take(peer.ip()) else {
            // Closed at once: the caller holds too many already.
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::timeout(HEAD_TIMEOUT, one_request(stream, &state)) => {}
                // Ended to make room for an address holding fewer.
                _ = ended => {}
            }
            drop(slot);
        });
    }
}

async fn one_request(mut stream: TcpStream, state: &State) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, target) = (parts.next(), parts.next());
    let (status, body) = match (method, target) {
        (Some(b"GET"), Some(target)) => {
            let path = std::str::from_utf8(target).unwrap_or_default();
            answer(state, path.split('?').next().unwrap_or_default())
        }
        _ => (405, "method not allowed\n".to_owned()),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use crate::tls::CertResolver;
    use std::net::IpAddr;

    async fn from(ip: [u8; 4], to: std::net::SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((IpAddr::from(ip), 0).into()).unwrap();
        socket.connect(to).await.unwrap()
    }

    /// The probe listener on a free loopback port, with no certificate loaded.
    async fn start() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::new(Cache::empty(), Arc::new(CertResolver::new())));
        (addr, tokio::spawn(serve(listener, state)))
    }

    /// Reads until the peer closes (or 5 s: a test that hangs is a failure, not a wait).
    async fn read_to_close(stream: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn held_connections_cannot_starve_the_probes() {
        let (addr, server) = start().await;

        // One caller opens 600 connections and sends nothing (the old operations port took 64 and
        // then answered no probe).
        let mut held = Vec::new();
        for _ in 0..600 {
            held.push(from([127, 0, 0, 2], addr).await);
        }
        // A caller that sends half a head is cut off after the head timeout.
        let mut slow = from([127, 0, 0, 3], addr).await;
        slow.write_all(b"GET /readyz HTTP/1.1\r\n").await.unwrap();

        // The kubelet, from its own address, is answered.
        let mut kubelet = from([127, 0, 0, 1], addr).await;
        kubelet
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: pod\r\n\r\n")
            .await
            .unwrap();
        let answer = read_to_close(&mut kubelet).await;
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer:?}");
        assert!(
            answer.contains("no serving certificate loaded"),
            "{answer:?}"
        );
        let mut kubelet = from([127, 0, 0, 1], addr).await;
        kubelet
            .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert!(
            read_to_close(&mut kubelet)
                .await
                .starts_with("HTTP/1.1 200 OK")
        );

        // Of the 600, all but PER_ADDRESS were closed at once; the rest at the head timeout.
        let mut closed = 0;
        for stream in &mut held {
            let mut byte = [0u8; 1];
            if let Ok(Ok(0) | Err(_)) =
                tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte)).await
            {
                closed += 1;
            }
        }
        assert_eq!(closed, 600, "every held connection is closed in the end");
        assert_eq!(
            read_to_close(&mut slow).await,
            "",
            "half a head: closed unanswered"
        );
        server.abort();
    }

    /// 64 addresses holding 8 connections each fill all 512: a probe from another address ends
    /// the oldest of a busiest one and is answered. Before, it was closed unanswered until one of
    /// theirs timed out.
    #[tokio::test]
    async fn many_addresses_cannot_starve_the_probes() {
        let (addr, server) = start().await;
        let mut held = Vec::new();
        for a in 0..64u8 {
            for _ in 0..PER_ADDRESS {
                held.push(from([127, 0, 1, a + 1], addr).await);
            }
        }
        // Every one of them is held: the server has taken them all (a slot each).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut kubelet = from([127, 0, 0, 1], addr).await;
        kubelet
            .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let answer = read_to_close(&mut kubelet).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer:?}");
        server.abort();
    }

    #[test]
    fn a_full_table_makes_room_only_for_an_address_holding_fewer() {
        use oneshot::error::TryRecvError::{Closed, Empty};
        let table = FairSlots::new(2, 4);
        let ip = |n: u8| IpAddr::from([10, 0, 0, n]);
        let mut a: Vec<_> = (0..2).map(|_| table.take(ip(1)).unwrap()).collect();
        let mut b: Vec<_> = (0..2).map(|_| table.take(ip(2)).unwrap()).collect();
        // Full, two addresses holding two each: a third address ends the oldest of the busiest.
        let _c = table.take(ip(3)).unwrap();
        assert_eq!(a[0].1.try_recv(), Err(Closed));
        assert_eq!(a[1].1.try_recv(), Err(Empty));
        assert_eq!(b[0].1.try_recv(), Err(Empty));
        // An address at its cap gets nothing; one holding as many as the busiest neither.
        assert!(table.take(ip(2)).is_none());
        let (_d, _) = table.take(ip(4)).unwrap(); // ends address 2's oldest (busiest)
        assert_eq!(b[0].1.try_recv(), Err(Closed));
        // Now four addresses hold one each: none of them may take a second.
        for n in 1..=4 {
            assert!(table.take(ip(n)).is_none(), "address {n}");
        }
        // An ended slot dropped later is not counted twice; a live one is given back.
        a.remove(0);
        assert_eq!(table.held.lock().unwrap().count, 4);
        b.remove(1);
        assert_eq!(table.held.lock().unwrap().count, 3);
        assert!(table.take(ip(2)).is_some());
    }

    #[tokio::test]
    async fn other_methods_and_paths_are_refused() {
        let (addr, server) = start().await;
        for (request, status) in [
            (&b"POST /readyz HTTP/1.1\r\n\r\n"[..], "405"),
            (b"GET /metrics HTTP/1.1\r\n\r\n", "404"),
            (b"GET /healthz?verbose HTTP/1.1\r\n\r\n", "200"),
        ] {
            let mut stream = from([127, 0, 0, 1], addr).await;
            stream.write_all(request).await.unwrap();
            let answer = read_to_close(&mut stream).await;
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status} ")),
                "{answer:?}"
            );
        }
        server.abort();
    }
}
