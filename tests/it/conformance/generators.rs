//! The generators: one seeded random case per call, for each endpoint the harness covers.

use std::collections::BTreeMap;

use koord_webhook::entries;
use serde_json::{Value, json};

use super::{Case, Rng};

fn review(
    kind: (&str, &str, &str),
    resource: &str,
    sub: Option<&str>,
    operation: &str,
    namespace: &str,
    object: Value,
    old: Value,
) -> Value {
    let (group, version, kind) = kind;
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "conformance", "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "subResource": sub,
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": object.pointer("/metadata/name").or(old.pointer("/metadata/name")).cloned().unwrap_or(json!("")),
            "namespace": namespace, "operation": operation,
            "userInfo": {"username": "conformance"},
            "object": object, "oldObject": old,
            "dryRun": false
        }
    })
}

const QUOTA_KIND: (&str, &str, &str) = ("scheduling.sigs.k8s.io", "v1alpha1", "ElasticQuota");

/// A quantity as a user writes one: canonical or not, zero, fractional, huge.
fn quantity(rng: &mut Rng, memory: bool) -> Value {
    let cpu = [
        "0", "1", "2", "4", "500m", "1500m", "33000m", "0.5", "10", "100",
    ];
    let mem = [
        "0",
        "1Gi",
        "2Gi",
        "512Mi",
        "30720Mi",
        "1G",
        "1073741824",
        "4Gi",
        "100Gi",
    ];
    json!(rng.pick(if memory { &mem[..] } else { &cpu[..] }))
}

fn resources(rng: &mut Rng) -> Value {
    let mut r = serde_json::Map::new();
    if rng.chance(90) {
        r.insert("cpu".into(), quantity(rng, false));
    }
    if rng.chance(80) {
        r.insert("memory".into(), quantity(rng, true));
    }
    Value::Object(r)
}

fn elastic_quota(rng: &mut Rng, name: &str, parent: Option<&str>, is_parent: bool) -> Value {
    let mut labels = serde_json::Map::new();
    if let Some(p) = parent {
        labels.insert("quota.scheduling.koordinator.sh/parent".into(), json!(p));
    }
    if is_parent || rng.chance(10) {
        labels.insert(
            "quota.scheduling.koordinator.sh/is-parent".into(),
            json!(if is_parent { "true" } else { "false" }),
        );
    }
    if rng.chance(30) {
        labels.insert(
            "quota.scheduling.koordinator.sh/tree-id".into(),
            json!(rng.pick(&["", "t1", "t2"])),
        );
    }
    if rng.chance(10) {
        labels.insert(
            "quota.scheduling.koordinator.sh/is-root".into(),
            json!("true"),
        );
    }
    let mut annotations = serde_json::Map::new();
    if rng.chance(15) {
        annotations.insert(
            "quota.scheduling.koordinator.sh/namespaces".into(),
            json!(rng.pick(&["[\"team-a\"]", "[\"team-b\",\"team-c\"]", "[]", "not json"])),
        );
    }
    let mut spec = serde_json::Map::new();
    let min = resources(rng);
    let max = resources(rng);
    if rng.chance(90) {
        spec.insert("min".into(), min);
    }
    if rng.chance(95) {
        spec.insert("max".into(), max);
    }
    json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": "team-a", "labels": labels, "annotations": annotations,
                     "resourceVersion": "1", "uid": format!("uid-{name}")},
        "spec": spec
    })
}

