//! koord-webhook's own annotation on a quota, its recent-admissions record (the recount trusts it
//! to charge pods the cache does not show yet), is set and changed by koord-webhook's
//! ServiceAccount only: a forged record would pin `child-request` until it ages out. Anyone may
//! remove it (a quota replaced from Git without it must not be refused; the recount then counts
//! the pods it sees). Koordinator has no such annotation: nothing here changes an answer of its.

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::apis::ElasticQuota;
use crate::apis::keys::QUOTA_RECENT_ADMISSIONS;
use crate::apis::meta::annotation;
use crate::names::service_account_user;

/// The quota annotations only koord-webhook's ServiceAccount may set.
const OWN: [&str; 1] = [QUOTA_RECENT_ADMISSIONS];

pub struct OwnAnnotations;

impl Validator<ElasticQuota> for OwnAnnotations {
    fn name(&self) -> &'static str {
        "ElasticQuotaOwnAnnotations"
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
        let ours = service_account_user();
        if ctx.request.user_info.username.as_deref() == Some(ours.as_str()) {
            return Ok(()).into();
        }
        Err(Rejection::forbidden(format!(
            "annotation {key} is koord-webhook's own record: only {ours} may set or change it (removing it is allowed)"
        )))
        .into()
    }
}
