//! (ours) A new Reservation may not live longer than `--max-reservation-ttl`: a `ttl` over it, or
//! `0` (never expires), is refused. Koordinator has no such limit; without the flag, or with the
//! gate `ReservationTtlLimit` off, nothing is checked. An absent `ttl` reads as the `24h` the CRD
//! defaults it to (the API server defaults before any webhook, so only a forged review lacks one).
//! A Reservation that sets `expires` instead is not checked.

use std::time::Duration;

use kube::core::admission::Operation;

use super::object::Reservation;
use crate::admission::chain::{Ctx, Mutator, Step};
use crate::admission::outcome::{PluginResult, Rejection};
use crate::duration::parse_duration;
use crate::features::{FeatureGates, Gate};

/// The CRD's default `ttl`.
const DEFAULT_TTL: &str = "24h";

#[derive(Clone)]
pub struct TtlLimit;

impl Mutator<Reservation> for TtlLimit {
    fn name(&self) -> &'static str {
        "ReservationTtlLimit"
    }

    fn enabled(&self, gates: &FeatureGates) -> bool {
        gates.enabled(Gate::ReservationTtlLimit)
    }

    fn mutate<'a>(&'a self, ctx: &'a Ctx<'a, Reservation>, r: &'a mut Reservation) -> Step<'a> {
        match ctx.settings.max_reservation_ttl {
            Some(limit) if matches!(ctx.operation(), Operation::Create) => check(r, limit).into(),
            _ => Ok(()).into(),
        }
    }
}

fn check(r: &Reservation, limit: Duration) -> PluginResult {
    let Some(spec) = &r.spec else {
        return Ok(());
    };
    let ttl = spec.ttl.as_deref().unwrap_or(DEFAULT_TTL);
    let shown = crate::admission::message_clip::clip(ttl);
    let asked = parse_duration(ttl)
        .map_err(|_| Rejection::invalid(format!("Reservation ttl {shown:?} is not a duration")))?;
    let limit_shown = humantime_like(limit);
    if asked.is_zero() {
        return Err(Rejection::forbidden(format!(
            "Reservation ttl 0 never expires; at most {limit_shown} is allowed (--max-reservation-ttl)"
        )));
    }
    if asked > limit {
        return Err(Rejection::forbidden(format!(
            "Reservation ttl {shown} is longer than the {limit_shown} allowed (--max-reservation-ttl)"
        )));
    }
    Ok(())
}

/// A limit as a Go duration reads (`72h0m0s` reads as `72h`).
fn humantime_like(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (h, 0, 0) if h > 0 => format!("{h}h"),
        (0, m, 0) if m > 0 => format!("{m}m"),
        (h, m, sec) if h > 0 => format!("{h}h{m}m{sec}s"),
        (_, m, sec) if m > 0 => format!("{m}m{sec}s"),
        _ => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::rule_harness::{Ran, RuleEnv, create};
    use serde_json::json;

    fn reservation(ttl: &str) -> kube::core::admission::AdmissionRequest<Reservation> {
        create(
            json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
            "metadata": {"name": "r"}, "spec": {"owners": [{"object": {"name": "p"}}], "ttl": ttl}}),
        )
    }

    fn limited() -> RuleEnv {
        RuleEnv::new().with(|s| s.max_reservation_ttl = Some(Duration::from_secs(72 * 3600)))
    }

    const LONGER: &str =
        "Reservation ttl 100h is longer than the 72h allowed (--max-reservation-ttl)";

    #[tokio::test]
    async fn holds_a_new_reservation_to_the_limit() {
        assert_eq!(
            limited().mutate(&TtlLimit, &reservation("100h")).await,
            Ran::forbidden(LONGER)
        );
        assert_eq!(
            limited().mutate(&TtlLimit, &reservation("72h")).await,
            Ran::Allowed
        );
        assert_eq!(
            RuleEnv::new().mutate(&TtlLimit, &reservation("100h")).await,
            Ran::Allowed
        );
        assert_eq!(
            limited()
                .gate(Gate::ReservationTtlLimit, false)
                .mutate(&TtlLimit, &reservation("100h"))
                .await,
            Ran::Skipped
        );
        assert_eq!(
            limited()
                .shadowing("ReservationTtlLimit")
                .mutate(&TtlLimit, &reservation("100h"))
                .await,
            Ran::shadowed(LONGER)
        );
    }

    #[tokio::test]
    #[should_panic(expected = "shadowing names a rule other than the one run")]
    async fn a_misspelt_shadowed_rule_fails_the_test() {
        let env = limited().shadowing("ReservationTTLLimit");
        env.mutate(&TtlLimit, &reservation("100h")).await;
    }

    #[test]
    fn never_expiring_unparsable_and_defaulted_ttls() {
        let limit = Duration::from_secs(3600);
        let r = |ttl: Option<&str>| -> Reservation {
            let mut spec = json!({"owners": []});
            if let Some(t) = ttl {
                spec["ttl"] = t.into();
            }
            serde_json::from_value(json!({"metadata": {"name": "r"}, "spec": spec})).unwrap()
        };
        let message = |r: Reservation| check(&r, limit).unwrap_err().message;
        assert!(message(r(Some("0s"))).contains("never expires"));
        assert!(message(r(Some("soon"))).contains("\"soon\" is not a duration"));
        assert!(message(r(None)).contains("ttl 24h is longer than the 1h"));
        assert_eq!(check(&r(Some("30m")), limit), Ok(()));
        assert_eq!(humantime_like(Duration::from_secs(5400)), "1h30m0s");
    }
}
