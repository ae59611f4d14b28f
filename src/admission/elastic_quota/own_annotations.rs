//! koord-webhook's own annotation on a quota, its recent-admissions record (the recount trusts it
//! to charge pods the cache does not show yet), is set and changed by koord-webhook itself only:
//! a forged record would pin `child-request` until it ages out. "Itself" is the user the
//! replicas' own writes carry ([`OwnUser`]: the API server tells a replica at start; the installed
//! ServiceAccount's name where there is no API server to ask), not a fixed name: replicas run as
//! other identities too (URL mode, `scripts/dev-local`), and their own writes must pass. Anyone
//! may remove it (a quota replaced from Git without it must not be refused; the recount then
//! counts the pods it sees). Until the user is known the record's writer is not checked.
//! Koordinator has no such annotation: nothing here changes an answer of its.
//!
//! [`OwnUser`]: crate::admission::settings::OwnUser

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::apis::ElasticQuota;
use crate::apis::keys::QUOTA_RECENT_ADMISSIONS;
use crate::apis::meta::annotation;

/// The quota annotations only koord-webhook itself may set.
const OWN: [&str; 1] = [QUOTA_RECENT_ADMISSIONS];

pub struct OwnAnnotations;

impl Validator<ElasticQuota> for OwnAnnotations {
    fn name(&self) -> &'static str {
        "ElasticQuotaOwnAnnotations"
    }

    /// Shadowed, a forged record would be admitted and trusted by the recount.
    fn shadowable(&self) -> bool {
        false
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, ElasticQuota>) -> Step<'a> {
        let Some(new) = ctx.object() else {
            return Ok(()).into();
        };
        let old = ctx.old_object();
        // Set or changed here; most reviews touch none, and only those need the user compared.
        let Some(key) = OWN.into_iter().find(|key| {
            let set = annotation(new, key);
            set.is_some() && set != old.and_then(|o| annotation(o, key))
        }) else {
            return Ok(()).into();
        };
        let Some(ours) = ctx.settings.own_user.get() else {
            return Ok(()).into();
        };
        if ctx.request.user_info.username.as_deref() == Some(ours) {
            return Ok(()).into();
        }
        Err(Rejection::forbidden(format!(
            "annotation {key} is koord-webhook's own record: only {ours} may set or change it (removing it is allowed)"
        )))
        .into()
    }
}
