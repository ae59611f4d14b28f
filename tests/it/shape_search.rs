//! The shape search: for every endpoint, bodies at the request size limit whose JSON is cheap in
//! bytes and may be costly decoded, placed where the kind's own schema says a value goes (every
//! array, map and string field of the object, found in its OpenAPI schema, the Reservation's pod
//! template included), and the bytes allocated while answering each (counted by the process's
//! allocator) held to the fuzz harness's bound, a fixed multiple of the body's size. Every site is
//! tried once with its own shape at 64 KiB, then random sites and shapes at the full size. The shapes:
//! an array of empty items, an array of zeros, an array of deeply nested arrays, a map of many
//! keys, a string of escapes. A new field of a type that is large when empty is found here, not by
//! the next review.
//!
//! `SHAPE_SEARCH_BYTES` sets the random pass's body size (default 1 MiB; the server's limit is
//! 8 MiB), `SHAPE_SEARCH_CASES` its cases per endpoint (default 24) and
//! `SHAPE_SEARCH_EVERY_SITE_BYTES` the first pass's size.

use std::collections::BTreeSet;

use koord_webhook::entries::EndpointName;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

use crate::fuzz_seeds::harness;

/// One step of a path into an object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Key(String),
    /// Into an array's (first) item.
    Item,
}

/// What an array's items are, as far as an empty one goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Item {
    Object,
    Array,
    Text,
    Number,
    Other,
}

/// Where a shape can go.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Site {
    Array(Vec<Step>, Item),
    Map(Vec<Step>),
    Text(Vec<Step>),
}

impl Site {
    fn path(&self) -> &[Step] {
        match self {
            Site::Array(p, _) | Site::Map(p) | Site::Text(p) => p,
        }
    }
}

/// The shapes, each filling a site up to a size.
#[derive(Debug, Clone, Copy)]
enum Shape {
    EmptyItems,
    Zeros,
    Nested,
    ManyKeys,
    Escapes,
}

/// The JSON text of `shape` for `site`, about `bytes` long.
fn shape_text(site: &Site, shape: Shape, bytes: usize) -> String {
    let repeat = |unit: &str, open: &str, close: &str| {
        let n = (bytes / (unit.len() + 1)).max(1);
        let mut out = String::with_capacity(bytes + 16);
        out.push_str(open);
        for i in 0..n {
            if i > 0 {
                out.push(',');
            }
            out.push_str(unit);
        }
        out.push_str(close);
        out
    };
    match (site, shape) {
        (Site::Text(_), _) => repeat("\\u0041", "\"", "\"").replace(',', ""),
        (Site::Map(_), _) | (_, Shape::ManyKeys) => {
            let n = bytes / 12;
            let keys: Vec<String> = (0..n).map(|i| format!("\"k{i:x}\":\"\"")).collect();
            format!("{{{}}}", keys.join(","))
        }
        (Site::Array(_, item), Shape::EmptyItems | Shape::Escapes) => {
            let unit = match item {
                Item::Object | Item::Other => "{}",
                Item::Array => "[]",
                Item::Text => "\"\"",
                Item::Number => "0",
            };
            repeat(unit, "[", "]")
        }
        (Site::Array(..), Shape::Zeros) => repeat("0", "[", "]"),
        (Site::Array(..), Shape::Nested) => {
            // Within serde_json's recursion limit (128), with the object's own depth.
            let unit = format!("{}{}", "[".repeat(90), "]".repeat(90));
            repeat(&unit, "[", "]")
        }
    }
}

