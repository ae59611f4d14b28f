//! Connections held per client address on the admission port: one caller (a pod that can reach the
//! port) cannot take the connections everyone else needs. A connection gets a [`Slot`] when it is
//! accepted and gives it back when it closes, on the admission port before its TLS handshake
//! ([`Held`], `mod.rs`). (The operations and probe ports keep a fair table of their own,
//! `probes.rs`.)

use std::collections::HashMap;
use std::future::Future as _;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use actix_web::rt::net::{ActixStream, Ready as IoReady};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The table of held connections, and its cap per address (the total is actix's
/// `max_connections`; the probe listener keeps its own fair table, `probes.rs`).
pub struct PerAddress {
    held: Mutex<HashMap<IpAddr, usize>>,
    per_address: usize,
    /// Told whenever a slot goes back, for [`PerAddress::take_waiting`].
    freed: tokio::sync::Notify,
}

/// One held connection; dropped when the connection closes.
pub struct Slot {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

/// An accepted connection with its address's slot, taken before its TLS handshake: the slot goes
/// back when the connection is dropped, however it ends (handshake timeout included). Its writes
/// have a stall timeout: a client that reads none of what is sent to it for [`WRITE_STALL_TIMEOUT`]
/// gets the connection closed, and with it whatever answer was waiting to be written.
pub struct Held<T> {
    io: T,
    _slot: Slot,
    /// The address's handshake slot, until the TLS handshake is over.
    handshaking: Option<Slot>,
    /// Running while a write waits for the client to read.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    /// When the request whose first byte was read unanswered must be answered by.
    answer_by: Option<tokio::time::Instant>,
    /// The timer behind `answer_by`, made once per connection and reset per request.
    answer_timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// How long a connection may go from the first byte of a request to the next byte the server
/// writes: longer than any request takes to arrive and be answered (the read timeout, 10 s, then at
/// most the API server's 30 s), far shorter than a caller holding a half-sent request head on a
/// kept-alive connection would like (actix times out only a connection's first head).
pub const UNANSWERED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(45);

/// How long a write may wait for a client that reads nothing. The API server reads an answer as
/// it arrives; a caller that never reads would otherwise hold the answer's bytes as long as it
/// likes.
pub const WRITE_STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl<T> Held<T> {
    pub fn new(io: T, slot: Slot) -> Self {
        Self {
            io,
            _slot: slot,
            handshaking: None,
            stalled: None,
            answer_by: None,
            answer_timer: None,
        }
    }

    /// Holds `slot` of the handshakes table until [`Held::handshaken`].
    pub fn handshaking(mut self, slot: Slot) -> Self {
        self.handshaking = Some(slot);
        self
    }

    /// The TLS handshake is over: its slot goes back.
    pub fn handshaken(&mut self) {
        self.handshaking = None;
    }

    /// A read's outcome: bytes start the [`UNANSWERED_TIMEOUT`]; waiting past it is an error.
    fn unless_unanswered(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<()>>,
        read_some: bool,
    ) -> Poll<std::io::Result<()>> {
        if read_some && self.answer_by.is_none() {
            self.answer_by = Some(tokio::time::Instant::now() + UNANSWERED_TIMEOUT);
        }
        if polled.is_ready() {
            return polled;
        }
        let Some(by) = self.answer_by else {
            return Poll::Pending;
        };
        let timer = match &mut self.answer_timer {
            Some(timer) => {
                if timer.deadline() != by {
                    timer.as_mut().reset(by);
                }
                timer
            }
            none => none.insert(Box::pin(tokio::time::sleep_until(by))),
        };
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "a request got no answer within the unanswered timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Bytes written end the [`UNANSWERED_TIMEOUT`] of the request being read. Only bytes: actix
    /// flushes on every poll, and a flush that writes nothing disarmed the timer as soon as it was
    /// set (the attack review held half-sent heads on kept-alive connections for minutes).
    fn answered_if_written(&mut self, polled: &Poll<std::io::Result<usize>>) {
        if matches!(polled, Poll::Ready(Ok(n)) if *n > 0) {
            self.answer_by = None;
        }
    }

    /// A write's outcome, turned into an error once it has waited [`WRITE_STALL_TIMEOUT`].
    fn unless_stalled<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL_TIMEOUT)));
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.stalled = None;
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client read nothing of its answer for the write stall timeout",
                )))
            }
        }
    }
}

impl Held<tokio::net::TcpStream> {
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.io.peer_addr().ok()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Held<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        let read_some = buf.filled().len() > before;
        this.unless_unanswered(cx, polled, read_some)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Held<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.answered_if_written(&polled);
        this.unless_stalled(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.answered_if_written(&polled);
        this.unless_stalled(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.unless_stalled(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: ActixStream> ActixStream for Held<T> {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<IoReady>> {
        self.io.poll_read_ready(cx)
    }

    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<IoReady>> {
        self.io.poll_write_ready(cx)
    }
}

impl PerAddress {
    pub fn new(per_address: usize) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::default(),
            per_address,
            freed: tokio::sync::Notify::new(),
        })
    }

    /// A slot for a new connection from `ip`, or `None` when that address holds the maximum.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mine = held.entry(ip).or_default();
        if *mine >= self.per_address {
            if *mine == 0 {
                held.remove(&ip);
            }
            return None;
        }
        *mine += 1;
        Some(Slot {
            table: self.clone(),
            ip,
        })
    }

