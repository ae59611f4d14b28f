//! The configurations as rendered: selectors, conditions, names and policies per entry.

use super::*;
use crate::features::FeatureGates;
use crate::install::entry_policy::{parse_failure_policy, parse_namespace_label};

/// `(name, objectSelector operators, has conditions, failurePolicy)` of the pod webhooks.
fn pod_webhooks(target: &WebhookTarget) -> Vec<(String, Vec<String>, bool, String)> {
    let gates = FeatureGates::default();
    let mutating = mutating(&gates, target, None).webhooks.unwrap();
    let validating = validating(&gates, target, None).webhooks.unwrap();
    let shown = |name: String, selector: Option<LabelSelector>, conditions: bool, policy| {
        let operators = selector
            .and_then(|s| s.match_expressions)
            .into_iter()
            .flatten()
            .map(|r| format!("{} {}", r.key, r.operator))
            .collect();
        (name, operators, conditions, policy)
    };
    let pods = |rules: &Option<Vec<RuleWithOperations>>| {
        rules
            .iter()
            .flatten()
            .any(|r| r.resources == Some(vec!["pods".to_owned()]))
    };
    let m = mutating.into_iter().filter(|w| pods(&w.rules)).map(|w| {
        shown(
            w.name,
            w.object_selector,
            w.match_conditions.is_some(),
            w.failure_policy.unwrap(),
        )
    });
    let v = validating.into_iter().filter(|w| pods(&w.rules)).map(|w| {
        shown(
            w.name,
            w.object_selector,
            w.match_conditions.is_some(),
            w.failure_policy.unwrap(),
        )
    });
    m.chain(v).collect()
}