/// Every array, map and string field of `schema` (resolving `$ref`s against `root`), to a depth.
fn sites(
    root: &Value,
    schema: &Value,
    path: &mut Vec<Step>,
    seen: &mut Vec<String>,
    out: &mut BTreeSet<Site>,
) {
    if path.len() > 12 {
        return;
    }
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        if seen.iter().any(|r| r == reference) {
            return;
        }
        let name = reference.rsplit('/').next().unwrap_or_default();
        let target = root
            .get("$defs")
            .or_else(|| root.get("definitions"))
            .and_then(|d| d.get(name));
        if let Some(target) = target {
            seen.push(reference.to_owned());
            sites(root, target, path, seen, out);
            seen.pop();
        }
        return;
    }
    for combined in ["allOf", "anyOf", "oneOf"] {
        for part in schema
            .get(combined)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            sites(root, part, path, seen, out);
        }
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if types.contains(&"string") {
        out.insert(Site::Text(path.clone()));
    }
    if let Some(items) = schema.get("items") {
        out.insert(Site::Array(path.clone(), item_of(root, items)));
        path.push(Step::Item);
        sites(root, items, path, seen, out);
        path.pop();
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (key, property) in properties {
            path.push(Step::Key(key.clone()));
            sites(root, property, path, seen, out);
            path.pop();
        }
    }
    if schema
        .get("additionalProperties")
        .is_some_and(Value::is_object)
    {
        out.insert(Site::Map(path.clone()));
    }
}

/// Every site of the endpoint's kind.
fn sites_of(endpoint: EndpointName) -> BTreeSet<Site> {
    let schema = kind_schema(endpoint);
    let mut found = BTreeSet::new();
    sites(
        &schema,
        &schema,
        &mut Vec::new(),
        &mut Vec::new(),
        &mut found,
    );
    found
}

fn item_of(root: &Value, items: &Value) -> Item {
    let resolved = match items.get("$ref").and_then(Value::as_str) {
        Some(r) => root
            .get("$defs")
            .or_else(|| root.get("definitions"))
            .and_then(|d| d.get(r.rsplit('/').next().unwrap_or_default()))
            .unwrap_or(items),
        None => items,
    };
    let is = |t: &str| {
        resolved
            .get("type")
            .is_some_and(|v| v == t || v.as_array().is_some_and(|a| a.iter().any(|x| x == t)))
    };
    if resolved.get("properties").is_some() || is("object") {
        Item::Object
    } else if is("array") {
        Item::Array
    } else if is("string") {
        Item::Text
    } else if is("integer") || is("number") {
        Item::Number
    } else {
        Item::Other
    }
}

fn schema_of<T: schemars::JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).expect("a schema is JSON")
}

/// The object schema of each endpoint's kind, as a caller may fill it: the full Kubernetes types
/// and Koordinator's CRDs with their metadata (a CRD's schema leaves it out) and the Reservation's
/// pod template, which its CRD leaves open, as a pod template.
fn kind_schema(endpoint: EndpointName) -> Value {
    use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use koord_webhook::apis::{ClusterColocationProfile, ElasticQuota, Reservation};
    let crd = |mut schema: Value| {
        graft(&mut schema, &[], "metadata", schema_of::<ObjectMeta>());
        schema
    };
    match endpoint {
        EndpointName::MutatePod | EndpointName::ValidatePod => schema_of::<Pod>(),
        EndpointName::MutateElasticQuota | EndpointName::ValidateElasticQuota => {
            crd(schema_of::<ElasticQuota>())
        }
        EndpointName::MutateNodeStatus | EndpointName::ValidateNode => schema_of::<Node>(),
        EndpointName::ValidateConfigMap => schema_of::<ConfigMap>(),
        EndpointName::ValidateColocationProfile => crd(schema_of::<ClusterColocationProfile>()),
        EndpointName::MutateReservation => {
            let mut reservation = crd(schema_of::<Reservation>());
            graft(
                &mut reservation,
                &["spec"],
                "template",
                schema_of::<PodTemplateSpec>(),
            );
            reservation
        }
    }
}

