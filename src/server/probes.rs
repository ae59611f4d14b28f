//! The kubelet's probes on a listener of their own (`--health-bind-address`, default :8081), which
//! nothing else can starve. The operations port serves `/metrics` to whoever reaches it, and a caller
//! holding its connections made every `/readyz` time out, so replicas went unready and were
//! restarted in a loop. Here each connection gets one request: its head must arrive within
//! [`HEAD_TIMEOUT`], the answer closes it, one address holds at most [`PER_ADDRESS`] connections and
//! all together at most [`TOTAL`]; the kubelet, calling from its node's address, always finds room.
//!
//! Hand-written rather than a second actix server: what is needed is a per-address cap at accept,
//! which actix-web's listener has no hook for, and two fixed paths (a request line) need no parser.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::per_address::PerAddress;
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

/// Serves the probes on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, state: Arc<State>) {
    let held = PerAddress::new(PER_ADDRESS, TOTAL);
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
        let Some(slot) = held.take(peer.ip()) else {
            // Closed at once: the caller holds too many already.
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(HEAD_TIMEOUT, one_request(stream, &state)).await;
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

    /// Reads until the peer closes (or 5 s: a test that hangs is a failure, not a wait).
    async fn read_to_close(stream: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn held_connections_cannot_starve_the_probes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::new(Cache::empty(), Arc::new(CertResolver::new())));
        let server = tokio::spawn(serve(listener, state));

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

    #[tokio::test]
    async fn other_methods_and_paths_are_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::new(Cache::empty(), Arc::new(CertResolver::new())));
        let server = tokio::spawn(serve(listener, state));
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
