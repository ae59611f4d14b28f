//! The webhook keeper's plan against configurations as they are found: deleted, drifted, blanked
//! or already right, in service and URL mode.

use super::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ServiceReference;
use k8s_openapi::api::admissionregistration::v1::WebhookClientConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

fn service(bundle: &[u8]) -> WebhookClientConfig {
    WebhookClientConfig {
        ca_bundle: Some(ByteString(bundle.to_vec())),
        service: Some(ServiceReference {
            name: "svc".to_owned(),
            namespace: "ns".to_owned(),
            path: Some("/p".to_owned()),
            port: Some(443),
        }),
        url: None,
    }
}

fn url(bundle: &[u8]) -> WebhookClientConfig {
    WebhookClientConfig {
        ca_bundle: Some(ByteString(bundle.to_vec())),
        service: None,
        url: Some("https://127.0.0.1:9443/p".to_owned()),
    }
}

fn view<'a>(name: &'a str, client_config: &'a WebhookClientConfig) -> EntryView<'a> {
    EntryView {
        name,
        client_config,
        failure_policy: None,
        timeout_seconds: None,
        namespace_selector: None,
        object_selector: None,
        match_conditions: None,
    }
}

fn ops_of(ops: &[Value]) -> Vec<(String, String)> {
    ops.iter()
        .map(|o| {
            (
                o["op"].as_str().unwrap().to_owned(),
                o["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_configuration_deleted_while_running_waits_before_it_is_created_again() {
    let absence = Absence::default();
    assert!(
        absence.may_create("never-seen"),
        "first look: create at once"
    );
    absence.present("c");
    assert!(!absence.may_create("c"), "just deleted: wait");
    absence
        .0
        .lock()
        .unwrap()
        .insert("c", Some(std::time::Instant::now() - RECREATE_AFTER));
    assert!(absence.may_create("c"), "still missing after the grace");
    absence.present("c");
    assert!(!absence.may_create("c"), "a new absence waits again");
}

#[test]
fn nothing_to_do_when_the_bundle_matches() {
    let (a, b) = (service(b"CA"), service(b"CA"));
    assert!(
        plan(&[view("e", &a)], &[view("e", &b)], false, |_| None)
            .0
            .is_empty()
    );
}

#[test]
fn a_split_entry_gets_its_selector_and_its_labelled_part_in_one_patch() {
    let c = service(b"CA");
    let lacks = LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "koordinator.sh/qosClass".to_owned(),
            operator: "DoesNotExist".to_owned(),
            values: None,
        }]),
        match_labels: None,
    };
    let split = EntryView {
        object_selector: Some(&lacks),
        ..view("e", &c)
    };
    let part = view("e-qos", &c);
    let (other, gone) = (view("other", &c), view("gone", &c));
    // The part goes right before its entry (the API server runs mutating webhooks in order), after
    // an entry that is removed in the same patch.
    let (ops, fields) = plan(
        &[other, gone, view("e", &c)],
        &[other, part, split],
        false,
        |name| Some(json!({ "name": name })),
    );
    assert_eq!(
        ops_of(&ops),
        [
            ("test".to_owned(), "/webhooks/2/name".to_owned()),
            ("add".to_owned(), "/webhooks/2/objectSelector".to_owned()),
            ("test".to_owned(), "/webhooks/1/name".to_owned()),
            ("remove".to_owned(), "/webhooks/1".to_owned()),
            ("add".to_owned(), "/webhooks/1".to_owned()),
        ]
    );
    assert_eq!(
        ops[1]["value"]["matchExpressions"][0]["operator"],
        "DoesNotExist"
    );
    assert_eq!(ops[4]["value"]["name"], "e-qos");
    assert_eq!(fields, [("e".to_owned(), OwnedField::ObjectSelector)]);
    // A missing entry with nothing wanted after it goes at the end.
    let (ops, _) = plan(&[other], &[other, part], false, |name| {
        Some(json!({ "name": name }))
    });
    assert_eq!(ops_of(&ops), [("add".to_owned(), "/webhooks/-".to_owned())]);
    // Joined again: the selector is cleared and the part removed, in the same patch.
    let (ops, _) = plan(&[part, split], &[view("e", &c)], false, |_| None);
    assert_eq!(
        ops_of(&ops),
        [
            ("test".to_owned(), "/webhooks/1/name".to_owned()),
            ("add".to_owned(), "/webhooks/1/objectSelector".to_owned()),
            ("test".to_owned(), "/webhooks/0/name".to_owned()),
            ("remove".to_owned(), "/webhooks/0".to_owned()),
        ]
    );
    assert_eq!(ops[1]["value"], json!({}));
}

