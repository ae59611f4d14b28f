//! `/validate-…-elasticquota`: an UPDATE that changes neither the spec, the tree labels nor the
//! namespaces annotation is allowed as it is (`elastic_quota/tree_checks.rs`,
//! `relevant_unchanged`). Quota evaluation writes `child-request` on every admitted pod: those
//! updates need no call. CREATE and DELETE are always sent.

use super::calls::Condition;
use super::cel::{Meta, any, field_changed, key_changed};
use crate::apis::keys::{QUOTA_IS_PARENT, QUOTA_NAMESPACES, QUOTA_PARENT, QUOTA_TREE_ID};

pub fn validation_condition() -> Condition {
    let mut changed = vec![field_changed("spec")];
    changed.extend(
        [QUOTA_PARENT, QUOTA_IS_PARENT, QUOTA_TREE_ID]
            .iter()
            .map(|k| key_changed(Meta::Labels, k)),
    );
    changed.push(key_changed(Meta::Annotations, QUOTA_NAMESPACES));
    Condition {
        name: "koord-quota-tree-change",
        expression: format!("request.operation != 'UPDATE' || {}", any(&changed)),
    }
}
