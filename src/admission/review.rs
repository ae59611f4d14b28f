//! The AdmissionReview wire format: the only place that knows its JSON shape.
//!
//! A request is decoded in one pass into the endpoint's object type ([`parse_typed`]). Only when that
//! fails is it decoded again in two steps, so that a body that is not an AdmissionReview (HTTP 400)
//! is told apart from an object that does not decode (a denied response, code 400): the envelope
//! keeps `object`/`oldObject` as raw JSON, and each endpoint decodes them into its own type.

use std::borrow::Cow;
use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::{GroupVersionKind, GroupVersionResource, TypeMeta};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::message_clip::clip;
use crate::apis::unread_fields::{optional_without_managed_fields, without_managed_fields};
use crate::memory::metered::metered;

/// `T` decoded without its `managedFields`, for a decode that is metered around it.
struct Unmanaged<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Unmanaged<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        without_managed_fields(d).map(Unmanaged)
    }
}

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// Why a body is not a usable AdmissionReview (HTTP 400, or exit 2 in `review`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MalformedReview {
    #[error("body is not an AdmissionReview: {0}")]
    Syntax(String),
    #[error("unsupported AdmissionReview {api_version:?}/{kind:?}: want {API_VERSION}/{KIND}")]
    Version { api_version: String, kind: String },
    #[error("AdmissionReview has no request")]
    NoRequest,
}

/// Why a review gets no AdmissionReview answer: a body that is not one (HTTP 400), or a chain that
/// outlived the API server's wait (HTTP 504: the API server then applies the entry's configured
/// failurePolicy, which only it knows: one endpoint can serve entries of either policy).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NoVerdict {
    #[error(transparent)]
    Malformed(#[from] MalformedReview),
    #[error("{0}")]
    TimedOut(String),
    /// Decoding took more memory than the body's estimate allows (HTTP 413): a shape that is
    /// larger decoded than its bytes say, stopped by the allocator's count.
    #[error(
        "decoding this review took more than the {} KiB its {} bytes are allowed (stopped at {} KiB)",
        .0.limit >> 10, .1, .0.peak >> 10
    )]
    TooLarge(crate::memory::OverLimit, usize),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireReview<'a> {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(borrow)]
    request: Option<WireRequest<'a>>,
}

/// An admission request whose objects are still raw JSON borrowed from the body.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireRequest<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    pub request_resource: Option<GroupVersionResource>,
    #[serde(default)]
    pub request_sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(borrow, default)]
    pub object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub old_object: Option<&'a RawValue>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

impl<'a> WireRequest<'a> {
    pub fn parse(body: &'a [u8]) -> Result<Self, MalformedReview> {
        let mut d = serde_json::Deserializer::from_slice(body);
        let review: WireReview<'a> = metered(&mut d)
            .and_then(|r| d.end().map(|()| r))
            .map_err(|e| MalformedReview::Syntax(e.to_string()))?;
        if review.api_version != API_VERSION || review.kind != KIND {
            return Err(MalformedReview::Version {
                api_version: review.api_version,
                kind: review.kind,
            });
        }
        review.request.ok_or(MalformedReview::NoRequest)
    }

    /// Decodes the objects into `T` and builds kube's typed request.
    pub fn decode<T>(&self) -> Result<AdmissionRequest<T>, String>
    where
        T: kube::Resource + serde::de::DeserializeOwned,
    {
        let object = decode_object::<T>(self.object)?;
        let old_object = decode_object::<T>(self.old_object)?;
        Ok(AdmissionRequest {
            types: TypeMeta {
                api_version: API_VERSION.to_owned(),
                kind: KIND.to_owned(),
            },
            uid: self.uid.clone(),
            kind: self.kind.clone(),
            resource: self.resource.clone(),
            sub_resource: self.sub_resource.clone(),
            request_kind: self.request_kind.clone(),
            request_resource: self.request_resource.clone(),
            request_sub_resource: self.request_sub_resource.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            operation: self.operation.clone(),
            user_info: self.user_info.clone(),
            object,
            old_object,
            dry_run: self.dry_run.unwrap_or(false),
            // Read by no rule: never decoded (see [`TypedRequest`]).
            options: None,
        })
    }
}

/// The whole review decoded in one pass into the endpoint's type: the common case, which reads the
/// body once. `None` when anything is off; [`WireRequest::parse`] then tells a body that is not an
/// AdmissionReview from an object that does not decode, with the message each deserves.
pub fn parse_typed<T>(body: &[u8]) -> Option<Box<AdmissionRequest<T>>>
where
    T: kube::Resource + serde::de::DeserializeOwned,
{
    #[derive(Deserialize)]
    #[serde(
        rename_all = "camelCase",
        bound(deserialize = "T: serde::de::DeserializeOwned")
    )]
    struct TypedReview<T> {
        #[serde(default)]
        api_version: String,
        #[serde(default)]
        kind: String,
        // Boxed where it is decoded: the request is large and is handed on several times.
        request: Option<Box<TypedRequest<T>>>,
    }
    // One UTF-8 check of the whole body is cheaper than serde_json's check of every string.
    let text = std::str::from_utf8(body).ok()?;
    let mut d = serde_json::Deserializer::from_str(text);
    let review: TypedReview<T> = metered(&mut d).ok()?;
    d.end().ok()?;
    if review.api_version != API_VERSION || review.kind != KIND {
        return None;
    }
    let r = *review.request?;
    Some(Box::new(AdmissionRequest {
        types: TypeMeta {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
        },
        uid: r.uid,
        kind: r.kind,
        resource: r.resource,
        sub_resource: r.sub_resource,
        request_kind: r.request_kind,
        request_resource: r.request_resource,
        request_sub_resource: r.request_sub_resource,
        name: r.name,
        namespace: r.namespace,
        operation: r.operation,
        user_info: r.user_info,
        object: r.object,
        old_object: r.old_object,
        dry_run: r.dry_run,
        options: None,
    }))
}

