//! Label sets more than one subsystem's metrics use: a leaf, so that each subsystem can count with
//! them while `metrics/mod.rs` composes the subsystems into one registry.

use prometheus_client::encoding::EncodeLabelSet;

/// By kind of object (cache contents, watches, writes).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}