/// A quota tree of depth up to 3 and a change to it.
pub(super) fn quota_case(rng: &mut Rng, path: &'static str) -> Case {
    let mut objects = Vec::new();
    let mut parents: Vec<String> = vec![];
    let mut names: Vec<String> = vec![];
    for i in 0..rng.below(6) {
        let name = format!("q{i}");
        let parent = if parents.is_empty() || rng.chance(30) {
            None
        } else {
            Some(rng.pick(&parents).clone())
        };
        let is_parent = rng.chance(50);
        objects.push(elastic_quota(rng, &name, parent.as_deref(), is_parent));
        if is_parent {
            parents.push(name.clone());
        }
        names.push(name);
    }
    // The API server sends the stored object with every UPDATE and DELETE.
    let operation = if names.is_empty() {
        "CREATE"
    } else {
        *rng.pick(&["CREATE", "UPDATE", "DELETE"])
    };
    let name = if operation == "CREATE" || names.is_empty() {
        format!("new{}", rng.below(3))
    } else {
        rng.pick(&names).clone()
    };
    let parent = match rng.below(4) {
        0 => None,
        1 => Some(name.clone()),
        _ if !parents.is_empty() => Some(rng.pick(&parents).clone()),
        _ => Some("missing".to_owned()),
    };
    let is_parent = rng.chance(40);
    let object = elastic_quota(rng, &name, parent.as_deref(), is_parent);
    let old = objects
        .iter()
        .find(|o| o["metadata"]["name"] == json!(name))
        .cloned()
        .unwrap_or(Value::Null);
    let (object, old) = match operation {
        "CREATE" => (object, Value::Null),
        "UPDATE" => (object, old),
        _ => (Value::Null, old),
    };
    let gates = [
        ("MultiQuotaTree", rng.chance(30)),
        ("ElasticQuotaGuaranteeUsage", rng.chance(30)),
        ("ElasticQuotaEnableUpdateResourceKey", rng.chance(30)),
    ]
    .into_iter()
    .collect();
    Case {
        path,
        gates,
        objects,
        review: review(
            QUOTA_KIND,
            "elasticquotas",
            None,
            operation,
            "team-a",
            object,
            old,
        ),
    }
}

pub(super) fn node_status_case(rng: &mut Rng) -> Case {
    let ratio = rng
        .pick(&[
            Value::Null,
            json!("{\"cpu\":\"1.5\"}"),
            json!("{\"cpu\":1.5,\"memory\":2}"),
            json!("null"),
            json!("{}"),
            json!("not json"),
            json!("{\"cpu\":0.5}"),
            json!("{\"cpu\":null,\"memory\":2}"),
        ])
        .clone();
    // Unparsable forms beside the parsable ones, with every ratio form: not JSON; JSON with a
    // value Go's Quantity does not parse where no ratio reads it, and where one does; an escaped
    // quantity (Go parses the text with its escapes). Parsable forms Go reads its own way: a
    // number, `null`.
    let raw = rng
        .pick(&[
            Value::Null,
            json!("{\"cpu\":\"4\"}"),
            json!("null"),
            json!("bad"),
            json!("{\"cpu\":\"4\",\"memory\":\"lots\"}"),
            json!("{\"cpu\":\"four\"}"),
            json!("{\"cpu\":\"4\\u0030\"}"),
            json!("{\"cpu\":4}"),
            json!("{\"cpu\":null}"),
        ])
        .clone();
    let mut annotations = serde_json::Map::new();
    if !ratio.is_null() {
        annotations.insert(
            "node.koordinator.sh/resource-amplification-ratio".into(),
            ratio,
        );
    }
    if !raw.is_null() {
        annotations.insert("node.koordinator.sh/raw-allocatable".into(), raw);
    }
    let node = |cpu: &str| {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "n1", "annotations": annotations.clone(), "resourceVersion": "1"},
               "status": {"capacity": {"cpu": cpu, "memory": "8Gi"}, "allocatable": {"cpu": cpu, "memory": "8Gi"}}})
    };
    let new_cpu = *rng.pick(&["4", "8", "3500m"]);
    let old_cpu = *rng.pick(&["4", "8"]);
    Case {
        path: entries::MUTATE_NODE_STATUS,
        gates: BTreeMap::new(),
        objects: vec![],
        review: review(
            ("", "v1", "Node"),
            "nodes",
            Some("status"),
            "UPDATE",
            "",
            node(new_cpu),
            node(old_cpu),
        ),
    }
}

/// A key's JSON with field names in Koordinator's case or another one (Go's decoder matches names
/// case-insensitively).
fn cased(rng: &mut Rng, name: &str) -> String {
    match rng.below(4) {
        0 => name.to_uppercase(),
        1 => {
            let mut c = name.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        }
        _ => name.to_owned(),
    }
}

fn number(rng: &mut Rng) -> Value {
    rng.pick(&[
        json!(-10),
        json!(0),
        json!(1),
        json!(50),
        json!(100),
        json!(101),
        json!(1000),
        json!(7999),
        json!(12000),
        json!(0.5),
        json!("7"),
        Value::Null,
    ])
    .clone()
}