/// kube's `AdmissionRequest` as the wire carries it, without `options`: no rule reads a request's
/// options, so they are skipped unread (serde walks unknown fields without keeping them) rather than
/// decoded into a map of values whatever their size.
#[derive(Deserialize)]
#[serde(
    rename_all = "camelCase",
    bound(deserialize = "T: serde::de::DeserializeOwned")
)]
struct TypedRequest<T> {
    uid: String,
    kind: GroupVersionKind,
    resource: GroupVersionResource,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    request_resource: Option<GroupVersionResource>,
    #[serde(default)]
    request_sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    #[serde(default)]
    user_info: UserInfo,
    #[serde(default = "none", deserialize_with = "optional_without_managed_fields")]
    object: Option<T>,
    #[serde(default = "none", deserialize_with = "optional_without_managed_fields")]
    old_object: Option<T>,
    #[serde(default)]
    dry_run: bool,
}

fn none<T>() -> Option<T> {
    None
}

fn decode_object<T: serde::de::DeserializeOwned>(
    raw: Option<&RawValue>,
) -> Result<Option<T>, String> {
    match raw {
        None => Ok(None),
        Some(raw) if raw.get() == "null" => Ok(None),
        Some(raw) => {
            let mut d = serde_json::Deserializer::from_str(raw.get());
            metered(&mut d)
                .map(|Unmanaged(t)| t)
                .and_then(|t| d.end().map(|()| Some(t)))
                .map_err(|e| e.to_string())
        }
    }
}

/// What an endpoint answers, before it is put on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub allowed: bool,
    pub code: u16,
    pub message: Option<String>,
    /// RFC 6902 patch as JSON bytes; never empty when set.
    pub patch: Option<Vec<u8>>,
    pub audit_annotations: BTreeMap<String, String>,
    pub warnings: Vec<String>,
    /// Set when the chain outlived the API server's wait: no verdict is sent, only this reason
    /// ([`NoVerdict::TimedOut`]).
    pub late: Option<String>,
    /// The rule whose refusal this is (not sent; the denial metric's label).
    pub rule: Option<&'static str>,
}

impl Verdict {
    pub fn allow() -> Self {
        Self {
            allowed: true,
            code: 200,
            message: None,
            patch: None,
            audit_annotations: BTreeMap::new(),
            warnings: Vec::new(),
            late: None,
            rule: None,
        }
    }

    pub fn deny(code: u16, message: impl Into<String>) -> Self {
        Self {
            allowed: false,
            code,
            message: Some(message.into()),
            ..Self::allow()
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireResponseReview<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: WireResponse<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse<'a> {
    uid: &'a str,
    allowed: bool,
    status: WireStatus<'a>,
    // `patchType` and `patch` are appended by [`append_patch`].
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    audit_annotations: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "<[Cow<'a, str>]>::is_empty")]
    warnings: &'a [Cow<'a, str>],
}

#[derive(Serialize)]
struct WireStatus<'a> {
    metadata: Empty,
    code: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
}

#[derive(Serialize)]
struct Empty {}

/// Encodes the response AdmissionReview.
pub fn encode(uid: &str, verdict: &Verdict) -> Vec<u8> {
    // What the answer quotes from the object is clipped (`message_clip.rs`).
    let message = verdict.message.as_deref().map(clip);
    let warnings: Vec<_> = verdict.warnings.iter().map(|w| clip(w)).collect();
    let review = WireResponseReview {
        api_version: API_VERSION,
        kind: KIND,
        response: WireResponse {
            uid,
            allowed: verdict.allowed,
            status: WireStatus {
                metadata: Empty {},
                code: verdict.code,
                message: message.as_deref(),
            },
            audit_annotations: &verdict.audit_annotations,
            warnings: &warnings,
        },
    };
    let patch_len = verdict.patch.as_ref().map_or(0, |p| base64_len(p));
    let mut out = Vec::with_capacity(512 + patch_len);
    // Serialising plain strings, numbers and maps of strings cannot fail.
    if serde_json::to_writer(&mut out, &review).is_err() {
        out.clear();
    }
    if let Some(patch) = &verdict.patch {
        append_patch(&mut out, patch);
    }
    out
}