#[test]
fn match_conditions_are_set_and_cleared_and_none_equals_empty() {
    let c = service(b"CA");
    let narrowed = vec![MatchCondition {
        name: "koord-amplified-node".to_owned(),
        expression: "true".to_owned(),
    }];
    let empty = Vec::new();
    let with = |conditions| EntryView {
        match_conditions: conditions,
        ..view("e", &c)
    };
    let (ops, fields) = plan(&[with(None)], &[with(Some(&narrowed))], false, |_| None);
    assert_eq!(
        ops_of(&ops),
        [
            ("test".to_owned(), "/webhooks/0/name".to_owned()),
            ("add".to_owned(), "/webhooks/0/matchConditions".to_owned())
        ]
    );
    assert_eq!(ops[1]["value"][0]["name"], "koord-amplified-node");
    assert_eq!(fields, [("e".to_owned(), OwnedField::MatchConditions)]);
    // Narrowing turned off: the conditions go.
    let (ops, _) = plan(&[with(Some(&narrowed))], &[with(None)], false, |_| None);
    assert_eq!(ops[1]["value"], json!([]));
    // The API server stores no list for an empty one: nothing to do.
    assert!(
        plan(&[with(None)], &[with(Some(&empty))], false, |_| None)
            .0
            .is_empty()
    );
}

#[test]
fn hand_edits_of_owned_fields_are_put_back_and_named() {
    let c = service(b"CA");
    let configured = LabelSelector {
        match_labels: Some([("team".to_owned(), "a".to_owned())].into()),
        match_expressions: None,
    };
    let edited = LabelSelector::default();
    let want = EntryView {
        failure_policy: Some("Fail"),
        timeout_seconds: Some(10),
        namespace_selector: Some(&configured),
        ..view("e", &c)
    };
    let have = EntryView {
        failure_policy: Some("Ignore"),
        timeout_seconds: Some(30),
        namespace_selector: Some(&edited),
        ..view("e", &c)
    };
    let (ops, repaired) = plan(&[have], &[want], false, |_| None);
    assert_eq!(
        ops_of(&ops),
        [
            ("test".to_owned(), "/webhooks/0/name".to_owned()),
            ("add".to_owned(), "/webhooks/0/failurePolicy".to_owned()),
            ("add".to_owned(), "/webhooks/0/timeoutSeconds".to_owned()),
            ("add".to_owned(), "/webhooks/0/namespaceSelector".to_owned()),
        ]
    );
    assert_eq!(ops[1]["value"], json!("Fail"));
    assert_eq!(ops[2]["value"], json!(10));
    assert_eq!(ops[3]["value"], json!({"matchLabels": {"team": "a"}}));
    let fields: Vec<&str> = repaired.iter().map(|(_, f)| f.name()).collect();
    assert_eq!(
        fields,
        ["failurePolicy", "timeoutSeconds", "namespaceSelector"]
    );
}

#[test]
fn an_absent_selector_is_the_empty_one_the_api_server_stores() {
    let c = service(b"CA");
    let stored = LabelSelector::default();
    let have = EntryView {
        namespace_selector: Some(&stored),
        ..view("e", &c)
    };
    let (ops, repaired) = plan(&[have], &[view("e", &c)], false, |_| None);
    assert!(ops.is_empty() && repaired.is_empty(), "{ops:?}");
}

