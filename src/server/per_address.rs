//! Connections held per client address, on every listener: one caller (a pod that can reach the
//! port) cannot take the connections everyone else needs. A connection gets a [`Slot`] when it is
//! accepted and gives it back when it closes: on the admission port before its TLS handshake
//! ([`Held`], `mod.rs`), on the plain operations port from actix-web's `on_connect`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use actix_web::rt::net::{ActixStream, Ready as IoReady};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use actix_web::HttpResponse;
use actix_web::body::EitherBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use futures::TryFutureExt;
use futures::future::{Either, MapOk, Ready, ready};

/// The table of held connections, and its cap per address (the total is actix's
/// `max_connections`; the probe listener keeps its own fair table, `probes.rs`).
pub struct PerAddress {
    held: Mutex<HashMap<IpAddr, usize>>,
    per_address: usize,
}

/// One held connection; dropped when the connection closes.
pub struct Slot {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

/// An accepted connection with its address's slot, taken before its TLS handshake: the slot goes
/// back when the connection is dropped, however it ends (handshake timeout included).
pub struct Held<T> {
    io: T,
    _slot: Slot,
}

impl<T> Held<T> {
    pub fn new(io: T, slot: Slot) -> Self {
        Self { io, _slot: slot }
    }
}

impl Held<tokio::net::TcpStream> {
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.io.peer_addr().ok()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Held<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Held<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
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

/// A connection over its address's cap: answered 503 and closed.
#[derive(Clone, Copy, Debug)]
pub struct AddressFull(pub usize);

impl PerAddress {
    pub fn new(per_address: usize) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::default(),
            per_address,
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
    }
}

/// From actix-web's `on_connect`: puts the connection's slot into its data, or, for a connection
/// over its address's cap, shuts its socket down at once (so an idle one does not hold a
/// connection of the server until the header timeout) and marks it, should a request already be
/// on its way.
pub fn on_connect(
    table: &Arc<PerAddress>,
    tcp: Option<&tokio::net::TcpStream>,
    data: &mut actix_web::dev::Extensions,
) {
    let Some((tcp, ip)) = tcp.and_then(|t| Some((t, t.peer_addr().ok()?.ip()))) else {
        return;
    };
    match table.take(ip) {
        Some(slot) => {
            data.insert(slot);
        }
        None => {
            let _ = socket2::SockRef::from(tcp).shutdown(std::net::Shutdown::Both);
            data.insert(AddressFull(table.per_address));
        }
    }
}

/// What [`refuse_when_full`] returns: the refusal at once, or the service's answer.
type Answer<S, B> = Either<
    Ready<Result<ServiceResponse<EitherBody<B>>, actix_web::Error>>,
    MapOk<
        <S as Service<ServiceRequest>>::Future,
        fn(ServiceResponse<B>) -> ServiceResponse<EitherBody<B>>,
    >,
>;

/// Middleware (`wrap_fn`): a request on a connection over its address's cap is answered 503 and
/// the connection closed, before any handler runs.
pub fn refuse_when_full<S, B>(req: ServiceRequest, service: &S) -> Answer<S, B>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    if let Some(AddressFull(cap)) = req.conn_data::<AddressFull>().copied() {
        let response = HttpResponse::ServiceUnavailable()
            .force_close()
            .content_type("text/plain; charset=utf-8")
            .body(format!(
                "this client address holds its maximum of {cap} connections \
                 (--max-connections-per-address); reuse one of them\n"
            ));
        return Either::Left(ready(Ok(req.into_response(response).map_into_right_body())));
    }
    let left: fn(ServiceResponse<B>) -> ServiceResponse<EitherBody<B>> =
        ServiceResponse::map_into_left_body;
    Either::Right(service.call(req).map_ok(left))
}

#[cfg(test)]
mod tests {
    use super::*;

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
