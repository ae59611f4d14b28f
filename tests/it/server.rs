//! The HTTPS admission server, called over real TLS connections on an ephemeral port.

use crate::support;

use std::time::Duration;

use hyper::StatusCode;
use koord_webhook::cache::{Cache, load::load_state};
use koord_webhook::entries::{self, ENDPOINTS};
use koord_webhook::features::FeatureGates;
use serde_json::{Value, json};
use support::tls_client::{Proto, connect, connect_with};
use support::{TestServer, fixture};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn quota_cache() -> Cache {
    load_state(&fixture("state/quota-tree.yaml"))
        .unwrap()
        .reader()
}

/// A request of the right shape for each path, with an object that no rule rejects.
pub(crate) fn harmless_review(path: &str, uid: &str) -> Vec<u8> {
    let spec = entries::find(path).unwrap();
    let (group, version, kind, object) = match spec.resource {
        "pods" => (
            "",
            "v1",
            "Pod",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        ),
        "nodes" => (
            "",
            "v1",
            "Node",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}),
        ),
        "elasticquotas" => (
            "scheduling.sigs.k8s.io",
            "v1alpha1",
            "ElasticQuota",
            json!({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota", "metadata": {"name": "q", "namespace": "team-a", "labels": {"quota.scheduling.koordinator.sh/parent": "parent-a"}, "annotations": {"quota.scheduling.koordinator.sh/shared-weight": "{\"cpu\":\"1\"}"}}, "spec": {"max": {"cpu": "1"}}}),
        ),
        "reservations" => (
            "scheduling.koordinator.sh",
            "v1alpha1",
            "Reservation",
            json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation", "metadata": {"name": "r"}, "spec": {"template": {}, "owners": [{"object": {"name": "x"}}]}}),
        ),
        "configmaps" => (
            "",
            "v1",
            "ConfigMap",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other", "namespace": "default"}}),
        ),
        "clustercolocationprofiles" => (
            "config.koordinator.sh",
            "v1alpha1",
            "ClusterColocationProfile",
            json!({"apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile", "metadata": {"name": "p"}, "spec": {}}),
        ),
        other => panic!("no sample for {other}"),
    };
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": spec.resource},
            "subResource": if spec.sub_resource.is_empty() { Value::Null } else { json!(spec.sub_resource) },
            "namespace": "team-a", "operation": "UPDATE", "userInfo": {"username": "u"},
            "object": object, "oldObject": object
        }
    }))
    .unwrap()
}

pub(crate) fn response_of(body: &[u8]) -> Value {
    let review: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)));
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    review["response"].clone()
}

/// Over HTTP/1.1, as the API server calls (the port speaks nothing else:
/// `http2_is_refused_and_http1_is_chosen`).
#[tokio::test]
async fn every_admission_path_answers_over_http1() {
    let server = TestServer::start(quota_cache(), FeatureGates::default()).await;
    let mut conn = connect(server.addr, Proto::Http1).await.unwrap();
    // All eight paths on one connection: keep-alive holds it open.
    for (i, spec) in ENDPOINTS.iter().enumerate() {
        let uid = format!("uid-{i}");
        let (status, body) = conn
            .post(
                &format!("{}?timeout=10s", spec.path),
                harmless_review(spec.path, &uid),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{}", spec.path);
        let response = response_of(&body);
        assert_eq!(response["uid"], uid.as_str());
        assert_eq!(response["allowed"], true, "{}: {response}", spec.path);
    }
    server.stop().await;
}

#[tokio::test]
async fn denials_and_patches_come_back_in_the_wire_format() {
    let server = TestServer::start(quota_cache(), FeatureGates::default()).await;
    let mut conn = connect(server.addr, Proto::Http1).await.unwrap();

    let denied = std::fs::read(fixture("requests/validate-pod-reserve-annotation.json")).unwrap();
    let (status, body) = conn.post(entries::VALIDATE_POD, denied).await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 400);
    assert_eq!(
        response["status"]["message"],
        "annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations"
    );

    let create = std::fs::read(fixture("requests/mutate-quota-create.json")).unwrap();
    let (_, body) = conn.post(entries::MUTATE_ELASTIC_QUOTA, create).await;
    let response = response_of(&body);
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    assert!(
        response["patch"].is_string(),
        "patch is base64 text: {response}"
    );
    server.stop().await;
}