#[test]
fn service_mode_touches_only_the_bundle() {
    let mut elsewhere = service(b"OLD");
    elsewhere.service.as_mut().unwrap().name = "other".to_owned();
    let want = service(b"NEW");
    let (ops, repaired) = plan(&[view("e", &elsewhere)], &[view("e", &want)], false, |_| {
        None
    });
    assert_eq!(repaired, [("e".to_owned(), OwnedField::CaBundle)]);
    assert_eq!(
        ops_of(&ops),
        [
            ("test".to_owned(), "/webhooks/0/name".to_owned()),
            (
                "add".to_owned(),
                "/webhooks/0/clientConfig/caBundle".to_owned()
            ),
        ]
    );
    // The bundle travels base64-encoded, as the API expects.
    assert_eq!(ops[1]["value"], json!("TkVX"));
}

#[test]
fn url_mode_replaces_the_whole_client_config() {
    let (have, want) = (service(b"CA"), url(b"CA"));
    let (ops, _) = plan(&[view("e", &have)], &[view("e", &want)], true, |_| None);
    assert_eq!(
        ops_of(&ops)[1],
        ("add".to_owned(), "/webhooks/0/clientConfig".to_owned())
    );
    assert_eq!(ops[1]["value"]["url"], json!("https://127.0.0.1:9443/p"));
}

#[test]
fn entries_of_gates_off_go_and_missing_ones_come() {
    let c = service(b"CA");
    let current = [
        view("a", &c),
        view("off1", &c),
        view("b", &c),
        view("off2", &c),
    ];
    let want = [view("a", &c), view("b", &c), view("new", &c)];
    let (ops, _) = plan(&current, &want, false, |name| Some(json!({"name": name})));
    assert_eq!(
        ops_of(&ops),
        [
            ("test".to_owned(), "/webhooks/3/name".to_owned()),
            ("remove".to_owned(), "/webhooks/3".to_owned()),
            ("test".to_owned(), "/webhooks/1/name".to_owned()),
            ("remove".to_owned(), "/webhooks/1".to_owned()),
            ("add".to_owned(), "/webhooks/-".to_owned()),
        ]
    );
    assert_eq!(ops[4]["value"], json!({"name": "new"}));
}

// The steps against a scripted API server: exactly these calls, in this order.
mod against_the_api {
    use super::*;
    use crate::scripted_api::{self, Step};
    use base64::Engine;
    use hyper::http::{Method, StatusCode};

    const MUTATING_PATH: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/koordinator-mutating-webhook-configuration";
    const VALIDATING_PATH: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/koordinator-validating-webhook-configuration";

    fn desired() -> Desired {
        Desired {
            gates: FeatureGates::default(),
            target: WebhookTarget::from_flags(
                None,
                9443,
                &crate::install::entry_policy::EntryPolicy::default(),
            ),
        }
    }

