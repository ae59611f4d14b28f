//! Shadowed refusals as Warning Events `WouldDeny` on the replica's own Pod (`--would-deny-events`),
//! where `kubectl get events` and `koord-webhook status` show them. Bounded: the request path only
//! queues (a full queue drops the report; the metric and the log still have it), and per rule and
//! namespace one Event is published at once, the rest of its window folded into one more.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{EventType, Recorder};
use tokio::sync::mpsc;

use crate::admission::ports::{FindingSink, WouldDeny};
use crate::kube_events::{self, Note};

/// Reports queued at most before the publisher catches up.
const QUEUED: usize = 256;

/// Rule and namespace pairs followed per window; refusals of further pairs wait for the next one.
const MAX_KEYS: usize = 512;

/// The request path's side: queues without waiting.
pub struct WouldDenyEvents {
    queue: mpsc::Sender<WouldDeny>,
}

impl FindingSink for WouldDenyEvents {
    fn would_deny(&self, finding: WouldDeny) {
        let _ = self.queue.try_send(finding);
    }
}

impl WouldDenyEvents {
    /// The sink, and the publisher to spawn: Events regarding `pod`, one per rule and namespace at
    /// once and one per `window` for the rest.
    pub fn start(
        recorder: Recorder,
        pod: ObjectReference,
        window: Duration,
    ) -> (Self, impl Future<Output = ()>) {
        let (queue, found) = mpsc::channel(QUEUED);
        (Self { queue }, publish(recorder, pod, found, window))
    }
}

async fn publish(
    recorder: Recorder,
    pod: ObjectReference,
    mut found: mpsc::Receiver<WouldDeny>,
    window: Duration,
) {
    let mut folding = Folding::default();
    let mut tick = tokio::time::interval(window);
    loop {
        let notes = tokio::select! {
            finding = found.recv() => match finding {
                Some(finding) => folding.offer(finding).into_iter().collect(),
                None => return,
            },
            _ = tick.tick() => folding.flush(),
        };
        for note in notes {
            let note = Note {
                type_: EventType::Warning,
                reason: "WouldDeny",
                action: "Admit",
                note,
            };
            kube_events::record(&recorder, &pod, note).await;
        }
    }
}

/// Per rule and namespace within a window: the first refusal is published, the others counted.
#[derive(Default)]
struct Folding {
    open: HashMap<(&'static str, String), (WouldDeny, usize)>,
}

impl Folding {
    /// The note to publish now, if this refusal opens its window.
    fn offer(&mut self, finding: WouldDeny) -> Option<String> {
        let key = (finding.rule, finding.namespace.clone());
        if let Some((last, more)) = self.open.get_mut(&key) {
            *more += 1;
            *last = finding;
            return None;
        }
        if self.open.len() >= MAX_KEYS {
            return None;
        }
        let note = note(&finding, 0);
        self.open.insert(key, (finding, 0));
        Some(note)
    }

    /// Closes every window: a note for each that folded refusals in.
    fn flush(&mut self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .open
            .drain()
            .filter(|(_, (_, more))| *more > 0)
            .map(|(_, (last, more))| note(&last, more))
            .collect();
        notes.sort();
        notes
    }
}

/// Events carry at most 1 KiB of note.
fn note(finding: &WouldDeny, more: usize) -> String {
    let object = match finding.namespace.as_str() {
        "" => finding.name.clone(),
        namespace => format!("{namespace}/{}", finding.name),
    };
    let also = match more {
        0 => String::new(),
        n => {
            format!(" ({n} refusals of this rule in this namespace since the last Event; the last)")
        }
    };
    let message: String = finding.message.chars().take(600).collect();
    format!(
        "{} would deny {} {object}{also}: {message}",
        finding.rule, finding.kind
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(rule: &'static str, namespace: &str, name: &str) -> WouldDeny {
        WouldDeny {
            rule,
            namespace: namespace.into(),
            kind: "Pod".into(),
            name: name.into(),
            message: format!("{name} is refused"),
        }
    }

    #[test]
    fn the_first_refusal_is_published_at_once_and_the_rest_folded_per_window() {
        let mut folding = Folding::default();
        assert_eq!(
            folding.offer(found("R", "a", "p1")).as_deref(),
            Some("R would deny Pod a/p1: p1 is refused")
        );
        assert_eq!(folding.offer(found("R", "a", "p2")), None);
        assert_eq!(folding.offer(found("R", "a", "p3")), None);
        assert!(
            folding.offer(found("R", "b", "q1")).is_some(),
            "another namespace"
        );
        assert!(
            folding.offer(found("S", "a", "p1")).is_some(),
            "another rule"
        );
        assert_eq!(
            folding.flush(),
            [
                "R would deny Pod a/p3 (2 refusals of this rule in this namespace since the last Event; the last): p3 is refused"
            ]
        );
        assert!(
            folding.offer(found("R", "a", "p4")).is_some(),
            "a new window"
        );
        assert!(folding.flush().is_empty());
    }

    #[test]
    fn the_windows_followed_are_bounded() {
        let mut folding = Folding::default();
        for i in 0..MAX_KEYS {
            assert!(folding.offer(found("R", &format!("ns-{i}"), "p")).is_some());
        }
        assert_eq!(folding.offer(found("R", "one-more", "p")), None);
        assert_eq!(folding.open.len(), MAX_KEYS);
    }
}
