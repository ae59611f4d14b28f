//! The planner against every case docs/certificates.md promises, on a simulated clock: each pass
//! reads back what the previous one would have written (through the Secrets' own encoding).

use std::time::{Duration, SystemTime};

use super::plan::*;
use crate::certs::{CertError, PemPair, authority};
use crate::operator::secrets::{self, CaState, Phase, TlsState};

const HOST: &str = "koordinator-webhook-service.koordinator-system.svc";
const CA_VALIDITY: Duration = Duration::from_secs(3000);
const CERT_VALIDITY: Duration = Duration::from_secs(900);
const SETTLE: Duration = Duration::from_secs(10);
const GRACE: Duration = Duration::from_secs(120);

fn policy() -> CertPolicy {
    CertPolicy {
        ca_validity: CA_VALIDITY,
        cert_validity: CERT_VALIDITY,
        renew_fraction: 1.0 / 3.0,
        ca_grace: GRACE,
        publish_settle: SETTLE,
        hosts: vec![HOST.to_owned()],
        adopt_ca_secret: None,
    }
}

/// A fixed start, so that every run sees the same boundaries.
fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn at(secs: f64) -> SystemTime {
    t0() + Duration::from_secs_f64(secs)
}

fn plan_at(observed: Observed, secs: f64) -> Plan {
    plan(observed, &policy(), at(secs)).unwrap()
}

/// What the next pass reads after this plan's writes.
fn stored(plan: &Plan) -> Observed {
    Observed {
        ca: secrets::read_ca(&secrets::ca_secret(&plan.ca)),
        tls: secrets::read_tls(&secrets::tls_secret(&plan.tls, &plan.ca)),
        koordinator_ca: None,
        adopted_before: None,
    }
}

fn stored_ca(ca: &CaState, tls: &TlsState) -> Observed {
    Observed {
        ca: secrets::read_ca(&secrets::ca_secret(ca)),
        tls: secrets::read_tls(&secrets::tls_secret(tls, ca)),
        koordinator_ca: None,
        adopted_before: None,
    }
}

fn signed_by(serving: &PemPair, ca: &PemPair, secs: f64) -> bool {
    authority::verify_serving_at(
        serving.cert_pem.as_bytes(),
        ca.cert_pem.as_bytes(),
        HOST,
        at(secs),
    )
    .is_ok()
}

fn bundle_of(cas: &[&PemPair]) -> String {
    authority::bundle(cas.iter().map(|ca| ca.cert_pem.as_str()))
}

/// A CA rotation started at 2001 s (the CA of 3000 s is due), with the serving pair renewed at
/// 1800 s so that it still verifies: the plans of the first install, of that renewal and of the
/// rotation's start.
fn rotation_started() -> (Plan, Plan, Plan) {
    let first = plan_at(Observed::default(), 0.0);
    let renewed = plan_at(stored(&first), 1800.0);
    assert_eq!(renewed.events, [CertEvent::CertificateIssued]);
    // 3000 s of life: due when less than 1000 s are left.
    assert!(!plan_at(stored(&renewed), 1999.0).write_ca);
    let publishing = plan_at(stored(&renewed), 2001.0);
    (first, renewed, publishing)
}

#[test]
fn a_first_install_issues_a_ca_and_a_pair_it_signs() {
    let plan = plan_at(Observed::default(), 0.0);
    assert_eq!(plan.ca.phase, Phase::Stable);
    assert_eq!(plan.ca.previous, None);
    assert!(plan.write_ca && plan.write_tls);
    assert_eq!(
        plan.events,
        [
            CertEvent::CaIssued {
                beside_old_trust: false
            },
            CertEvent::CertificateIssued
        ]
    );
    assert_eq!(plan.issued, [Certificate::Ca, Certificate::Serving]);
    assert_eq!(plan.tls.bundle, bundle_of(&[&plan.ca.ca]));
    assert!(signed_by(&plan.tls.serving, &plan.ca.ca, 0.0));
    assert_eq!(
        phase_step(&plan.ca, true, &policy(), at(0.0)).next,
        Next::Idle
    );
}

#[test]
fn a_healthy_state_is_left_alone() {
    let first = plan_at(Observed::default(), 0.0);
    let again = plan_at(stored(&first), 599.0);
    assert!(!again.write_ca && !again.write_tls, "{again:?}");
    assert!(again.events.is_empty() && again.issued.is_empty());
    assert_eq!(again.tls, first.tls);
}

