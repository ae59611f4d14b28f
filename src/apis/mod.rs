//! Koordinator's custom resources as Rust types, the label/annotation names the webhooks read, and
//! how objects are decoded without what nobody reads (`unread_fields`).
//!
//! `crds/` is generated from these types by `koord-webhook crds`.

pub mod colocation_profile;
pub mod elastic_quota;
pub mod elastic_quota_profile;
pub mod keys;
pub mod meta;
mod open_enum;
pub mod reservation;
mod schema;
pub mod unread_fields;

pub use colocation_profile::{ClusterColocationProfile, ClusterColocationProfileSpec};
pub use elastic_quota::{ElasticQuota, ElasticQuotaSpec, ElasticQuotaStatus};
pub use elastic_quota_profile::{ElasticQuotaProfile, ElasticQuotaProfileSpec};
pub use reservation::{Reservation, ReservationSpec, ReservationStatus};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The CRDs as multi-document YAML: `koord-webhook crds`, the chart's `files/crds.yaml`.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

/// Every CRD this project defines, in the order `crds/` lists them.
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    vec![
        ElasticQuota::crd(),
        ElasticQuotaProfile::crd(),
        Reservation::crd(),
        ClusterColocationProfile::crd(),
    ]
}