    /// A pass's writer for these tests: pod entries as the manifests have them.
    fn keeper<'a>(
        client: &'a kube::Client,
        fence: &'a Leadership,
        absence: &'a Absence,
    ) -> Keeper<'a> {
        Keeper {
            client,
            fence,
            absence,
            pods: None,
        }
    }

    fn stored<C: Configuration>(bundle: &[u8]) -> Value {
        let mut value =
            serde_json::to_value(C::desired(&desired().gates, &desired().target, bundle)).unwrap();
        value["metadata"]["resourceVersion"] = json!("7");
        value
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[tokio::test]
    async fn missing_configurations_are_created_whole_by_apply() {
        let (client, server) = scripted_api::client(vec![
            Step::not_found(Method::GET, MUTATING_PATH),
            Step::new(
                Method::PATCH,
                MUTATING_PATH,
                StatusCode::CREATED,
                stored::<MutatingWebhookConfiguration>(b"ca"),
            ),
            Step::not_found(Method::GET, VALIDATING_PATH),
            Step::new(
                Method::PATCH,
                VALIDATING_PATH,
                StatusCode::CREATED,
                stored::<ValidatingWebhookConfiguration>(b"ca"),
            ),
        ]);
        let wrote = converge_all(
            &keeper(&client, &Leadership::always(), &Absence::default()),
            &desired(),
            b"ca",
        )
        .await
        .unwrap();
        drop(client);
        let seen = server.await.unwrap();
        assert!(!wrote.is_empty());
        for write in [&seen[1], &seen[3]] {
            assert_eq!(write.content_type, "application/apply-patch+yaml");
            assert!(
                write.path_and_query.contains("fieldManager=koord-webhook"),
                "{}",
                write.path_and_query
            );
            let entries = write.body["webhooks"].as_array().unwrap();
            assert!(!entries.is_empty());
            for entry in entries {
                assert_eq!(entry["clientConfig"]["caBundle"], b64(b"ca"));
            }
        }
    }

    #[tokio::test]
    async fn a_stale_bundle_is_patched_entry_by_entry_behind_name_guards() {
        let (client, server) = scripted_api::client(vec![
            Step::new(
                Method::GET,
                MUTATING_PATH,
                StatusCode::OK,
                stored::<MutatingWebhookConfiguration>(b"old"),
            ),
            Step::new(
                Method::PATCH,
                MUTATING_PATH,
                StatusCode::OK,
                stored::<MutatingWebhookConfiguration>(b"new"),
            ),
            // Already current: read, not written.
            Step::new(
                Method::GET,
                VALIDATING_PATH,
                StatusCode::OK,
                stored::<ValidatingWebhookConfiguration>(b"new"),
            ),
        ]);
        let wrote = converge_all(
            &keeper(&client, &Leadership::always(), &Absence::default()),
            &desired(),
            b"new",
        )
        .await
        .unwrap();
        drop(client);
        let seen = server.await.unwrap();
        assert!(!wrote.is_empty());
        let patch = &seen[1];
        assert_eq!(patch.content_type, "application/json-patch+json");
        let ops = patch.body.as_array().unwrap();
        // First the precondition: the configuration as read, or a 409.
        assert_eq!(
            ops[0],
            json!({"op": "add", "path": "/metadata/resourceVersion", "value": "7"})
        );
        let ops = &ops[1..];
        let entries = stored::<MutatingWebhookConfiguration>(b"new")["webhooks"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(
            ops.len(),
            2 * entries,
            "a guard and an add per entry: {ops:?}"
        );
        for (i, pair) in ops.chunks(2).enumerate() {
            assert_eq!(pair[0]["op"], "test");
            assert_eq!(pair[0]["path"], format!("/webhooks/{i}/name"));
            assert_eq!(pair[1]["op"], "add");
            assert_eq!(
                pair[1]["path"],
                format!("/webhooks/{i}/clientConfig/caBundle")
            );
            assert_eq!(pair[1]["value"], b64(b"new"));
        }
    }

    #[tokio::test]
    async fn a_replica_without_the_lease_reads_but_writes_nothing() {
        let (follower, _election) = crate::operator::leader::election(Default::default());
        assert!(!follower.is_leader());
        let (client, server) = scripted_api::client(vec![Step::new(
            Method::GET,
            MUTATING_PATH,
            StatusCode::OK,
            stored::<MutatingWebhookConfiguration>(b"old"),
        )]);
        let result = converge_all(
            &keeper(&client, &follower, &Absence::default()),
            &desired(),
            b"new",
        )
        .await;
        drop(client);
        assert!(
            matches!(
                result,
                Err(ConfigurationError {
                    source: WriteError::NotLeader(_),
                    ..
                })
            ),
            "{result:?}"
        );
        assert_eq!(server.await.unwrap().len(), 1, "no write after the read");
    }
}
