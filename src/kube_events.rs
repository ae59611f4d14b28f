//! Recording an Event about an object, as every part that tells users something through Events
//! does: an Event is a courtesy, so a failed publish is logged and never an error of the caller.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

/// What an Event says: its type, `reason` (CamelCase, what happened), `action` (what the reporter
/// was doing) and the note a user reads (the API server keeps at most 1 KiB of it).
pub struct Note<'a> {
    pub type_: EventType,
    pub reason: &'a str,
    pub action: &'a str,
    pub note: String,
}

impl<'a> Note<'a> {
    /// A note whose action is its reason (the operator's writes: what happened is what it did).
    pub fn named(type_: EventType, reason: &'a str, note: String) -> Self {
        Self {
            type_,
            reason,
            action: reason,
            note,
        }
    }
}

/// Publishes `note` regarding `object`.
pub async fn record(recorder: &Recorder, object: &ObjectReference, note: Note<'_>) {
    let event = Event {
        type_: note.type_,
        reason: note.reason.to_owned(),
        note: Some(note.note),
        action: note.action.to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, object).await {
        tracing::warn!(error = %e, reason = note.reason, "could not record an Event");
    }
}