#[test]
fn the_serving_pair_is_renewed_once_less_than_a_third_of_its_life_is_left() {
    let first = plan_at(Observed::default(), 0.0);
    // 900 s of life: due when less than 300 s are left.
    assert!(!plan_at(stored(&first), 599.0).write_tls);
    let renewed = plan_at(stored(&first), 601.0);
    assert!(renewed.write_tls && !renewed.write_ca);
    assert_eq!(renewed.events, [CertEvent::CertificateIssued]);
    assert_eq!(renewed.issued, [Certificate::Serving]);
    assert_ne!(renewed.tls.serving, first.tls.serving);
    assert!(signed_by(&renewed.tls.serving, &first.ca.ca, 601.0));
}

#[test]
fn a_pair_that_does_not_verify_or_is_not_its_keys_is_replaced() {
    let first = plan_at(Observed::default(), 0.0);
    let stranger = authority::issue_ca_at(CA_VALIDITY, t0()).unwrap();
    let foreign = authority::issue_serving_at(&stranger, &[HOST.into()], CERT_VALIDITY, t0());
    let foreign = TlsState {
        serving: foreign.unwrap(),
        bundle: first.tls.bundle.clone(),
    };
    let replaced = plan_at(stored_ca(&first.ca, &foreign), 10.0);
    assert_eq!(replaced.events, [CertEvent::CertificateIssued]);
    assert!(signed_by(&replaced.tls.serving, &first.ca.ca, 10.0));

    // A key that is not the certificate's reads as no pair at all.
    let mismatched = TlsState {
        serving: PemPair {
            cert_pem: first.tls.serving.cert_pem.clone(),
            key_pem: foreign.serving.key_pem.clone(),
        },
        bundle: first.tls.bundle.clone(),
    };
    let observed = stored_ca(&first.ca, &mismatched);
    assert_eq!(observed.tls, None);
    let replaced = plan_at(observed, 10.0);
    assert!(replaced.write_tls && !replaced.write_ca);
    assert!(signed_by(&replaced.tls.serving, &first.ca.ca, 10.0));
}

#[test]
fn a_ca_due_for_renewal_is_published_beside_the_old_one_which_keeps_signing() {
    let (first, renewed, publishing) = rotation_started();
    assert_eq!(publishing.ca.phase, Phase::Publishing);
    assert_eq!(publishing.ca.previous.as_ref(), Some(&first.ca.ca));
    assert_ne!(publishing.ca.ca, first.ca.ca);
    assert_eq!(publishing.events, [CertEvent::CaRotationStarted]);
    assert_eq!(publishing.issued, [Certificate::Ca]);
    assert_eq!(
        publishing.tls.bundle,
        bundle_of(&[&first.ca.ca, &publishing.ca.ca])
    );
    // The pair in place is the old CA's and stays: API servers may not have the new CA yet.
    assert_eq!(publishing.tls.serving, renewed.tls.serving);
    assert!(publishing.write_ca && publishing.write_tls);
}

#[test]
fn publishing_waits_for_the_bundle_on_every_entry_and_the_settle_time() {
    let (_, _, publishing) = rotation_started();
    let ca = &publishing.ca;
    let not_published = phase_step(ca, false, &policy(), at(2001.0 + 60.0));
    assert!(not_published.advance.is_none());
    assert_eq!(not_published.next, Next::After(Duration::from_secs(1)));
    let unsettled = phase_step(ca, true, &policy(), at(2001.0 + 9.9));
    assert!(unsettled.advance.is_none());
    let settled = phase_step(ca, true, &policy(), at(2001.0 + 10.0));
    let (draining, event) = settled.advance.expect("Draining");
    assert_eq!(event, CertEvent::CaRotationServing);
    assert_eq!(settled.next, Next::After(Duration::ZERO));
    assert_eq!(draining.phase, Phase::Draining);
    assert_eq!(draining.previous, ca.previous);
    assert_eq!(draining.ca, ca.ca);
}

#[test]
fn draining_serves_from_the_new_ca_and_drops_the_old_after_the_grace() {
    let (first, _, publishing) = rotation_started();
    let step = phase_step(&publishing.ca, true, &policy(), at(2011.0));
    let (draining, _) = step.advance.unwrap();
    let serving = plan_at(stored_ca(&draining, &publishing.tls), 2011.0);
    assert_eq!(serving.events, [CertEvent::CertificateIssued]);
    assert!(signed_by(&serving.tls.serving, &draining.ca, 2011.0));
    assert!(!signed_by(&serving.tls.serving, &first.ca.ca, 2011.0));
    assert_eq!(
        serving.tls.bundle,
        bundle_of(&[&first.ca.ca, &draining.ca]),
        "both stay trusted while draining"
    );

    let waiting = phase_step(&serving.ca, true, &policy(), at(2011.0 + 119.0));
    assert!(waiting.advance.is_none());
    assert_eq!(waiting.next, Next::After(Duration::from_secs(1)));
    let done = phase_step(&serving.ca, true, &policy(), at(2011.0 + 120.0));
    let (stable, event) = done.advance.unwrap();
    assert_eq!(event, CertEvent::CaRotationDone);
    assert_eq!(
        (stable.phase, stable.previous.as_ref()),
        (Phase::Stable, None)
    );

    let after = plan_at(stored_ca(&stable, &serving.tls), 2131.0);
    assert_eq!(after.tls.bundle, bundle_of(&[&stable.ca]));
    assert_eq!(after.tls.serving, serving.tls.serving);
    assert!(after.events.is_empty());
}

