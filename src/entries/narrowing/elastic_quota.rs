//! `/validate-…-elasticquota`: an UPDATE that changes neither the spec, the tree labels, the
//! namespaces annotation nor an API-server probe's token is allowed as it is (`elastic_quota/tree_checks.rs`,
//! `relevant_unchanged`), unless someone other than koord-webhook's ServiceAccount changes its
//! recent-admissions record (`elastic_quota/own_annotations.rs`). Quota evaluation writes
//! `child-request` and that record on every admitted pod: those updates need no call. CREATE and
//! DELETE are always sent.

use super::calls::Condition;
use super::cel::{Meta, any, field_changed, key_changed, literal};
use crate::apis::keys::{
    PROBE_ANNOTATION, QUOTA_IS_PARENT, QUOTA_NAMESPACES, QUOTA_PARENT, QUOTA_RECENT_ADMISSIONS,
    QUOTA_TREE_ID,
};
use crate::names::service_account_user;

pub fn validation_condition() -> Condition {
    let mut changed = vec![field_changed("spec")];
    changed.extend(
        [QUOTA_PARENT, QUOTA_IS_PARENT, QUOTA_TREE_ID]
            .iter()
            .map(|k| key_changed(Meta::Labels, k)),
    );
    changed.push(key_changed(Meta::Annotations, QUOTA_NAMESPACES));
    // An API-server probe of an existing object changes only its token (`ledger/probe.rs`).
    changed.push(key_changed(Meta::Annotations, PROBE_ANNOTATION));
    changed.push(format!(
        "(request.userInfo.username != {} && {})",
        literal(&service_account_user()),
        key_changed(Meta::Annotations, QUOTA_RECENT_ADMISSIONS)
    ));
    Condition {
        name: "koord-quota-tree-change",
        expression: format!("request.operation != 'UPDATE' || {}", any(&changed)),
    }
}
