//! The Events that record the keeper's writes, regarding each configuration written: what a user
//! reads in `kubectl describe` or `koord-webhook status` to learn why a configuration changed.

use kube::runtime::events::{EventType, Recorder};

use super::written::{WriteKind, Written};
use crate::kube_events::{self, Note};

/// One Event per configuration and kind of write, regarding the configuration: the caBundle
/// published (Normal), which requests are sent changed (Normal), other owned fields put back
/// after a hand edit (Warning, naming each), narrowed entries refused and written wide (Warning).
pub async fn record(recorder: &Recorder, written: &[Written]) {
    for configuration in written {
        if let Some(refusal) = &configuration.narrowing_refused {
            let note = format!(
                "the API server refused the matchConditions, entries written wide: {refusal}"
            );
            let note = Note::named(EventType::Warning, "NarrowingRefused", note);
            kube_events::record(recorder, &configuration.reference, note).await;
        }
        for kind in [WriteKind::Endpoint, WriteKind::Calls, WriteKind::Drift] {
            let fields: Vec<_> = configuration
                .fields
                .iter()
                .filter(|(_, field)| field.write_kind() == kind)
                .collect();
            if fields.is_empty() {
                continue;
            }
            let entries: Vec<&str> = fields.iter().map(|(e, _)| e.as_str()).collect();
            let (type_, reason, note) = match kind {
                WriteKind::Endpoint => (
                    EventType::Normal,
                    "CABundlePublished",
                    format!("caBundle published on {}", entries.join(", ")),
                ),
                WriteKind::Calls => (
                    EventType::Normal,
                    "MatchConditionsChanged",
                    format!("which requests are sent changed on {}", entries.join(", ")),
                ),
                WriteKind::Drift => {
                    let named: Vec<String> = fields
                        .iter()
                        .map(|(e, f)| format!("{e} {}", f.name()))
                        .collect();
                    let note = format!(
                        "put back to the configured value (edit the install's settings instead): {}",
                        named.join(", ")
                    );
                    tracing::warn!(configuration = ?configuration.reference.name, "{note}");
                    (EventType::Warning, "DriftRepaired", note)
                }
            };
            let note = Note::named(type_, reason, note);
            kube_events::record(recorder, &configuration.reference, note).await;
        }
    }
}