fn node_strategy(rng: &mut Rng, fields: &[&str]) -> Value {
    let mut strategy = serde_json::Map::new();
    strategy.insert("name".into(), json!(rng.pick(&["a", "b", "a"])));
    let selector = rng
        .pick(&[
            json!({"matchLabels": {"pool": "x"}}),
            json!({"matchLabels": {"pool": "y"}}),
            json!({"matchLabels": {"bad key!": "x"}}),
            json!({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x", "y"]}]}),
            json!({"matchExpressions": [{"key": "pool", "operator": "Bogus"}]}),
            json!({}),
        ])
        .clone();
    strategy.insert("nodeSelector".into(), selector);
    for field in fields {
        if rng.chance(50) {
            strategy.insert(cased(rng, field), number(rng));
        }
    }
    Value::Object(strategy)
}

/// The slo-controller ConfigMap with one or two of its keys, valid and broken.
/// `resource-qos-config` with network QoS (percentages, quantities, both, out of range) and a
/// memory QoS bound of four digits, for the cluster and one node strategy.
fn resource_qos(rng: &mut Rng) -> Value {
    let strategy = |rng: &mut Rng| {
        let mut classes = serde_json::Map::new();
        for class in ["lsrClass", "lsClass", "beClass"] {
            if !rng.chance(50) {
                continue;
            }
            let mut net = serde_json::Map::new();
            for field in [
                "ingressRequest",
                "ingressLimit",
                "egressRequest",
                "egressLimit",
            ] {
                if rng.chance(40) {
                    let value = rng
                        .pick(&[
                            json!(30),
                            json!(60),
                            json!(100),
                            json!(101),
                            json!(-1),
                            json!("50"),
                            json!("100M"),
                            json!("abc"),
                        ])
                        .clone();
                    net.insert(field.into(), value);
                }
            }
            let mut qos = json!({"networkQOS": net});
            if rng.chance(20) {
                qos["memoryQOS"] =
                    json!({"wmarkScalePermill": rng.pick(&[json!(500), json!(1001)]).clone()});
            }
            classes.insert(class.into(), qos);
        }
        Value::Object(classes)
    };
    let mut cfg = json!({"clusterStrategy": strategy(rng)});
    if rng.chance(30) {
        let mut node = strategy(rng);
        node["name"] = json!("n");
        node["nodeSelector"] = json!({"matchLabels": {"pool": "x"}});
        cfg["nodeStrategies"] = json!([node]);
    }
    cfg
}

pub(super) fn slo_config_case(rng: &mut Rng) -> Case {
    let colocation = [
        "cpuReclaimThresholdPercent",
        "memoryReclaimThresholdPercent",
        "degradeTimeMinutes",
        "updateTimeThresholdSeconds",
        "resourceDiffThreshold",
        "midCPUThresholdPercent",
        "metricAggregateDurationSeconds",
    ];
    let threshold = [
        "allocatableEvictPriorityThreshold",
        "cpuSuppressThresholdPercent",
        "memoryEvictThresholdPercent",
        "memoryEvictLowerPercent",
        "cpuEvictBESatisfactionLowerPercent",
        "cpuEvictBESatisfactionUpperPercent",
    ];
    let mut data = serde_json::Map::new();
    if rng.chance(60) {
        let mut cfg = serde_json::Map::new();
        cfg.insert(cased(rng, "enable"), json!(rng.chance(50)));
        for field in colocation {
            if rng.chance(30) {
                cfg.insert(cased(rng, field), number(rng));
            }
        }
        if rng.chance(50) {
            let strategies: Vec<Value> = (0..rng.below(3))
                .map(|_| node_strategy(rng, &colocation))
                .collect();
            cfg.insert(cased(rng, "nodeConfigs"), Value::Array(strategies));
        }
        data.insert(
            "colocation-config".into(),
            json!(serde_json::to_string(&cfg).unwrap()),
        );
    }
    if rng.chance(50) {
        let mut cluster = serde_json::Map::new();
        for field in threshold {
            if rng.chance(40) {
                cluster.insert(cased(rng, field), number(rng));
            }
        }
        let mut cfg = json!({"clusterStrategy": cluster});
        if rng.chance(40) {
            cfg["nodeStrategies"] = Value::Array(
                (0..rng.below(3))
                    .map(|_| node_strategy(rng, &threshold))
                    .collect(),
            );
        }
        data.insert(
            "resource-threshold-config".into(),
            json!(serde_json::to_string(&cfg).unwrap()),
        );
    }
    if rng.chance(40) {
        let bandwidth = rng
            .pick(&[
                json!("100M"),
                json!("1Gi"),
                json!("abc"),
                json!(-5),
                json!(""),
                Value::Null,
            ])
            .clone();
        let cfg = json!({"clusterStrategy": {cased(rng, "totalNetworkBandwidth"): bandwidth, "minFreeKbytesFactor": number(rng)}});
        data.insert(
            "system-config".into(),
            json!(serde_json::to_string(&cfg).unwrap()),
        );
    } else if rng.chance(20) {
        data.insert("system-config".into(), json!(*rng.pick(&["null", "{}"])));
    }
    if rng.chance(40) {
        data.insert(
            "resource-qos-config".into(),
            json!(serde_json::to_string(&resource_qos(rng)).unwrap()),
        );
    }
    if rng.chance(20) {
        let cfg = json!({"clusterStrategy": {cased(rng, "cpuBurstPercent"): number(rng)}});
        data.insert(
            "cpu-burst-config".into(),
            json!(serde_json::to_string(&cfg).unwrap()),
        );
    }
    if rng.chance(10) {
        data.insert(
            "colocation-config".into(),
            json!(rng.pick(&["not json", "null", "{}", "[]"])),
        );
    }
    let cm = |data: serde_json::Map<String, Value>| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system", "resourceVersion": "1"},
               "data": data})
    };
    let operation = *rng.pick(&["CREATE", "UPDATE"]);
    let old = if operation == "UPDATE" {
        cm(serde_json::Map::new())
    } else {
        Value::Null
    };
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"pool": "x"}}});
    Case {
        path: entries::VALIDATE_CONFIGMAP,
        gates: BTreeMap::new(),
        objects: vec![node],
        review: review(
            ("", "v1", "ConfigMap"),
            "configmaps",
            None,
            operation,
            "koordinator-system",
            cm(data),
            old,
        ),
    }
}

