//! Users may not mark their pods as reserve pods; only the scheduler creates those.

use crate::admission::pod::object::Pod;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;

pub const RESERVE_POD_ANNOTATION: &str = "scheduling.koordinator.sh/reserve-pod";

pub struct ForbiddenReservePod;

impl Validator<Pod> for ForbiddenReservePod {
    fn name(&self) -> &'static str {
        "ForbiddenReservePodAnnotation"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Pod>) -> Step<'a> {
        let annotated = ctx
            .object()
            .and_then(|pod| pod.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key(RESERVE_POD_ANNOTATION));
        if annotated {
            return Err(Rejection::invalid(format!(
                "annotations.{RESERVE_POD_ANNOTATION}: Forbidden: cannot set in annotations"
            )))
            .into();
        }
        Ok(()).into()
    }
}