/// The length of `bytes` in padded base64.
fn base64_len(bytes: &[u8]) -> usize {
    base64::encoded_len(bytes.len(), true).unwrap_or_default()
}

/// Adds `patchType` and `patch` (base64, as the API encodes `[]byte`) as the response's last fields.
/// The base64 text goes straight into the output: serde_json would scan all of it for characters to
/// escape, and the alphabet has none. It pays: through serde (a `patch: String` field) a /mutate-pod
/// review took 4-5 % longer in `cargo bench --bench pod_review` (45.8 vs 43.3-43.9 µs at 4 KiB,
/// 133.0 vs 126.3-126.8 µs at 15 KiB).
fn append_patch(out: &mut Vec<u8>, patch: &[u8]) {
    let engine = &base64::engine::general_purpose::STANDARD;
    // The review ends with the closing braces of `response` and of the review itself.
    let Some(body) = out.len().checked_sub(2).filter(|&n| &out[n..] == b"}}") else {
        tracing::error!("the encoded review does not end its response object");
        return;
    };
    out.truncate(body);
    out.extend_from_slice(br#","patchType":"JSONPatch","patch":""#);
    let start = out.len();
    out.resize(start + base64_len(patch), 0);
    if engine.encode_slice(patch, &mut out[start..]).is_err() {
        // Unreachable: the room is exactly the encoded length.
        out.truncate(start);
        out.extend_from_slice(engine.encode(patch).as_bytes());
    }
    out.extend_from_slice(br#""}}"#);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::pod::object::Pod;

    const REQUEST: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
        "uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},
        "resource":{"group":"","version":"v1","resource":"pods"},"namespace":"ns","operation":"CREATE",
        "userInfo":{"username":"alice"},"object":{"metadata":{"name":"p"},"spec":{"containers":[]}},
        "oldObject":null,"dryRun":true}}"#;

    #[test]
    fn decodes_request_and_typed_object() {
        let wire = WireRequest::parse(REQUEST.as_bytes()).unwrap();
        assert_eq!(wire.uid, "u-1");
        let req = wire.decode::<Pod>().unwrap();
        assert_eq!(req.object.unwrap().metadata.name.as_deref(), Some("p"));
        assert!(req.old_object.is_none());
        assert!(req.dry_run);
        assert_eq!(req.user_info.username.as_deref(), Some("alice"));
    }

    #[test]
    fn tells_malformed_envelope_from_bad_object() {
        assert!(matches!(
            WireRequest::parse(b"[1,2]"),
            Err(MalformedReview::Syntax(_))
        ));
        assert!(matches!(
            WireRequest::parse(br#"{"apiVersion":"v1","kind":"Pod"}"#),
            Err(MalformedReview::Version { .. })
        ));
        assert_eq!(
            WireRequest::parse(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#)
                .err(),
            Some(MalformedReview::NoRequest)
        );
        let bad = REQUEST.replace(r#""containers":[]"#, r#""containers":7"#);
        let wire = WireRequest::parse(bad.as_bytes()).unwrap();
        assert!(wire.decode::<Pod>().is_err());
        assert!(parse_typed::<Pod>(bad.as_bytes()).is_none());
        let typed = parse_typed::<Pod>(REQUEST.as_bytes()).unwrap();
        let two_step = WireRequest::parse(REQUEST.as_bytes())
            .unwrap()
            .decode::<Pod>()
            .unwrap();
        assert_eq!(
            serde_json::to_value(&typed).unwrap(),
            serde_json::to_value(&two_step).unwrap(),
            "one pass and two steps agree"
        );
    }

    #[test]
    fn encodes_patch_as_base64_string() {
        let mut verdict = Verdict::allow();
        verdict.patch = Some(br#"[{"op":"add","path":"/a","value":1}]"#.to_vec());
        let out: serde_json::Value = serde_json::from_slice(&encode("u", &verdict)).unwrap();
        let response = &out["response"];
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(response["uid"], "u");
        assert_eq!(response["patchType"], "JSONPatch");
        let b64 = response["patch"].as_str().expect("patch is a string");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        assert_eq!(decoded, verdict.patch.clone().unwrap());
        assert_eq!(response["status"]["code"], 200);
        // With every optional field, and patches of each length modulo 3 (base64 padding).
        verdict.warnings = vec!["w \"quoted\"".into()];
        verdict.audit_annotations.insert("k".into(), "v".into());
        for len in 0..4 {
            verdict.patch = Some(vec![b'x'; len]);
            let out: serde_json::Value = serde_json::from_slice(&encode("u", &verdict)).unwrap();
            let response = &out["response"];
            assert_eq!(response["warnings"][0], "w \"quoted\"");
            assert_eq!(response["auditAnnotations"]["k"], "v");
            let b64 = response["patch"].as_str().unwrap();
            let decoded = base64::engine::general_purpose::STANDARD.decode(b64);
            assert_eq!(decoded.unwrap(), vec![b'x'; len]);
        }
        // No patch, no patch fields.
        let out: serde_json::Value =
            serde_json::from_slice(&encode("u", &Verdict::allow())).unwrap();
        assert!(out["response"].get("patchType").is_none());
    }
}