/// A pod for a quota whose `child-request` may not parse, with quota admission on.
pub(super) fn pod_quota_case(rng: &mut Rng) -> Case {
    let child_request = rng
        .pick(&[
            None,
            Some("{\"cpu\":\"1\"}"),
            Some("not json"),
            Some("null"),
            Some("{\"cpu\":\"x\"}"),
        ])
        .map(str::to_owned);
    let mut annotations = serde_json::Map::new();
    if let Some(c) = child_request {
        annotations.insert(
            "quota.scheduling.koordinator.sh/child-request".into(),
            json!(c),
        );
    }
    let quota = json!({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": "q", "namespace": "team-a", "annotations": annotations, "resourceVersion": "1",
                     "labels": {"quota.scheduling.koordinator.sh/parent": "koordinator-root-quota"}},
        "spec": {"max": {"cpu": "4", "memory": "4Gi"}, "min": {"cpu": "1"}}});
    let requests = rng
        .pick(&[
            json!({}),
            json!({"cpu": "1"}),
            json!({"cpu": "5"}),
            json!({"memory": "1Gi"}),
            json!({"nvidia.com/gpu": "1"}),
        ])
        .clone();
    let mut labels = serde_json::Map::new();
    if rng.chance(80) {
        labels.insert(
            "quota.scheduling.koordinator.sh/name".into(),
            json!(rng.pick(&["q", "missing", ""])),
        );
    }
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": requests.clone(), "limits": requests}}]}});
    let gates = [
        ("EnableQuotaAdmission", true),
        ("DisableDefaultQuota", rng.chance(30)),
    ]
    .into_iter()
    .collect();
    Case {
        path: entries::VALIDATE_POD,
        gates,
        objects: vec![quota],
        review: review(
            ("", "v1", "Pod"),
            "pods",
            None,
            "CREATE",
            "team-a",
            pod,
            Value::Null,
        ),
    }
}

/// A label selector over `app` / `tier` (or a namespace's `team`), every operator, sometimes broken.
fn selector(rng: &mut Rng, key: &str, values: &[&str]) -> Value {
    match rng.below(6) {
        0 => json!({"matchLabels": {key: rng.pick(values)}}),
        1 => {
            json!({"matchExpressions": [{"key": key, "operator": "In", "values": [rng.pick(values), rng.pick(values)]}]})
        }
        2 => {
            json!({"matchExpressions": [{"key": key, "operator": "NotIn", "values": [rng.pick(values)]}]})
        }
        3 => {
            json!({"matchExpressions": [{"key": key, "operator": rng.pick(&["Exists", "DoesNotExist"])}]})
        }
        4 => json!({}),
        _ => json!({"matchExpressions": [{"key": key, "operator": rng.pick(&["In", "Bogus"])}]}),
    }
}

