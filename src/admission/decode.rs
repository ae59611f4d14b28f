//! A review body decoded into the endpoint's typed request, under the allocator-counted allowance
//! its shape gives. A large body is decoded on the blocking pool (through [`offload::heavy`], one
//! per core at once): decoding megabytes takes an async worker for tens of milliseconds (seconds on
//! a slow, busy machine), and that worker also runs the TLS handshakes, the health answers and
//! every small review on it. A handshake that waited past its timeout behind a few large decodes
//! was closed after the client thought it done, a broken connection for the API server.

use bytes::Bytes;
use kube::core::GroupVersionResource;
use kube::core::admission::{AdmissionRequest, Operation};

use super::deadline::Deadline;
use super::endpoint::Object;
use super::env::Head;
use super::offload;
use super::review::{self, MalformedReview, NoVerdict, WireRequest};
use crate::entries::EndpointSpec;
use crate::memory::{BodyShape, Meter};

/// Bodies from this size are decoded on the blocking pool; below it the hop costs more than the
/// decode (a few hundred microseconds at most).
pub const OFF_THE_WORKER_FROM: usize = 256 * 1024;

/// The request if it is for the endpoint's resource (`None`: a request for another resource,
/// answered with an allow); `Err` inside when its objects do not decode (answered with a denial).
pub type Request<T> = Option<Result<Box<AdmissionRequest<T>>, String>>;

/// Decodes `body` for `spec`'s endpoint within what `shape` allows for `copies` of the object,
/// on the blocking pool when it is large. Waiting for a place there ends at the deadline.
pub async fn decode<T: Object>(
    spec: &'static EndpointSpec,
    body: Bytes,
    shape: BodyShape,
    copies: usize,
    deadline: Deadline,
) -> Result<(Head, Request<T>), NoVerdict> {
    let allowance = shape.allowance(copies);
    if body.len() < OFF_THE_WORKER_FROM {
        return metered(spec, &body, allowance);
    }
    let work = offload::heavy(move || metered(spec, &body, allowance));
    tokio::time::timeout_at(deadline.instant(), work)
        .await
        .unwrap_or_else(|_| {
            Err(NoVerdict::TimedOut(
                "the review was not decoded before the deadline: every core was decoding others"
                    .to_owned(),
            ))
        })
}

/// What the decode takes is counted by the allocator and held to `allowance`: a shape larger
/// decoded than estimated is stopped at the first value past it.
fn metered<T: Object>(
    spec: &'static EndpointSpec,
    body: &[u8],
    allowance: usize,
) -> Result<(Head, Request<T>), NoVerdict> {
    let meter = Meter::start(allowance);
    let decoded = parse(spec, body);
    meter
        .check()
        .map_err(|over| NoVerdict::TooLarge(over, body.len()))?;
    Ok(decoded?)
}

/// Who the request is about, and the request itself.
fn parse<T: Object>(
    spec: &EndpointSpec,
    body: &[u8],
) -> Result<(Head, Request<T>), MalformedReview> {
    let head = |uid: &str, operation: &Operation, namespace: &Option<String>, name: &str| Head {
        uid: uid.to_owned(),
        operation: operation.clone(),
        namespace: namespace.clone(),
        name: name.to_owned(),
    };
    Ok(match review::parse_typed::<T>(body) {
        Some(r) => (
            head(&r.uid, &r.operation, &r.namespace, &r.name),
            accepts(spec, &r.resource, r.sub_resource.as_deref()).then_some(Ok(r)),
        ),
        None => {
            // Something is off: two steps tell a bad envelope from a bad object.
            let w = WireRequest::parse(body)?;
            (
                head(&w.uid, &w.operation, &w.namespace, &w.name),
                accepts(spec, &w.resource, w.sub_resource.as_deref())
                    .then(|| w.decode::<T>().map(Box::new)),
            )
        }
    })
}

fn accepts(
    spec: &EndpointSpec,
    resource: &GroupVersionResource,
    sub_resource: Option<&str>,
) -> bool {
    resource.resource == spec.resource && sub_resource.unwrap_or_default() == spec.sub_resource
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::pod::object::Pod;
    use futures::FutureExt;

    /// A pod review whose labels make its body about `bytes` long.
    fn pod_review(bytes: usize) -> Bytes {
        let labels: serde_json::Map<String, serde_json::Value> = (0..bytes / 24)
            .map(|i| (format!("k{i:07}"), format!("v{i:07}").into()))
            .collect();
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE", "name": "p", "namespace": "default", "userInfo": {},
                "object": {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "default", "labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        serde_json::to_vec(&review).unwrap().into()
    }

    fn decoding(body: Bytes) -> impl Future<Output = Result<(Head, Request<Pod>), NoVerdict>> {
        let spec = crate::entries::find(crate::entries::VALIDATE_POD).unwrap();
        let shape = BodyShape::of(&body);
        decode::<Pod>(spec, body, shape, 1, Deadline::starting_now(None))
    }

    /// Every size around the threshold: a large body is never decoded on the thread that polls
    /// the review (its first poll hands it away and returns pending), a small one is decoded there
    /// at once; both decode to the same request.
    #[tokio::test(flavor = "current_thread")]
    async fn a_large_body_is_decoded_off_the_worker() {
        for size in [
            1024,
            OFF_THE_WORKER_FROM / 2,
            OFF_THE_WORKER_FROM,
            4 * OFF_THE_WORKER_FROM,
            3 << 20,
        ] {
            let body = pod_review(size);
            let large = body.len() >= OFF_THE_WORKER_FROM;
            let mut review = Box::pin(decoding(body));
            let first = (&mut review).now_or_never();
            assert_eq!(
                first.is_none(),
                large,
                "{size} bytes: decoded on the worker: {}",
                !large
            );
            let (head, request) = match first {
                Some(done) => done,
                None => review.await,
            }
            .unwrap();
            assert_eq!(head.name, "p");
            let pod = request.unwrap().unwrap().object.unwrap();
            let labels = pod.metadata.labels.as_ref().map_or(0, |l| l.len());
            assert_eq!(labels, size / 24, "{size} bytes");
        }
    }
}
