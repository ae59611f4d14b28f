//! What a pass wrote: the owned fields of an entry, why each is written (which decides the Event
//! recording it), and each configuration written.

/// A field of an entry the operator owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnedField {
    /// The whole `clientConfig` (URL mode).
    ClientConfig,
    CaBundle,
    FailurePolicy,
    TimeoutSeconds,
    NamespaceSelector,
    /// Which requests the entry is sent (`--narrow-calls`).
    MatchConditions,
    /// Which objects the entry is sent (the table's, and `--qos-split`).
    ObjectSelector,
}

impl OwnedField {
    /// The JSON path within the entry.
    pub(super) fn path(self) -> &'static str {
        match self {
            OwnedField::ClientConfig => "clientConfig",
            OwnedField::CaBundle => "clientConfig/caBundle",
            OwnedField::FailurePolicy => "failurePolicy",
            OwnedField::TimeoutSeconds => "timeoutSeconds",
            OwnedField::NamespaceSelector => "namespaceSelector",
            OwnedField::MatchConditions => "matchConditions",
            OwnedField::ObjectSelector => "objectSelector",
        }
    }

    /// The field as people name it (Events, logs).
    pub fn name(self) -> &'static str {
        match self {
            OwnedField::CaBundle => "clientConfig.caBundle",
            other => other.path(),
        }
    }

    /// Why a write of this field happens, which decides the Event that records it.
    pub fn write_kind(self) -> WriteKind {
        match self {
            OwnedField::ClientConfig | OwnedField::CaBundle => WriteKind::Endpoint,
            OwnedField::MatchConditions | OwnedField::ObjectSelector => WriteKind::Calls,
            OwnedField::FailurePolicy
            | OwnedField::TimeoutSeconds
            | OwnedField::NamespaceSelector => WriteKind::Drift,
        }
    }
}

/// Why an owned field was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// Where the API server calls and with which CA: written at install and at every rotation.
    Endpoint,
    /// Which requests are sent (`--narrow-calls`): follows the rules, not drift.
    Calls,
    /// A setting edited by hand, put back.
    Drift,
}

/// One configuration the pass wrote: created whole (no fields listed) or patched in these fields.
#[derive(Debug, Clone)]
pub struct Written {
    /// The configuration, for the Events about it.
    pub reference: k8s_openapi::api::core::v1::ObjectReference,
    /// (entry name, field) of each owned field of an existing entry that was set.
    pub fields: Vec<(String, OwnedField)>,
    /// The API server refused the narrowed entries (the message); they were written wide.
    pub narrowing_refused: Option<String>,
}
