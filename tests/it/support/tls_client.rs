//! A minimal HTTPS client over tokio-rustls and hyper: it pins protocol versions and ALPN, and
//! returns the certificate the server presented, which a general-purpose client hides. The
//! admission port speaks HTTP/1.1 only; [`tls_stream`] offers any ALPN list and hands back the bare
//! TLS stream, for tests that check what other offers get.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Accepts any certificate: these tests check what is served, not a chain of trust.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The protocol a connection offers by ALPN and speaks. The admission port serves HTTP/1.1 only
/// (issue 60: the API server's webhook client offers `http/1.1` alone, and HTTP/2 as actix-http
/// serves it had no stream or header-list limit); what an `h2` offer gets is checked with
/// [`tls_stream`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Proto {
    Http1,
}

type Body = BoxBody<Bytes, std::convert::Infallible>;

/// One TLS connection carrying HTTP requests, one at a time.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Body>,
    /// DER of the leaf certificate the server presented.
    pub peer_cert: Vec<u8>,
    pub tls_version: rustls::ProtocolVersion,
}

pub async fn connect(
    addr: SocketAddr,
    proto: Proto,
) -> Result<Conn, Box<dyn std::error::Error + Send + Sync>> {
    connect_with(
        addr,
        proto,
        &[&rustls::version::TLS13, &rustls::version::TLS12],
    )
    .await
}

pub async fn connect_with(
    addr: SocketAddr,
    proto: Proto,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<Conn, Box<dyn std::error::Error + Send + Sync>> {
    connect_as(addr, proto, versions, None).await
}

/// Connects presenting a client certificate (PEM chain and key) when `identity` is given.
pub async fn connect_as(
    addr: SocketAddr,
    proto: Proto,
    versions: &[&'static rustls::SupportedProtocolVersion],
    identity: Option<(&str, &str)>,
) -> Result<Conn, Box<dyn std::error::Error + Send + Sync>> {
    open(addr, proto, versions, identity, None).await
}

/// Connects from the loopback address `from` (another client address than 127.0.0.1).
pub async fn connect_from(
    addr: SocketAddr,
    proto: Proto,
    from: std::net::IpAddr,
) -> Result<Conn, Box<dyn std::error::Error + Send + Sync>> {
    let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
    open(addr, proto, &versions, None, Some(from)).await
}

async fn open(
    addr: SocketAddr,
    proto: Proto,
    versions: &[&'static rustls::SupportedProtocolVersion],
    identity: Option<(&str, &str)>,
    from: Option<std::net::IpAddr>,
) -> Result<Conn, Box<dyn std::error::Error + Send + Sync>> {
    let alpn: &[&[u8]] = match proto {
        Proto::Http1 => &[b"http/1.1"],
    };
    let (tls, _) = handshake(addr, alpn, versions, identity, from).await?;
    let (_, session) = tls.get_ref();
    let peer_cert = session
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let tls_version = session.protocol_version().ok_or("no protocol version")?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(Conn {
        sender,
        peer_cert,
        tls_version,
    })
}

/// A TLS connection offering `alpn` (no ALPN extension when empty) and the protocol the server
/// chose, with no HTTP on it yet: the test writes and reads the bytes itself. A refused handshake
/// is an `io::Error` wrapping the [`rustls::Error`] (see [`tls_error`]).
pub async fn tls_stream(
    addr: SocketAddr,
    alpn: &[&[u8]],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<
    (tokio_rustls::client::TlsStream<TcpStream>, Option<Vec<u8>>),
    Box<dyn std::error::Error + Send + Sync>,
> {
    handshake(addr, alpn, versions, None, None).await
}

/// As [`tls_stream`], offering `http/1.1`, from the loopback address `from`.
pub async fn tls_stream_from(
    addr: SocketAddr,
    from: std::net::IpAddr,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Box<dyn std::error::Error + Send + Sync>> {
    let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
    Ok(handshake(addr, &[b"http/1.1"], &versions, None, Some(from))
        .await?
        .0)
}

/// The TLS error under a failed [`tls_stream`] or [`connect`], if it was one.
pub fn tls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    error
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

async fn handshake(
    addr: SocketAddr,
    alpn: &[&[u8]],
    versions: &[&'static rustls::SupportedProtocolVersion],
    identity: Option<(&str, &str)>,
    from: Option<std::net::IpAddr>,
) -> Result<
    (tokio_rustls::client::TlsStream<TcpStream>, Option<Vec<u8>>),
    Box<dyn std::error::Error + Send + Sync>,
> {
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)));
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>()?,
            rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())?,
        )?,
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = match from {
        None => TcpStream::connect(addr).await?,
        Some(ip) => {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(ip, 0))?;
            socket.connect(addr).await?
        }
    };
    tcp.set_nodelay(true)?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let chosen = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    Ok((tls, chosen))
}

/// A plain-HTTP/1.1 connection (the operations port).
pub async fn connect_plain(
    addr: SocketAddr,
) -> Result<Conn, Box<dyn std::error::Error + Send + Sync>> {
    let tcp = TcpStream::connect(addr).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    Ok(Conn {
        sender,
        peer_cert: Vec::new(),
        tls_version: rustls::ProtocolVersion::Unknown(0),
    })
}

impl Conn {
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Vec<u8>), Box<dyn std::error::Error + Send + Sync>> {
        self.send_body(method, path, Full::new(Bytes::from(body)).boxed())
            .await
    }

    /// POSTs a body sent as the chunks arrive on `chunks`, with no Content-Length (HTTP/1.1
    /// chunked transfer encoding): a client that streams, stalls or never ends.
    pub async fn post_streaming(
        &mut self,
        path: &str,
        chunks: tokio::sync::mpsc::Receiver<Vec<u8>>,
    ) -> Result<(StatusCode, Vec<u8>), Box<dyn std::error::Error + Send + Sync>> {
        let frames = futures::stream::unfold(chunks, |mut rx| async move {
            let chunk = rx.recv().await?;
            Some((
                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from(chunk))),
                rx,
            ))
        });
        self.send_body("POST", path, StreamBody::new(frames).boxed())
            .await
    }

    async fn send_body(
        &mut self,
        method: &str,
        path: &str,
        body: Body,
    ) -> Result<(StatusCode, Vec<u8>), Box<dyn std::error::Error + Send + Sync>> {
        let (status, _, body) = self.exchange(method, path, body).await?;
        Ok((status, body))
    }

    /// A GET, with the answer's headers.
    pub async fn get_with_headers(
        &mut self,
        path: &str,
    ) -> Result<(StatusCode, hyper::HeaderMap, Vec<u8>), Box<dyn std::error::Error + Send + Sync>>
    {
        self.exchange("GET", path, Full::new(Bytes::new()).boxed())
            .await
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: Body,
    ) -> Result<(StatusCode, hyper::HeaderMap, Vec<u8>), Box<dyn std::error::Error + Send + Sync>>
    {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(body)?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let (head, body) = response.into_parts();
        let body = body.collect().await?.to_bytes().to_vec();
        Ok((head.status, head.headers, body))
    }

    pub async fn post(&mut self, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        self.send("POST", path, body).await.expect("request failed")
    }

    pub async fn get(&mut self, path: &str) -> (StatusCode, Vec<u8>) {
        self.send("GET", path, Vec::new())
            .await
            .expect("request failed")
    }
}