fn colocation_profile(rng: &mut Rng, name: &str) -> Value {
    let mut spec = serde_json::Map::new();
    if rng.chance(85) {
        spec.insert(
            "selector".into(),
            selector(rng, "app", &["web", "db", "spark"]),
        );
    }
    if rng.chance(35) {
        spec.insert(
            "namespaceSelector".into(),
            selector(rng, "team", &["a", "b"]),
        );
    }
    if rng.chance(70) {
        spec.insert(
            "qosClass".into(),
            json!(rng.pick(&["BE", "LS", "LSR", "LSE", "SYSTEM"])),
        );
    }
    if rng.chance(60) {
        spec.insert(
            "priorityClassName".into(),
            json!(rng.pick(&[
                "koord-batch",
                "koord-prod",
                "koord-mid",
                "koord-free",
                "missing"
            ])),
        );
    }
    if rng.chance(30) {
        spec.insert(
            "koordinatorPriority".into(),
            json!(rng.pick(&[1111, 5000, 9100])),
        );
    }
    if rng.chance(50) {
        spec.insert("labels".into(), json!({"profiled": name}));
    }
    if rng.chance(40) {
        spec.insert(
            "annotations".into(),
            json!({"koordinator.sh/profiled": name}),
        );
    }
    if rng.chance(30) {
        spec.insert("schedulerName".into(), json!("koord-scheduler"));
    }
    if rng.chance(15) {
        spec.insert("labelKeysMapping".into(), json!({"app": "mapped-app"}));
    }
    if rng.chance(15) {
        spec.insert(
            "patch".into(),
            json!({"metadata": {"labels": {"patched": "yes"}}}),
        );
    }
    json!({"apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
           "metadata": {"name": name, "resourceVersion": "1"}, "spec": spec})
}

/// Koordinator's priority classes, one per band.
const PRIORITY_CLASSES: [(&str, i32); 4] = [
    ("koord-prod", 9500),
    ("koord-mid", 7500),
    ("koord-batch", 5500),
    ("koord-free", 3500),
];

fn priority_classes(classes: &[(&str, i32)]) -> Vec<Value> {
    classes
        .iter()
        .map(|(name, value)| {
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                   "metadata": {"name": name, "resourceVersion": "1"}, "value": value})
        })
        .collect()
}

fn container(rng: &mut Rng, name: &str) -> Value {
    let mut requests = serde_json::Map::new();
    let mut limits = serde_json::Map::new();
    if rng.chance(80) {
        let cpu = quantity(rng, false);
        requests.insert("cpu".into(), cpu.clone());
        if rng.chance(60) {
            limits.insert(
                "cpu".into(),
                if rng.chance(70) {
                    cpu
                } else {
                    quantity(rng, false)
                },
            );
        }
    }
    if rng.chance(70) {
        let memory = quantity(rng, true);
        requests.insert("memory".into(), memory.clone());
        if rng.chance(60) {
            limits.insert("memory".into(), memory);
        }
    }
    if rng.chance(10) {
        requests.insert("kubernetes.io/batch-cpu".into(), json!("1000"));
        limits.insert("kubernetes.io/batch-cpu".into(), json!("1000"));
    }
    let mut resources = serde_json::Map::new();
    if !requests.is_empty() {
        resources.insert("requests".into(), Value::Object(requests));
    }
    if !limits.is_empty() {
        resources.insert("limits".into(), Value::Object(limits));
    }
    json!({"name": name, "image": "busybox", "resources": resources})
}