#[tokio::test]
async fn bad_requests_get_clear_http_errors() {
    let gates: FeatureGates = "ReservationMutatingWebhook=false".parse().unwrap();
    let server = TestServer::start(Cache::empty(), gates).await;
    let mut conn = connect(server.addr, Proto::Http1).await.unwrap();

    let (status, body) = conn
        .post(entries::VALIDATE_POD, b"{not json".to_vec())
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let text = String::from_utf8(body).unwrap();
    assert!(text.starts_with("body is not an AdmissionReview"), "{text}");
    assert_eq!(text.trim_end().lines().count(), 1, "one-line reason");

    let (status, _) = conn
        .post(
            entries::VALIDATE_POD,
            br#"{"apiVersion":"v1","kind":"Pod"}"#.to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // An object that does not decode: a denied review with code 400 and the uid echoed.
    let mut review: Value =
        serde_json::from_slice(&harmless_review(entries::VALIDATE_POD, "bad-object")).unwrap();
    review["request"]["object"]["spec"]["containers"] = json!("not a list");
    let (status, body) = conn
        .post(entries::VALIDATE_POD, serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    let response = response_of(&body);
    assert_eq!(
        (response["uid"].as_str(), response["allowed"].as_bool()),
        (Some("bad-object"), Some(false))
    );
    assert_eq!(response["status"]["code"], 400);

    let (status, _) = conn
        .send("GET", entries::VALIDATE_POD, Vec::new())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _) = conn.post("/healthz", Vec::new()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // An answer given before a body is read closes its connection (the next request would start
    // inside that body): each of these on a connection of its own.
    let fresh = async || connect(server.addr, Proto::Http1).await.unwrap();
    let (status, _) = fresh()
        .await
        .send("PUT", entries::MUTATE_POD, b"{}".to_vec())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _) = fresh()
        .await
        .post("/mutate-everything", b"{}".to_vec())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = fresh()
        .await
        .post(
            entries::MUTATE_RESERVATION,
            harmless_review(entries::MUTATE_RESERVATION, "u"),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "gate off: the path is gone");
    let (status, _) = fresh()
        .await
        .post(
            &format!("{}?timeout=never", entries::MUTATE_POD),
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_and_3_mib_objects_pass() {
    let server = TestServer::start(Cache::empty(), FeatureGates::default()).await;
    let mut conn = connect(server.addr, Proto::Http1).await.unwrap();
    // An UPDATE of a 3 MiB object carries it twice (in a container's arguments: annotations hold
    // at most the API server's 256 KiB, and more is refused before any rule reads them).
    let mut review: Value =
        serde_json::from_slice(&harmless_review(entries::VALIDATE_POD, "big")).unwrap();
    let filler = "x".repeat(3 * 1024 * 1024);
    review["request"]["object"]["spec"]["containers"][0]["args"] = json!([filler]);
    review["request"]["oldObject"] = review["request"]["object"].clone();
    let (status, body) = conn
        .post(entries::VALIDATE_POD, serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response_of(&body)["allowed"], true);

    let huge = vec![b' '; 9 * 1024 * 1024];
    let (status, body) = conn.post(entries::VALIDATE_POD, huge).await;
    assert_eq!(
        status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        String::from_utf8_lossy(&body)
    );
    server.stop().await;
}

#[tokio::test]
async fn health_readiness_metrics_and_debug() {
    let server = TestServer::start(quota_cache(), FeatureGates::default()).await;
    let mut conn = connect(server.addr, Proto::Http1).await.unwrap();
    assert_eq!(conn.get("/healthz").await.0, StatusCode::OK);
    assert_eq!(conn.get("/readyz").await.0, StatusCode::OK);
    server
        .shared
        .state
        .readiness
        .set_not_ready("cache", "not synced yet");
    let (status, body) = conn.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(String::from_utf8(body).unwrap(), "cache: not synced yet\n");
    server.shared.state.readiness.set_ready("cache");
    assert_eq!(conn.get("/readyz").await.0, StatusCode::OK);

    let (_, body) = conn
        .post(
            entries::VALIDATE_POD,
            harmless_review(entries::VALIDATE_POD, "m"),
        )
        .await;
    assert_eq!(response_of(&body)["allowed"], true);
    // Metrics and the debug view are not served on the admission port, only on the operations port.
    assert_eq!(conn.get("/metrics").await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        conn.get("/debug/elastic-quota").await.0,
        StatusCode::NOT_FOUND
    );
    let mut ops = support::tls_client::connect_plain(server.ops_addr)
        .await
        .unwrap();
    assert_eq!(ops.get("/healthz").await.0, StatusCode::OK);
    assert_eq!(ops.get("/readyz").await.0, StatusCode::OK);
    let (status, body) = ops.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains(r#"koord_webhook_admission_requests_total{webhook="/validate-pod"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"koord_webhook_cache_objects{kind="ElasticQuota"} 2"#),
        "{text}"
    );
    assert!(
        text.contains("koord_webhook_admission_plugin_duration_seconds_bucket"),
        "{text}"
    );
    // Prometheus conventions: build info, the standard process metrics (unprefixed), counters in
    // _total, and every family announced with HELP and TYPE.
    assert!(
        text.contains(&format!(
            r#"koord_webhook_build_info{{version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing: {text}"
        );
    }
    let mut counters = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut words = line.split_whitespace().skip(2);
        let (name, kind) = (words.next().unwrap(), words.next().unwrap());
        assert!(
            name.starts_with("koord_webhook_") || name.starts_with("process_"),
            "{line}"
        );
        assert!(
            !name.ends_with("_not_after_seconds"),
            "a point in time is _timestamp_seconds: {line}"
        );
        if kind == "counter" {
            counters.push(name);
        }
    }
    for sample in text.lines().filter(|l| !l.starts_with('#')) {
        let name = sample.split(['{', ' ']).next().unwrap();
        if counters.contains(&name.trim_end_matches("_total")) {
            assert!(
                name.ends_with("_total"),
                "a counter sample without _total: {sample}"
            );
        }
    }

    let (status, body) = ops.get("/debug/elastic-quota").await;
    assert_eq!(status, StatusCode::OK);
    let tree: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(tree["quotaHierarchyInfo"]["parent-a"], json!(["child-a1"]));
    assert_eq!(tree["quotaInfoMap"]["child-a1"]["parentName"], "parent-a");
    assert_eq!(tree["quotaInfoMap"]["parent-a"]["isParent"], true);
    server.stop().await;

    // Without --enable-debug-endpoints the debug view does not exist.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let shared = TestServer::start(quota_cache(), FeatureGates::default())
        .await
        .shared;
    let ops = koord_webhook::server::ops::build(listener, shared, false).unwrap();
    let handle = ops.handle();
    tokio::spawn(ops);
    let mut conn = support::tls_client::connect_plain(addr).await.unwrap();
    assert_eq!(conn.get("/metrics").await.0, StatusCode::OK);
    assert_eq!(
        conn.get("/debug/elastic-quota").await.0,
        StatusCode::NOT_FOUND
    );
    handle.stop(true).await;
}

#[tokio::test]
async fn only_tls_1_2_and_1_3_are_spoken() {
    let server = TestServer::start(Cache::empty(), FeatureGates::default()).await;
    let tls12 = connect_with(server.addr, Proto::Http1, &[&rustls::version::TLS12])
        .await
        .unwrap();
    assert_eq!(tls12.tls_version, rustls::ProtocolVersion::TLSv1_2);
    let tls13 = connect(server.addr, Proto::Http1).await.unwrap();
    assert_eq!(tls13.tls_version, rustls::ProtocolVersion::TLSv1_3);

    // rustls cannot speak TLS 1.1, so send a TLS 1.1 ClientHello by hand.
    let mut hello = vec![0x03, 0x02]; // client_version TLS 1.1
    hello.extend_from_slice(&[0x42; 32]); // random
    hello.push(0); // session id
    hello.extend_from_slice(&[0x00, 0x04, 0xc0, 0x13, 0x00, 0x2f]); // two TLS 1.1 cipher suites
    hello.extend_from_slice(&[0x01, 0x00]); // null compression
    let mut handshake = vec![0x01, 0x00, (hello.len() >> 8) as u8, hello.len() as u8];
    handshake.extend_from_slice(&hello);
    let mut record = vec![
        0x16,
        0x03,
        0x02,
        (handshake.len() >> 8) as u8,
        handshake.len() as u8,
    ];
    record.extend_from_slice(&handshake);

    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(&record).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the server closes the connection");
    assert_eq!(
        answer.first(),
        Some(&0x15),
        "an alert record, not a ServerHello: {answer:02x?}"
    );
    // Fatal alert: protocol_version or handshake_failure, depending on what the hello lacks.
    assert_eq!(answer.get(5), Some(&2), "fatal alert: {answer:02x?}");
    assert!(
        matches!(answer.get(6), Some(40 | 70)),
        "refusal alert: {answer:02x?}"
    );
    server.stop().await;
}

/// Reads from `io` until a whole HTTP head has arrived, the stream ends or fails, or `within`
/// passes: the bytes read.
async fn read_head(io: &mut (impl tokio::io::AsyncRead + Unpin), within: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    got
}

/// The admission port speaks HTTP/1.1 only (issue 60). The API server's webhook client offers
/// `http/1.1` alone by ALPN (k8s.io/apiserver pkg/util/webhook/client.go: `cfg.NextProtos =
/// []string{"http/1.1"}`), and HTTP/2 as actix-http served it had no stream or header-list limit
/// (one connection opening 200,000 streams took 620 MiB). A client offering only `h2` is refused in
/// the handshake with a no_application_protocol alert; one offering `h2` and `http/1.1` gets
/// `http/1.1` and is served; the HTTP/2 connection preface sent without ALPN (prior knowledge) is
/// a malformed HTTP/1.1 request: 400, then the connection closes. Before, the server offered
/// `h2` first: both offers got `h2`.
#[tokio::test]
async fn http2_is_refused_and_http1_is_chosen() {
    use support::tls_client::{tls_error, tls_stream};
    let server = TestServer::start(Cache::empty(), FeatureGates::default()).await;
    let both = [&rustls::version::TLS13, &rustls::version::TLS12];

    for version in both {
        match tls_stream(server.addr, &[b"h2"], &[version]).await {
            Ok((_, chosen)) => panic!(
                "{:?}: an offer of h2 alone was taken, ALPN {:?}",
                version.version,
                chosen.map(|p| String::from_utf8_lossy(&p).into_owned())
            ),
            Err(e) => assert_eq!(
                tls_error(&*e),
                Some(&rustls::Error::AlertReceived(
                    rustls::AlertDescription::NoApplicationProtocol
                )),
                "{:?}: {e}",
                version.version
            ),
        }
    }

    let (mut tls, chosen) = tls_stream(server.addr, &[b"h2", b"http/1.1"], &both)
        .await
        .unwrap();
    assert_eq!(
        chosen.as_deref(),
        Some(&b"http/1.1"[..]),
        "offered h2 and http/1.1"
    );
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let answer = read_head(&mut tls, Duration::from_secs(10)).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 200 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    let (mut tls, chosen) = tls_stream(server.addr, &[], &both).await.unwrap();
    assert_eq!(chosen, None, "no ALPN offered, none chosen");
    // The client connection preface (RFC 9113 section 3.4), then an empty SETTINGS frame.
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the server closes the connection");
    // An HTTP/2 server's first bytes are its SETTINGS frame (a 9-byte header of type 4), not text.
    assert!(
        answer.starts_with(b"HTTP/1.1 400 "),
        "{:02x?}: {}",
        answer.get(..9),
        String::from_utf8_lossy(&answer)
    );
    server.stop().await;
}

/// A 404 or a 405 is answered at once, while the client is still sending a large body: the
/// status arrives within 2 s, not after the body (8 MB announced, 1 KiB sent) or the read timeout
/// (10 s), and the connection is closed after it (its body was not read). Before, both drained the
/// body for up to 10 s outside the per-connection limits.
#[tokio::test]
async fn not_found_and_method_not_allowed_answer_without_the_body() {
    use support::tls_client::tls_stream;
    let server = TestServer::start(Cache::empty(), FeatureGates::default()).await;
    let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
    for (method, path, status) in [
        ("POST", "/mutate-everything", "404"),
        ("PUT", entries::VALIDATE_POD, "405"),
    ] {
        let (mut tls, _) = tls_stream(server.addr, &[b"http/1.1"], &versions)
            .await
            .unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: 8000000\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(&[b' '; 1024]).await.unwrap();
        let sent = std::time::Instant::now();
        let answer = read_head(&mut tls, Duration::from_secs(2)).await;
        let waited = sent.elapsed();
        let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert!(
            text.starts_with(&format!("http/1.1 {status} ")),
            "{method} {path}: after {waited:?}: {text:?}"
        );
        assert!(
            waited < Duration::from_secs(2),
            "{method} {path}: answered after {waited:?}"
        );
        if status == "405" {
            assert!(text.contains("\r\nallow: post\r\n"), "{text}");
        }
        assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
        // The rest of the answer, then the end of the connection (a close, or a reset).
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut rest)).await;
        eprintln!(
            "{method} {path} with 1 KiB of 8 MB sent: {status} after {waited:?}, connection \
             ended after {:?} ({:?})",
            sent.elapsed(),
            closed.as_ref().map(|r| r.as_ref().map_err(|e| e.kind()))
        );
        assert!(
            closed.is_ok(),
            "{method} {path}: the connection stayed open after the answer"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_certificate_swap_drops_nothing_and_new_handshakes_see_it() {
    let server = TestServer::start(Cache::empty(), FeatureGates::default()).await;
    let first_cert = connect(server.addr, Proto::Http1).await.unwrap().peer_cert;
    let addr = server.addr;

    // A connection opened before the swap keeps working after it.
    let mut long_lived = connect(addr, Proto::Http1).await.unwrap();
    assert_eq!(long_lived.peer_cert, first_cert);

    let client = tokio::spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..150 {
            let mut conn = connect(addr, Proto::Http1).await.expect("handshake");
            let (status, body) = conn
                .post(
                    entries::VALIDATE_POD,
                    harmless_review(entries::VALIDATE_POD, "swap"),
                )
                .await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(response_of(&body)["allowed"], true);
            seen.push(conn.peer_cert);
        }
        seen
    });
    let mut swapped_to = Vec::new();
    for round in 0..5 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let pair = support::new_pair(&format!("rotated-{round}"));
        server
            .shared
            .state
            .resolver
            .set_pem(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes())
            .unwrap();
        swapped_to.push(
            server
                .shared
                .state
                .resolver
                .current()
                .unwrap()
                .certified
                .cert[0]
                .to_vec(),
        );
    }
    let seen = client.await.expect("no request failed during the swaps");

    let last = swapped_to.last().unwrap();
    let after = connect(addr, Proto::Http1).await.unwrap();
    assert_eq!(
        &after.peer_cert, last,
        "a new handshake presents the newest certificate"
    );
    assert_ne!(&first_cert, last);
    assert!(
        seen.iter()
            .all(|c| *c == first_cert || swapped_to.contains(c))
    );

    let (status, _) = long_lived
        .post(
            entries::VALIDATE_POD,
            harmless_review(entries::VALIDATE_POD, "old"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

/// `serve --tls-cert-file/--tls-key-file` picks up a pair replaced on disk, and refuses a
/// mismatched one while keeping the pair in service.
#[tokio::test]
async fn serve_rereads_its_certificate_files() {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let write = |pair: &koord_webhook::certs::PemPair| {
        std::fs::write(&key, &pair.key_pem).unwrap();
        std::fs::write(&cert, &pair.cert_pem).unwrap();
        CertificateDer::from_pem_slice(pair.cert_pem.as_bytes())
            .unwrap()
            .to_vec()
    };
    let first = write(&support::new_pair("first"));
    let port = support::free_port();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let _server = support::serve_files(
        port,
        &fixture("state/quota-tree.yaml"),
        (&cert, &key),
        &["--tls-reload-interval", "100ms"],
    );

    async fn served(addr: std::net::SocketAddr) -> Option<Vec<u8>> {
        connect(addr, Proto::Http1).await.ok().map(|c| c.peer_cert)
    }
    async fn until(addr: std::net::SocketAddr, want: &[u8]) -> bool {
        for _ in 0..100 {
            if served(addr).await.as_deref() == Some(want) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
    assert!(until(addr, &first).await, "the first pair is served");

    let second = write(&support::new_pair("second"));
    assert!(until(addr, &second).await, "the replaced pair is served");

    // A certificate whose key is another pair's: refused, the second pair stays.
    let other = support::new_pair("other");
    std::fs::write(&cert, &support::new_pair("mismatched").cert_pem).unwrap();
    std::fs::write(&key, &other.key_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(served(addr).await.as_deref(), Some(&second[..]));
}

/// With --client-ca-file, a caller without a certificate from that CA is refused at the handshake,
/// so a forged review (a phantom ElasticQuota CREATE) never reaches admission; the API server, given
/// a certificate from that CA, is served.
#[tokio::test]
async fn client_certificates_can_be_required() {
    use koord_webhook::certs::authority;
    let ca = authority::issue_ca(Duration::from_secs(3600)).unwrap();
    let other_ca = authority::issue_ca(Duration::from_secs(3600)).unwrap();
    let client = |ca: &koord_webhook::certs::PemPair| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let issuer = rcgen::Issuer::from_ca_cert_pem(
            &ca.cert_pem,
            rcgen::KeyPair::from_pem(&ca.key_pem).unwrap(),
        )
        .unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    koord_webhook::tls::install_default_provider();
    let client_ca = std::sync::Arc::new(
        koord_webhook::tls::ClientCa::from_pem(ca.cert_pem.as_bytes()).unwrap(),
    );
    let server = {
        let started = TestServer::start(quota_cache(), FeatureGates::default()).await;
        // The same handlers behind a listener that requires client certificates.
        let shared = std::sync::Arc::new(
            {
                let state = std::sync::Arc::new(koord_webhook::state::State::new(
                    quota_cache(),
                    started.shared.state.resolver.clone(),
                ));
                let admission = koord_webhook::admission::Admission::new(
                    state.cache.clone(),
                    FeatureGates::default(),
                    state.metrics.clone(),
                );
                koord_webhook::server::Shared::new(state, admission, Default::default())
            }
            .with_client_ca(Some(client_ca.clone())),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let app = koord_webhook::server::build(listener, shared).unwrap();
        tokio::spawn(app);
        (started, addr)
    };
    let (_keep, addr) = server;
    let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
    let forged = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "forged", "operation": "CREATE", "namespace": "team-a", "name": "phantom",
            "kind": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "kind": "ElasticQuota"},
            "resource": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "resource": "elasticquotas"},
            "object": {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                "metadata": {"name": "phantom", "namespace": "team-a"}, "spec": {"min": {"cpu": "1"}, "max": {"cpu": "1"}}}}
    }))
    .unwrap();
    let path = "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota";
    // Whether a caller with this identity gets no answer at all.
    let refused = |identity: Option<(String, String)>| {
        let forged = forged.clone();
        async move {
            let identity = identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str()));
            match support::tls_client::connect_as(addr, Proto::Http1, &versions, identity).await {
                Err(_) => true,
                Ok(mut conn) => conn.send("POST", path, forged).await.is_err(),
            }
        }
    };
    // A caller with this identity is served.
    let served = |(cert, key): (String, String)| async move {
        let mut conn =
            support::tls_client::connect_as(addr, Proto::Http1, &versions, Some((&cert, &key)))
                .await
                .expect("a trusted client's handshake");
        let (status, _) = conn
            .post(
                entries::VALIDATE_POD,
                harmless_review(entries::VALIDATE_POD, "ok"),
            )
            .await;
        status == StatusCode::OK
    };
    // No certificate, or one from another CA: no answer at all.
    assert!(
        refused(None).await,
        "a caller without a certificate was served"
    );
    assert!(
        refused(Some(client(&other_ca))).await,
        "a caller of another CA was served"
    );
    assert!(served(client(&ca)).await);

    // The CA rotated (what the file watch does when the mounted file changes): the new CA's
    // clients are served from the next handshake, the old CA's refused, without a restart.
    client_ca.set_pem(other_ca.cert_pem.as_bytes()).unwrap();
    assert!(served(client(&other_ca)).await, "a client of the new CA");
    assert!(
        refused(Some(client(&ca))).await,
        "a client of the old CA was served after the rotation"
    );
}