/// Puts `sub`'s root at property `name` of the object schema at `path` (properties followed, `$ref`s
/// resolved) in `root`, and `sub`'s definitions among `root`'s.
fn graft(root: &mut Value, path: &[&str], name: &str, mut sub: Value) {
    let defs = sub
        .as_object_mut()
        .and_then(|m| m.remove("$defs"))
        .unwrap_or(json!({}));
    let root_defs = root
        .as_object_mut()
        .expect("a schema is an object")
        .entry("$defs")
        .or_insert(json!({}));
    for (k, v) in defs.as_object().into_iter().flatten() {
        root_defs
            .as_object_mut()
            .unwrap()
            .entry(k.clone())
            .or_insert(v.clone());
    }
    let mut at = String::new();
    for step in path {
        at = format!("{at}/properties/{step}");
        let reference = root
            .pointer(&at)
            .and_then(|s| s.get("$ref").or_else(|| s.pointer("/anyOf/0/$ref")))
            .and_then(Value::as_str)
            .map(|r| r.rsplit('/').next().unwrap_or_default().to_owned());
        if let Some(def) = reference {
            at = format!("/$defs/{def}");
        }
    }
    let target = if at.is_empty() {
        Some(&mut *root)
    } else {
        root.pointer_mut(&at)
    };
    let target = target.unwrap_or_else(|| panic!("no schema at {path:?}"));
    target["properties"][name] = sub;
}

/// `value` at `path` in `object`, creating what is missing (an array gets one item).
fn put(object: &mut Value, path: &[Step], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        *object = value;
        return;
    };
    match first {
        Step::Key(key) => {
            if !object.is_object() {
                *object = json!({});
            }
            let slot = object
                .as_object_mut()
                .unwrap()
                .entry(key.clone())
                .or_insert(Value::Null);
            put(slot, rest, value);
        }
        Step::Item => {
            if object.as_array().is_none_or(|a| a.is_empty()) {
                *object = json!([{}]);
            }
            put(&mut object.as_array_mut().unwrap()[0], rest, value);
        }
    }
}

/// A review to `endpoint` from its fuzz seed, with `shape` at `site` of the object, about `bytes`.
fn shaped_review(endpoint: EndpointName, site: &Site, shape: Shape, bytes: usize) -> Vec<u8> {
    let seed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(fuzz_target(endpoint))
        .join("review.json");
    let seed = std::fs::read(&seed).unwrap_or_else(|e| panic!("{}: {e}", seed.display()));
    let mut review: Value = serde_json::from_slice(&seed).expect("the seed is JSON");
    const MARK: &str = "\u{1}shape\u{1}";
    put(&mut review["request"]["object"], site.path(), json!(MARK));
    let text = review.to_string();
    let mark = serde_json::to_string(MARK).unwrap();
    let room = bytes.saturating_sub(text.len());
    text.replacen(&mark, &shape_text(site, shape, room), 1)
        .into_bytes()
}