#[test]
fn qos_split_registers_a_labelled_part_beside_each_pod_entry() {
    let narrowed = |reach| WebhookTarget {
        pod_reach: PodReach {
            create: reach,
            validate: Reach::nothing(),
        },
        policy: EntryPolicy {
            failure_policies: vec![parse_failure_policy("vpod.koordinator.sh=Ignore").unwrap()],
            ..Default::default()
        },
        ..Default::default()
    };
    let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    // Off (the default, the manifests and the chart): one webhook per entry, as before.
    assert_eq!(
        pod_webhooks(&narrowed(Reach::nothing())),
        [
            (
                "mpod-create.koordinator.sh".to_owned(),
                vec![],
                true,
                "Fail".to_owned()
            ),
            (
                "vpod.koordinator.sh".to_owned(),
                vec![],
                true,
                "Ignore".to_owned()
            ),
        ]
    );
    // On: the labelled part (first: see `webhooks_of`) takes the pods with the QoS label
    // without conditions, under the entry's failurePolicy; the entry keeps its conditions for
    // the rest.
    let split = WebhookTarget {
        qos_split: true,
        ..narrowed(Reach::nothing())
    };
    assert_eq!(
        pod_webhooks(&split),
        [
            (
                "mpod-create-qos.koordinator.sh".to_owned(),
                s(&["koordinator.sh/qosClass Exists"]),
                false,
                "Fail".to_owned()
            ),
            (
                "mpod-create.koordinator.sh".to_owned(),
                s(&["koordinator.sh/qosClass DoesNotExist"]),
                true,
                "Fail".to_owned()
            ),
            (
                "vpod-qos.koordinator.sh".to_owned(),
                s(&["koordinator.sh/qosClass Exists"]),
                false,
                "Ignore".to_owned()
            ),
            (
                "vpod.koordinator.sh".to_owned(),
                s(&["koordinator.sh/qosClass DoesNotExist"]),
                true,
                "Ignore".to_owned()
            ),
        ]
    );
    // Not narrowed (mpod-update registered too), the two are still one partition of the
    // pods, neither with conditions.
    let wide = WebhookTarget {
        qos_split: true,
        policy: EntryPolicy {
            narrow_calls: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let wide = pod_webhooks(&wide);
    assert_eq!(wide.len(), 5);
    assert!(wide.iter().all(|(_, _, conditions, _)| !conditions));
    assert_eq!(wide[0].1, s(&["koordinator.sh/qosClass Exists"]));
    assert_eq!(wide[1].1, s(&["koordinator.sh/qosClass DoesNotExist"]));
    assert_eq!(wide[2].1, s(&["pod.koordinator.sh/mutating-update In"]));
    assert_eq!(wide[3].1, s(&["koordinator.sh/qosClass Exists"]));
    assert_eq!(wide[4].1, s(&["koordinator.sh/qosClass DoesNotExist"]));
}

#[test]
fn namespace_label_exemptions_become_selector_requirements() {
    let target = WebhookTarget {
        policy: EntryPolicy {
            excluded_namespace_labels: vec![
                parse_namespace_label("koordinator.sh/webhook-exempt").unwrap(),
                parse_namespace_label("tier=infra").unwrap(),
            ],
            ..Default::default()
        },
        ..Default::default()
    };
    let config = validating(&FeatureGates::default(), &target, None);
    let vpod = config
        .webhooks
        .unwrap()
        .into_iter()
        .find(|w| w.name == "vpod.koordinator.sh")
        .unwrap();
    let expressions = vpod.namespace_selector.unwrap().match_expressions.unwrap();
    let shown: Vec<(String, String, Option<Vec<String>>)> = expressions
        .into_iter()
        .skip(1)
        .map(|e| (e.key, e.operator, e.values))
        .collect();
    assert_eq!(
        shown,
        [
            (
                "koordinator.sh/webhook-exempt".to_owned(),
                "DoesNotExist".to_owned(),
                None
            ),
            (
                "tier".to_owned(),
                "NotIn".to_owned(),
                Some(vec!["infra".to_owned()])
            ),
        ]
    );
    assert!(
        target
            .policy
            .args()
            .contains(&"--exclude-namespace-label=tier=infra".to_owned())
    );
}

#[test]
fn entries_follow_the_table_and_the_gates() {
    let gates = FeatureGates::default();
    let wide = WebhookTarget {
        policy: EntryPolicy {
            narrow_calls: false,
            ..EntryPolicy::default()
        },
        ..WebhookTarget::default()
    };
    let m = mutating(&gates, &wide, None);
    let names: Vec<_> = m.webhooks.unwrap().iter().map(|w| w.name.clone()).collect();
    assert_eq!(
        names,
        [
            "mpod-create.koordinator.sh",
            "mpod-update.koordinator.sh",
            "melasticquota.koordinator.sh",
            "mnode-status.koordinator.sh",
            "mreservation-create.koordinator.sh"
        ]
    );
    assert!(
        mutating(&gates, &wide, None)
            .webhooks
            .unwrap()
            .iter()
            .all(|w| w.match_conditions.is_none()),
        "wide entries carry no conditions"
    );
    assert!(
        wide.policy
            .args()
            .contains(&"--narrow-calls=off".to_owned())
    );
    let off: FeatureGates = "PodMutatingWebhook=false".parse().unwrap();
    let m = mutating(&off, &WebhookTarget::default(), None);
    assert!(
        m.webhooks
            .unwrap()
            .iter()
            .all(|w| !w.name.starts_with("mpod"))
    );

    let v = validating(&gates, &WebhookTarget::default(), None);
    let vpod = v
        .webhooks
        .unwrap()
        .into_iter()
        .find(|w| w.name == "vpod.koordinator.sh")
        .unwrap();
    assert_eq!(vpod.side_effects, "NoneOnDryRun");
    assert_eq!(vpod.failure_policy.as_deref(), Some("Fail"));
    let excluded = &vpod.namespace_selector.unwrap().match_expressions.unwrap()[0];
    assert_eq!(excluded.key, "kubernetes.io/metadata.name");
    assert_eq!(
        excluded.values.as_deref().unwrap(),
        ["koordinator-system", "kube-system"]
    );
}

#[test]
fn url_mode_and_ca_bundle() {
    let target = WebhookTarget::from_flags(Some("::1"), 9443, &EntryPolicy::default());
    let v = validating(&FeatureGates::default(), &target, Some(b"PEM"));
    let node = v
        .webhooks
        .unwrap()
        .into_iter()
        .find(|w| w.name == "vnode.koordinator.sh")
        .unwrap();
    assert_eq!(
        node.client_config.url.as_deref(),
        Some("https://[::1]:9443/validate-node")
    );
    assert_eq!(node.client_config.ca_bundle.unwrap().0, b"PEM");
    assert_eq!(node.failure_policy.as_deref(), Some("Ignore"));
}

#[test]
fn failure_policy_timeout_and_excluded_namespaces_are_settings() {
    let target = WebhookTarget {
        policy: EntryPolicy {
            webhook_timeout_seconds: 5,
            failure_policies: vec![
                parse_failure_policy("all=Ignore").unwrap(),
                parse_failure_policy("vpod.koordinator.sh=Fail").unwrap(),
            ],
            excluded_namespaces: vec!["batch-jobs".to_owned()],
            ..EntryPolicy::default()
        },
        ..WebhookTarget::default()
    };
    let gates = FeatureGates::default();
    let v = validating(&gates, &target, None);
    for w in v.webhooks.unwrap() {
        let want = if w.name == "vpod.koordinator.sh" {
            "Fail"
        } else {
            "Ignore"
        };
        assert_eq!(w.failure_policy.as_deref(), Some(want), "{}", w.name);
        assert_eq!(w.timeout_seconds, Some(5));
        if w.name == "vpod.koordinator.sh" {
            let excluded = &w.namespace_selector.unwrap().match_expressions.unwrap()[0];
            assert_eq!(
                excluded.values.as_deref().unwrap(),
                [namespace(), "kube-system", "batch-jobs"]
            );
        }
    }
    let err = parse_failure_policy("vpods=Ignore").unwrap_err();
    assert!(
        err.contains("one of: all, mpod-create.koordinator.sh"),
        "{err}"
    );
    assert!(parse_failure_policy("vpod.koordinator.sh=Maybe").is_err());
    assert!(parse_failure_policy("vpod.koordinator.sh").is_err());
}

#[test]
fn narrowed_entries_carry_their_conditions_and_drop_what_no_request_needs() {
    let target = WebhookTarget::default();
    assert!(target.policy.args().is_empty(), "on is the default");
    let m = mutating(&FeatureGates::default(), &target, None);
    let v = validating(&FeatureGates::default(), &target, None);
    let conditions: Vec<(String, Vec<String>)> = m
        .webhooks
        .unwrap()
        .into_iter()
        .map(|w| (w.name, w.match_conditions))
        .chain(
            v.webhooks
                .unwrap()
                .into_iter()
                .map(|w| (w.name, w.match_conditions)),
        )
        .map(|(name, c)| (name, c.into_iter().flatten().map(|c| c.name).collect()))
        .collect();
    let named = |entry: &str| {
        conditions
            .iter()
            .find(|(name, _)| name == entry)
            .map(|(_, c)| c.clone())
    };
    assert_eq!(named("mpod-update.koordinator.sh"), None, "left out");
    assert_eq!(named("mpod-create.koordinator.sh"), Some(vec![]));
    assert_eq!(named("vpod.koordinator.sh"), Some(vec![]));
    assert_eq!(
        named("mnode-status.koordinator.sh"),
        Some(vec!["koord-amplified-node".to_owned()])
    );
    assert_eq!(
        named("vnode.koordinator.sh"),
        Some(vec!["koord-node-rules".to_owned()])
    );
    assert_eq!(
        named("velasticquota.koordinator.sh"),
        Some(vec!["koord-quota-tree-change".to_owned()])
    );
}

/// A shadow registers every entry of every enabled endpoint (mutating ones too) in its one
/// validating configuration, under names of its own, failing open, wide, calling its Service.
#[test]
fn a_shadow_registers_every_entry_as_validating_under_its_own_names() {
    let gates = FeatureGates::default();
    let shadow = WebhookTarget {
        policy: EntryPolicy {
            mode: Mode::Shadow,
            ..EntryPolicy::default()
        },
        ..WebhookTarget::default()
    };
    let wide = WebhookTarget {
        policy: EntryPolicy {
            narrow_calls: false,
            ..EntryPolicy::default()
        },
        ..WebhookTarget::default()
    };
    let v = validating(&gates, &shadow, None);
    assert_eq!(v.metadata.name.as_deref(), Some("koord-webhook-shadow"));
    let entries = v.webhooks.unwrap();
    let wide_names: Vec<String> = mutating(&gates, &wide, None)
        .webhooks
        .unwrap()
        .into_iter()
        .map(|w| w.name)
        .chain(
            validating(&gates, &wide, None)
                .webhooks
                .unwrap()
                .into_iter()
                .map(|w| w.name),
        )
        .map(|name| Mode::Shadow.entry_name(&name))
        .collect();
    let names: Vec<&str> = entries.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(
        names, wide_names,
        "every entry Koordinator registers, mutating ones first"
    );
    assert!(names.contains(&"mpod-create.shadow.koord-webhook.io"));
    for entry in &entries {
        assert_eq!(
            entry.failure_policy.as_deref(),
            Some("Ignore"),
            "{}",
            entry.name
        );
        assert_eq!(entry.match_conditions, None, "{}", entry.name);
        let service = entry.client_config.service.as_ref().unwrap();
        assert_eq!(service.name, "koord-webhook-shadow");
    }
    assert!(Mode::Shadow.mutating_configuration().is_none());
    assert!(!shadow.policy.narrows() && shadow.policy.audited("vpod.koordinator.sh"));
    assert_eq!(shadow.policy.args(), ["--mode=shadow"]);
    assert_eq!(
        shadow.policy.audited_endpoints().unwrap().len(),
        ENDPOINTS.len(),
        "every endpoint's rules in Audit"
    );
}