/// The first log lines of `serve --state` with these global flags, up to the line saying the server
/// listens (stderr is a pipe here, as in a container).
fn first_log_lines(flags: &[&str]) -> Vec<String> {
    use std::io::BufRead;
    let port = support::free_port();
    let mut child = support::KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .args(flags)
            .args(["serve", "--bind-address", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(["--metrics-bind-address", "0", "--health-bind-address", "0"])
            .arg("--state")
            .arg(fixture("state/quota-tree.yaml"))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) {
        let listening = line.contains("admission server listening");
        lines.push(line);
        if listening {
            return lines;
        }
    }
    panic!("serve never said it listens; its log: {lines:?}");
}

#[test]
fn logs_are_json_objects_per_line_or_text_without_colour_in_a_pipe() {
    let json_lines = first_log_lines(&["--log-format", "json"]);
    for line in &json_lines {
        let entry: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(entry["timestamp"].is_string(), "{line}");
        assert!(entry["level"].is_string(), "{line}");
        assert!(entry["fields"]["message"].is_string(), "{line}");
    }
    let listening: Value = serde_json::from_str(json_lines.last().unwrap()).unwrap();
    assert_eq!(listening["level"], "INFO");
    assert_eq!(listening["fields"]["message"], "admission server listening");

    let text_lines = first_log_lines(&[]);
    assert!(
        text_lines.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes written to a pipe: {text_lines:?}"
    );
    assert!(text_lines.last().unwrap().contains("INFO"));
}