/// The fuzz target (and seed folder) of each endpoint.
fn fuzz_target(endpoint: EndpointName) -> &'static str {
    use EndpointName::*;
    match endpoint {
        MutatePod => "mutate_pod",
        ValidatePod => "validate_pod",
        MutateElasticQuota => "mutate_elastic_quota",
        ValidateElasticQuota => "validate_elastic_quota",
        MutateNodeStatus => "mutate_node_status",
        ValidateNode => "validate_node",
        MutateReservation => "mutate_reservation",
        ValidateColocationProfile => "validate_colocation_profile",
        ValidateConfigMap => "validate_configmap",
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn every_endpoint_answers_every_shape_within_the_memory_bound() {
    let bytes = env_or("SHAPE_SEARCH_BYTES", 1 << 20);
    let cases = env_or("SHAPE_SEARCH_CASES", 24) as u32;
    let mut failures = Vec::new();
    for endpoint in koord_webhook::entries::ENDPOINTS.iter().map(|e| e.endpoint) {
        let found: Vec<Site> = sites_of(endpoint).into_iter().collect();
        assert!(found.len() > 3, "{endpoint:?}: {} sites", found.len());
        // Every site with its own shape (empty items in every array, many keys in every map,
        // escapes in every string) at a small size: a type that is large when empty shows here
        // whatever the random pass below draws.
        let small = env_or("SHAPE_SEARCH_EVERY_SITE_BYTES", 64 << 10);
        for site in &found {
            let body = shaped_review(endpoint, site, Shape::EmptyItems, small);
            let peak = harness::review_measured(endpoint, &body);
            if peak > harness::answer_bound(body.len()) {
                failures.push(format!(
                    "{endpoint:?}: its own shape at {site:?}: {} bytes took {peak} to answer",
                    body.len()
                ));
            }
        }
        let shapes = prop_oneof![
            Just(Shape::EmptyItems),
            Just(Shape::Zeros),
            Just(Shape::Nested),
            Just(Shape::ManyKeys),
            Just(Shape::Escapes),
        ];
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let worst = std::cell::RefCell::new((0.0f64, String::new()));
        runner
            .run(
                &(0..found.len(), shapes, bytes / 2..=bytes),
                |(i, shape, size)| {
                    let site = &found[i];
                    let body = shaped_review(endpoint, site, shape, size);
                    let peak = harness::review_measured(endpoint, &body);
                    let ratio = peak as f64 / body.len() as f64;
                    if ratio > worst.borrow().0 {
                        *worst.borrow_mut() = (ratio, format!("{shape:?} at {site:?}"));
                    }
                    prop_assert!(
                        peak <= harness::answer_bound(body.len()),
                        "{endpoint:?}: {shape:?} at {site:?}: {} bytes took {peak} to answer",
                        body.len()
                    );
                    Ok(())
                },
            )
            .unwrap_or_else(|e| failures.push(e.to_string()));
        let worst = worst.into_inner();
        eprintln!(
            "{endpoint:?}: {} sites, worst {:.1}x the body ({})",
            found.len(),
            worst.0,
            worst.1
        );
    }
    assert!(
        failures.is_empty(),
        "{} shapes over the bound:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The search finds the shape of issue 60 on its own: a Reservation's template volumes as empty
/// objects (each ~11 KB decoded into k8s-openapi's PodSpec, on 8bf1732).
#[test]
fn the_reservation_template_volumes_are_among_the_sites() {
    let found = sites_of(EndpointName::MutateReservation);
    let volumes = Site::Array(
        ["spec", "template", "spec", "volumes"]
            .map(|k| Step::Key(k.into()))
            .to_vec(),
        Item::Object,
    );
    assert!(found.contains(&volumes), "{} sites", found.len());
    let body = shaped_review(
        EndpointName::MutateReservation,
        &volumes,
        Shape::EmptyItems,
        1 << 20,
    );
    let peak = harness::review_measured(EndpointName::MutateReservation, &body);
    assert!(
        peak <= harness::answer_bound(body.len()),
        "{peak} bytes for {}",
        body.len()
    );
}

/// Every annotation key the code names (a string literal of a domain, a slash and a name): each is
/// a site whose text some rule may read as JSON.
fn annotation_keys() -> BTreeSet<String> {
    fn walk(dir: &std::path::Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for literal in text.split('"').skip(1).step_by(2) {
                    let Some((domain, name)) = literal.split_once('/') else {
                        continue;
                    };
                    let domain_like = domain.contains('.')
                        && domain.chars().all(|c| {
                            c.is_ascii_lowercase() || c.is_ascii_digit() || ".-".contains(c)
                        });
                    let name_like = !name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
                    if domain_like && name_like && domain.ends_with(".sh") {
                        out.insert(literal.to_owned());
                    }
                }
            }
        }
    }
    let mut keys = BTreeSet::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut keys,
    );
    keys
}