/// A pod create (sometimes an update) against random ClusterColocationProfiles, priority classes and
/// namespaces, through `/mutate-pod`.
pub(super) fn mutate_pod_case(rng: &mut Rng) -> Case {
    let mut objects: Vec<Value> = (0..rng.below(3))
        .map(|i| colocation_profile(rng, &format!("profile-{i}")))
        .collect();
    objects.extend(priority_classes(&PRIORITY_CLASSES));
    let namespace = *rng.pick(&["team-a", "team-b"]);
    objects.push(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "team-a", "resourceVersion": "1", "labels": {"team": "a"}}}));
    objects.push(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "team-b", "resourceVersion": "1", "labels": {"team": "b"}}}));
    let mut labels = serde_json::Map::new();
    if rng.chance(85) {
        labels.insert("app".into(), json!(rng.pick(&["web", "db", "spark"])));
    }
    if rng.chance(15) {
        labels.insert(
            "koordinator.sh/qosClass".into(),
            json!(rng.pick(&["LS", "BE"])),
        );
    }
    let mut spec = json!({"containers": (0..1 + rng.below(2)).map(|i| container(rng, &format!("c{i}"))).collect::<Vec<_>>()});
    if rng.chance(20) {
        spec["initContainers"] = json!([container(rng, "init")]);
    }
    if rng.chance(15) {
        spec["priorityClassName"] = json!("koord-prod");
        spec["priority"] = json!(9500);
    }
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": namespace, "labels": labels}, "spec": spec});
    let (operation, old) = if rng.chance(10) {
        ("UPDATE", pod.clone())
    } else {
        ("CREATE", Value::Null)
    };
    let mut gates = BTreeMap::new();
    gates.insert("ColocationProfileSkipMutatingResources", rng.chance(20));
    Case {
        path: entries::MUTATE_POD,
        gates,
        objects,
        review: review(
            ("", "v1", "Pod"),
            "pods",
            None,
            operation,
            namespace,
            pod,
            old,
        ),
    }
}