#[test]
fn a_lost_ca_is_replaced_beside_the_trust_in_place_and_rotated_in_stages() {
    let first = plan_at(Observed::default(), 0.0);
    let lost = Observed {
        ca: None,
        ..stored(&first)
    };
    let plan = plan_at(lost, 60.0);
    assert_eq!(
        plan.events,
        [CertEvent::CaIssued {
            beside_old_trust: true
        }]
    );
    assert_eq!(plan.issued, [Certificate::Ca]);
    assert_eq!(plan.ca.phase, Phase::Publishing);
    // The old trust by its certificate only: its key went with the Secret.
    let previous = plan.ca.previous.clone().unwrap();
    assert_eq!(previous.cert_pem, first.tls.bundle);
    assert!(previous.key_pem.is_empty());
    assert_eq!(
        plan.tls.serving, first.tls.serving,
        "the pair in place serves on"
    );
    assert_eq!(plan.tls.bundle, bundle_of(&[&first.ca.ca, &plan.ca.ca]));
    // The certificate-only previous CA survives the Secret's encoding.
    let reread = stored(&plan);
    assert_eq!(reread.ca.as_ref(), Some(&plan.ca));

    let (draining, _) = phase_step(&plan.ca, true, &policy(), at(70.0))
        .advance
        .unwrap();
    let serving = plan_at(stored_ca(&draining, &plan.tls), 70.0);
    assert!(signed_by(&serving.tls.serving, &plan.ca.ca, 70.0));
}

#[test]
fn a_lost_ca_whose_old_pair_expired_mid_rotation_signs_with_the_new_ca() {
    let first = plan_at(Observed::default(), 0.0);
    let plan = plan_at(
        Observed {
            ca: None,
            ..stored(&first)
        },
        60.0,
    );
    // Still Publishing when the old pair runs out: the old trust cannot sign; the new CA does.
    let later = plan_at(stored(&plan), 1000.0);
    assert_eq!(later.ca.phase, Phase::Publishing);
    assert_eq!(later.events, [CertEvent::CertificateIssued]);
    assert!(signed_by(&later.tls.serving, &plan.ca.ca, 1000.0));
}

#[test]
fn garbage_or_a_mismatched_key_in_webhook_ca_counts_as_lost() {
    let first = plan_at(Observed::default(), 0.0);
    let mut garbage = secrets::ca_secret(&first.ca);
    garbage.data.as_mut().unwrap().insert(
        "ca.crt".into(),
        k8s_openapi::ByteString(b"not a certificate".to_vec()),
    );
    assert_eq!(secrets::read_ca(&garbage), None);
    let other = authority::issue_ca_at(CA_VALIDITY, t0()).unwrap();
    let mismatched = CaState {
        ca: PemPair {
            cert_pem: first.ca.ca.cert_pem.clone(),
            key_pem: other.key_pem,
        },
        ..first.ca.clone()
    };
    assert_eq!(secrets::read_ca(&secrets::ca_secret(&mismatched)), None);
    let plan = plan_at(stored_ca(&mismatched, &first.tls), 60.0);
    assert_eq!(
        plan.events,
        [CertEvent::CaIssued {
            beside_old_trust: true
        }]
    );
    assert_ne!(plan.ca.ca.cert_pem, first.ca.ca.cert_pem);
}

#[test]
fn an_expired_ca_counts_as_lost_and_with_nothing_trusted_starts_stable() {
    let first = plan_at(Observed::default(), 0.0);
    // Nobody ran for longer than the CA lives: everything stored has expired.
    let plan = plan_at(stored(&first), 3001.0);
    assert_eq!(plan.ca.phase, Phase::Stable);
    assert_eq!(plan.ca.previous, None);
    assert_eq!(
        plan.events,
        [
            CertEvent::CaIssued {
                beside_old_trust: false
            },
            CertEvent::CertificateIssued
        ]
    );
    assert!(signed_by(&plan.tls.serving, &plan.ca.ca, 3001.0));
    assert_eq!(plan.tls.bundle, bundle_of(&[&plan.ca.ca]));
}