/// JSON texts cheap in bytes and costly as trees, about `bytes` long, for an annotation's value.
fn embedded_shapes(bytes: usize) -> Vec<(&'static str, String)> {
    let many = |value: &str| {
        let n = bytes / (value.len() + 10);
        let entries: Vec<String> = (0..n).map(|i| format!("\"{i:x}\":{value}")).collect();
        format!("{{{}}}", entries.join(","))
    };
    let items = |unit: &str| {
        let n = bytes / (unit.len() + 1);
        format!("[{}]", vec![unit; n].join(","))
    };
    vec![
        ("empty objects", items("{}")),
        ("empty strings", items("\"\"")),
        ("many keys", many("\"\"")),
        ("maps of maps", many("{\"limits\":{\"\":\"\"}}")),
        (
            "maps of maps under one key",
            format!("{{\"containers\":{}}}", many("{\"limits\":{\"\":\"\"}}")),
        ),
        ("numbers", many("0")),
    ]
}

/// What answering may take beyond what the body's shape is charged in the decode budget: the
/// annotations a rule reads as JSON (the budget counts each as one string), bounded by the API
/// server's limit on them, [`MAX_ANNOTATIONS_BYTES`](koord_webhook::apis::meta::MAX_ANNOTATIONS_BYTES),
/// at the most a JSON text costs read as a tree per byte.
const EMBEDDED_BYTES_PER_ANNOTATION_BYTE: usize = 32;

/// Annotations whose text a rule reads as JSON cost, answered, no more than the body is charged
/// plus a fixed bound (the API server's annotation limit times what JSON costs as a tree per
/// byte): each key the code names, on every endpoint, filled just under that limit with each shape;
/// and on every endpoint an annotation far over it, refused before any rule reads it. On 5e9516b
/// a 2 MiB `extended-resource-spec` of maps of maps took 22 times its bytes beyond its charge.
#[test]
fn annotations_read_as_json_cost_a_bounded_amount_beyond_the_charge() {
    use koord_webhook::apis::meta::MAX_ANNOTATIONS_BYTES;
    use koord_webhook::memory::BodyShape;
    let keys = annotation_keys();
    assert!(
        keys.contains("node.koordinator.sh/extended-resource-spec")
            && keys.contains("quota.scheduling.koordinator.sh/shared-weight"),
        "{keys:?}"
    );
    let beyond = EMBEDDED_BYTES_PER_ANNOTATION_BYTE * MAX_ANNOTATIONS_BYTES;
    let mut failures = Vec::new();
    let mut worst = (0usize, String::new());
    let mut try_one = |endpoint: EndpointName, key: &str, shape: &str, text: String| {
        let site = Site::Text(vec![
            Step::Key("metadata".into()),
            Step::Key("annotations".into()),
            Step::Key(key.to_owned()),
        ]);
        let mut review: Value =
            serde_json::from_slice(&shaped_review(endpoint, &site, Shape::Escapes, 0)).unwrap();
        review["request"]["object"]["metadata"]["annotations"][key] = json!(text);
        let body = serde_json::to_vec(&review).unwrap();
        let peak = harness::review_measured(endpoint, &body);
        let charged = BodyShape::of(&body).allowance(1) + harness::ANSWER_FLOOR;
        let over = peak.saturating_sub(charged);
        if over > worst.0 {
            worst = (over, format!("{endpoint:?} {key} {shape} {}", body.len()));
        }
        if over > beyond {
            failures.push(format!(
                "{endpoint:?}: {key} of {shape}, {} bytes: took {peak}, {over} beyond its charge",
                body.len()
            ));
        }
    };
    let costly = ["empty objects", "many keys", "maps of maps under one key"];
    for endpoint in koord_webhook::entries::ENDPOINTS.iter().map(|e| e.endpoint) {
        for key in &keys {
            for (shape, text) in embedded_shapes(MAX_ANNOTATIONS_BYTES - 4096) {
                if costly.contains(&shape) {
                    try_one(endpoint, key, shape, text);
                }
            }
        }
        // Far over the limit: refused before the rules, whichever key.
        let (shape, text) = embedded_shapes(2 << 20).swap_remove(4);
        try_one(
            endpoint,
            "node.koordinator.sh/extended-resource-spec",
            shape,
            text,
        );
    }
    eprintln!(
        "{} keys; the most beyond the charge: {} bytes ({})",
        keys.len(),
        worst.0,
        worst.1
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