/// A pod's Koordinator marks drawn at random: QoS label, priority class and value, Koordinator
/// priority label, the reserve-pod annotation.
fn marked_pod(rng: &mut Rng, namespace: &str) -> Value {
    let mut labels = serde_json::Map::new();
    if rng.chance(60) {
        labels.insert(
            "koordinator.sh/qosClass".into(),
            json!(rng.pick(&["LS", "BE", "LSR", "LSE", "SYSTEM", "NONE", "bogus"])),
        );
    }
    if rng.chance(25) {
        labels.insert(
            "koordinator.sh/priority".into(),
            json!(rng.pick(&["1111", "5000", "9100", "x"])),
        );
    }
    if rng.chance(15) {
        labels.insert(
            "quota.scheduling.koordinator.sh/preemptible".into(),
            json!(rng.pick(&["true", "false"])),
        );
    }
    let mut annotations = serde_json::Map::new();
    if rng.chance(8) {
        annotations.insert(
            "scheduling.koordinator.sh/reserve-pod".into(),
            json!("true"),
        );
    }
    let mut spec = json!({"containers": (0..1 + rng.below(2)).map(|i| {
        let mut c = container(rng, &format!("c{i}"));
        if rng.chance(20) {
            c["resources"] = json!({"requests": {"kubernetes.io/batch-cpu": rng.pick(&["1000", "500"]), "kubernetes.io/batch-memory": "1Gi"},
                                     "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}});
        } else if rng.chance(15) {
            let (name, value) = *rng.pick(&[
                ("koordinator.sh/gpu", "100"),
                ("koordinator.sh/gpu", "150"),
                ("koordinator.sh/gpu", "50"),
                ("koordinator.sh/gpu-core", "50"),
                ("koordinator.sh/gpu-memory-ratio", "200"),
                ("nvidia.com/gpu", "1"),
                ("nvidia.com/gpu", "2"),
            ]);
            c["resources"] = json!({"requests": {name: value}, "limits": {name: value}});
        }
        c
    }).collect::<Vec<_>>()});
    if rng.chance(60) {
        let (class, value) = *rng.pick(&[
            PRIORITY_CLASSES[0],
            PRIORITY_CLASSES[1],
            PRIORITY_CLASSES[2],
            PRIORITY_CLASSES[3],
            ("other", 100),
        ]);
        spec["priorityClassName"] = json!(class);
        spec["priority"] = json!(value);
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": spec})
}

/// A pod create or update through `/validate-pod`: the reserve-pod annotation, QoS and priority
/// agreement, batch resources, LSR/LSE CPU, changes to those on update.
pub(super) fn validate_pod_case(rng: &mut Rng) -> Case {
    let pod = marked_pod(rng, "team-a");
    let (operation, old) = if rng.chance(40) {
        let old = if rng.chance(50) {
            pod.clone()
        } else {
            marked_pod(rng, "team-a")
        };
        ("UPDATE", old)
    } else {
        ("CREATE", Value::Null)
    };
    let mut gates = BTreeMap::new();
    gates.insert("ColocationProfileSkipValidatingPriority", rng.chance(15));
    gates.insert("ValidatePodDeviceResource", rng.chance(50));
    Case {
        path: entries::VALIDATE_POD,
        gates,
        objects: Vec::new(),
        review: review(
            ("", "v1", "Pod"),
            "pods",
            None,
            operation,
            "team-a",
            pod,
            old,
        ),
    }
}

/// A Reservation create against random ClusterColocationProfiles, through `/mutate-reservation`.
pub(super) fn mutate_reservation_case(rng: &mut Rng) -> Case {
    let mut objects: Vec<Value> = (0..rng.below(3))
        .map(|i| colocation_profile(rng, &format!("profile-{i}")))
        .collect();
    objects.extend(priority_classes(&[
        PRIORITY_CLASSES[0],
        PRIORITY_CLASSES[2],
    ]));
    let mut labels = serde_json::Map::new();
    if rng.chance(80) {
        labels.insert("app".into(), json!(rng.pick(&["web", "db", "spark"])));
    }
    let mut template_labels = serde_json::Map::new();
    if rng.chance(50) {
        template_labels.insert("app".into(), json!(rng.pick(&["web", "db", "spark"])));
    }
    let reservation = json!({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
        "metadata": {"name": "r", "labels": labels},
        "spec": {"owners": [{"object": {"name": "web"}}],
                 "template": {"metadata": {"labels": template_labels},
                              "spec": {"containers": [container(rng, "c0")]}}}});
    let mut gates = BTreeMap::new();
    gates.insert("ColocationProfileSkipMutatingResources", rng.chance(20));
    Case {
        path: entries::MUTATE_RESERVATION,
        gates,
        objects,
        review: review(
            ("scheduling.koordinator.sh", "v1alpha1", "Reservation"),
            "reservations",
            None,
            "CREATE",
            "",
            reservation,
            Value::Null,
        ),
    }
}

/// A node create or update through `/validate-node`, against an slo-controller ConfigMap whose
/// node strategies may come to overlap on it; sometimes with amplification ratios.
pub(super) fn validate_node_case(rng: &mut Rng) -> Case {
    let colocation = ["cpuReclaimThresholdPercent", "degradeTimeMinutes"];
    let threshold = ["cpuSuppressThresholdPercent"];
    let strategies = |rng: &mut Rng, fields: &[&str]| -> Vec<Value> {
        (0..rng.below(4))
            .map(|_| node_strategy(rng, fields))
            .collect()
    };
    let mut data = serde_json::Map::new();
    if rng.chance(70) {
        let cfg = json!({"enable": true, "nodeConfigs": strategies(rng, &colocation)});
        data.insert("colocation-config".into(), json!(cfg.to_string()));
    }
    if rng.chance(50) {
        let cfg = json!({"clusterStrategy": {}, "nodeStrategies": strategies(rng, &threshold)});
        data.insert("resource-threshold-config".into(), json!(cfg.to_string()));
    }
    if rng.chance(5) {
        data.insert("colocation-config".into(), json!("not json"));
    }
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system", "resourceVersion": "1"},
        "data": data});
    let labels = |rng: &mut Rng| {
        let mut labels = serde_json::Map::new();
        if rng.chance(80) {
            labels.insert("pool".into(), json!(rng.pick(&["x", "y", "z"])));
        }
        if rng.chance(30) {
            labels.insert("zone".into(), json!("a"));
        }
        Value::Object(labels)
    };
    let node = |rng: &mut Rng| {
        let mut annotations = serde_json::Map::new();
        if rng.chance(15) {
            annotations.insert(
                "node.koordinator.sh/resource-amplification-ratio".into(),
                json!(rng.pick(&[r#"{"cpu":1.5}"#, r#"{"cpu":0.5}"#, "not json"])),
            );
        }
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "n1", "labels": labels(rng), "annotations": annotations}})
    };
    let new = node(rng);
    let (operation, old) = if rng.chance(70) {
        ("UPDATE", node(rng))
    } else {
        ("CREATE", Value::Null)
    };
    Case {
        path: entries::VALIDATE_NODE,
        gates: BTreeMap::new(),
        objects: vec![config],
        review: review(("", "v1", "Node"), "nodes", None, operation, "", new, old),
    }
}