#[test]
fn koord_managers_ca_is_taken_over_on_a_first_start() {
    assert!(is_first_start(false, false));
    assert!(!is_first_start(true, false) && !is_first_start(false, true));
    let theirs = authority::issue_ca_at(CA_VALIDITY, t0()).unwrap();
    let adopted = plan_at(
        Observed {
            koordinator_ca: Some(KoordinatorCa {
                secret: "koordinator-webhook-certs".into(),
                ca: Ok(theirs.clone()),
            }),
            ..Observed::default()
        },
        0.0,
    );
    assert_eq!(adopted.ca.ca, theirs);
    assert_eq!(adopted.ca.phase, Phase::Stable);
    assert_eq!(
        adopted.events,
        [
            CertEvent::CaAdopted {
                secret: "koordinator-webhook-certs".into()
            },
            CertEvent::CertificateIssued
        ]
    );
    assert_eq!(adopted.issued, [Certificate::Serving]);
    assert!(signed_by(&adopted.tls.serving, &theirs, 0.0));

    let refused = plan_at(
        Observed {
            koordinator_ca: Some(KoordinatorCa {
                secret: "koordinator-webhook-certs".into(),
                ca: Err(CertError::Ca("the certificate is not a CA".into())),
            }),
            ..Observed::default()
        },
        0.0,
    );
    assert!(refused.events[0].is_warning());
    assert!(refused.events[0].note().contains("not a CA"));
    assert_eq!(
        refused.events[1],
        CertEvent::CaIssued {
            beside_old_trust: false
        }
    );
    assert_ne!(refused.ca.ca, theirs);
}

/// Once taken over, koord-manager's CA is not taken over again when our Secrets are gone (the
/// pass does not read it then): a new CA, and an Event that says why and how to allow it again.
#[test]
fn koord_managers_ca_is_taken_over_once_per_installation() {
    let before = AdoptedBefore {
        secret: "koordinator-webhook-certs".into(),
        at: "2026-11-27T10:00:00Z".into(),
    };
    let spent = plan_at(
        Observed {
            adopted_before: Some(before.clone()),
            ..Observed::default()
        },
        0.0,
    );
    assert_eq!(
        spent.events,
        [
            CertEvent::CaAdoptionSpent(before),
            CertEvent::CaIssued {
                beside_old_trust: false
            },
            CertEvent::CertificateIssued
        ]
    );
    assert!(!spent.events[0].is_warning());
    assert!(spent.events[0].note().contains("delete that ConfigMap"));
}

#[test]
fn a_phase_without_a_start_or_with_one_ahead_of_this_clock_starts_now() {
    let (_, _, publishing) = rotation_started();
    for since in [
        None,
        Some(jiff::Timestamp::try_from(at(2001.0 + 365.0 * 86400.0)).unwrap()),
    ] {
        let skewed = CaState {
            since,
            ..publishing.ca.clone()
        };
        let plan = plan_at(stored_ca(&skewed, &publishing.tls), 2005.0);
        assert!(plan.write_ca, "the restarted clock is stored");
        let restarted = plan.ca.since.unwrap();
        assert_eq!(restarted, jiff::Timestamp::try_from(at(2005.0)).unwrap());
        // The phase then ends on time, not a year later.
        let step = phase_step(&plan.ca, true, &policy(), at(2005.0 + 10.0));
        assert!(step.advance.is_some());
    }
}

#[test]
fn a_draining_start_behind_this_clock_ends_the_phase_at_once() {
    // Another leader's clock ran behind: the grace already passed by this one's.
    let (_, _, publishing) = rotation_started();
    let draining = CaState {
        phase: Phase::Draining,
        since: Some(jiff::Timestamp::try_from(at(1000.0)).unwrap()),
        ..publishing.ca.clone()
    };
    let step = phase_step(&draining, false, &policy(), at(2011.0));
    assert_eq!(step.advance.unwrap().1, CertEvent::CaRotationDone);
}

/// `--webhook-host [::1]`: the pair is issued for the address without brackets, and the host
/// readiness and the planner verify against is that same address (one place derives it).
#[test]
fn a_bracketed_ipv6_webhook_host_is_issued_and_verified_without_brackets() {
    let policy = CertPolicy {
        hosts: crate::operator::serving_hosts(Some("[::1]"), crate::names::Mode::Enforce),
        ..policy()
    };
    assert_eq!(policy.verify_host(), "::1");
    let first = plan(Observed::default(), &policy, at(0.0)).unwrap();
    let (ca, serving) = (&first.ca.ca, &first.tls.serving);
    authority::verify_serving_at(
        serving.cert_pem.as_bytes(),
        ca.cert_pem.as_bytes(),
        policy.verify_host(),
        at(1.0),
    )
    .unwrap();
    // And the pair is checked for the host, not merely signed: the Service name is not `::1`'s.
    let elsewhere = authority::verify_serving_at(
        serving.cert_pem.as_bytes(),
        ca.cert_pem.as_bytes(),
        "elsewhere.example",
        at(1.0),
    );
    assert!(elsewhere.is_err(), "{elsewhere:?}");
}