    /// A slot for `ip`, waiting until `until` for one of its own to go back when it holds the
    /// maximum: only that address's callers wait.
    pub async fn take_waiting(
        self: &Arc<Self>,
        ip: IpAddr,
        until: tokio::time::Instant,
    ) -> Option<Slot> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a slot given back in between is not missed.
            freed.as_mut().enable();
            if let Some(slot) = self.take(ip) {
                return Some(slot);
            }
            tokio::time::timeout_at(until, freed).await.ok()?;
        }
    }

    /// Connections `ip` holds now.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.table.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
        drop(held);
        self.table.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A client that reads nothing: the server's write waits, and fails once it has waited the
    /// write stall timeout; a client that reads keeps its connection however slowly it goes.
    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_never_reads_fails_after_the_stall_timeout() {
        let table = PerAddress::new(4);
        let ip = IpAddr::from([10, 0, 0, 1]);
        let (server, mut client) = tokio::io::duplex(1024);
        let mut held = Held::new(server, table.take(ip).unwrap());
        let started = tokio::time::Instant::now();
        let e = held.write_all(&[b'x'; 64 * 1024]).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= WRITE_STALL_TIMEOUT);
        drop(held);
        assert_eq!(
            table.held_by(ip),
            0,
            "the slot goes back with the connection"
        );

        let (server, mut reader) = tokio::io::duplex(1024);
        let mut held = Held::new(server, table.take(ip).unwrap());
        let reading = tokio::spawn(async move {
            let mut sink = Vec::new();
            let mut buf = [0u8; 512];
            loop {
                // Slower than the stall timeout in all, never stalled for it.
                tokio::time::sleep(WRITE_STALL_TIMEOUT / 4).await;
                match tokio::io::AsyncReadExt::read(&mut reader, &mut buf).await {
                    Ok(0) | Err(_) => return sink.len(),
                    Ok(n) => sink.extend_from_slice(&buf[..n]),
                }
            }
        });
        held.write_all(&[b'y'; 8 * 1024]).await.unwrap();
        drop(held);
        assert_eq!(reading.await.unwrap(), 8 * 1024);
        drop(client.shutdown().await);
    }

    /// A request head left half-sent: the connection ends once it has gone unanswered for the
    /// unanswered timeout; one answered in time keeps it.
    #[tokio::test(start_paused = true)]
    async fn a_request_left_unanswered_ends_its_connection() {
        use tokio::io::AsyncReadExt;
        let table = PerAddress::new(4);
        let ip = IpAddr::from([10, 0, 0, 1]);
        let (server, mut client) = tokio::io::duplex(1024);
        let mut held = Held::new(server, table.take(ip).unwrap());
        client
            .write_all(b"GET /healthz HTTP/1.1\r\nX-A: ")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        assert!(held.read(&mut buf).await.unwrap() > 0);
        let started = tokio::time::Instant::now();
        // actix flushes on every poll: a flush that writes nothing answers nothing.
        held.flush().await.unwrap();
        let e = tokio::time::timeout(UNANSWERED_TIMEOUT * 2, held.read(&mut buf))
            .await
            .expect("the half-sent head times out")
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= UNANSWERED_TIMEOUT - std::time::Duration::from_secs(1));

        let (server, mut client) = tokio::io::duplex(1024);
        let mut held = Held::new(server, table.take(ip).unwrap());
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(held.read(&mut buf).await.unwrap() > 0);
        held.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        // Idle after its answer: no timer runs (the keep-alive is actix's).
        let idle = tokio::time::timeout(UNANSWERED_TIMEOUT * 2, held.read(&mut buf)).await;
        assert!(idle.is_err(), "still open and waiting: {idle:?}");
    }

    /// Handshake turns: over its cap an address waits for its own to end, never another's.
    #[tokio::test(start_paused = true)]
    async fn a_turn_waits_for_its_own_address_only() {
        let table = PerAddress::new(1);
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let first = table.take(a).unwrap();
        let soon = || tokio::time::Instant::now() + std::time::Duration::from_secs(1);
        assert!(
            table.take_waiting(b, soon()).await.is_some(),
            "b is not held up by a"
        );
        assert!(
            table.take_waiting(a, soon()).await.is_none(),
            "a waits, then gives up"
        );
        let waiting = tokio::spawn({
            let table = table.clone();
            async move { table.take_waiting(a, soon()).await.is_some() }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        drop(first);
        assert!(waiting.await.unwrap(), "a's turn comes when its first ends");
    }

    #[test]
    fn slots_are_capped_per_address_and_given_back() {
        let table = PerAddress::new(2);
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let a1 = table.take(a).unwrap();
        let _a2 = table.take(a).unwrap();
        assert!(table.take(a).is_none(), "a holds its two");
        let _b = [table.take(b).unwrap(), table.take(b).unwrap()];
        assert!(table.take(b).is_none(), "b holds its two");
        drop(a1);
        assert_eq!(table.held_by(a), 1);
        assert!(table.take(a).is_some());
    }
}
