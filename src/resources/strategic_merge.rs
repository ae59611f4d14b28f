//! Kubernetes strategic merge patch on JSON, generic over a table of list merge keys.
//!
//! Maps merge key by key (`null` deletes a key); lists with a merge key merge element by element
//! (`{"<key>": .., "$patch": "delete"}` removes one; a `{"$patch": "replace"}` element replaces the
//! whole list); lists of primitives marked `merge` take the union; other lists are replaced. A map
//! with `"$patch": "replace"` replaces its original, `"$patch": "delete"` removes it;
//! `$deleteFromPrimitiveList/<key>` and `$setElementOrder/<key>` are honoured.

use serde_json::{Map, Value};

/// How the lists at one path merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStrategy {
    /// Elements are maps merged by this key.
    MergeKey(&'static str),
    /// Elements are primitives; the result is the union.
    MergePrimitives,
}

/// List strategies by dotted path from the patched object's root (no indices): `spec.containers`.
pub trait MergeKeys {
    fn strategy(&self, path: &str) -> Option<ListStrategy>;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    #[error("unknown patch directive {0:?} at {1}")]
    UnknownDirective(String, String),
    #[error("element of {0} has no merge key {1:?}")]
    MissingMergeKey(String, &'static str),
    #[error("{0} has a directive that is not a string")]
    BadDirective(String),
}

const DIRECTIVE: &str = "$patch";
const DELETE_FROM: &str = "$deleteFromPrimitiveList/";
const ELEMENT_ORDER: &str = "$setElementOrder/";
const RETAIN_KEYS: &str = "$retainKeys";

/// Applies `patch` to `original`.
pub fn apply(original: &Value, patch: &Value, keys: &dyn MergeKeys) -> Result<Value, PatchError> {
    Ok(merge_value(Some(original), patch, "", keys)?.unwrap_or(Value::Null))
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// `None`: the value is deleted.
fn merge_value(
    original: Option<&Value>,
    patch: &Value,
    path: &str,
    keys: &dyn MergeKeys,
) -> Result<Option<Value>, PatchError> {
    match (original, patch) {
        (_, Value::Null) => Ok(None),
        (Some(Value::Object(o)), Value::Object(p)) => merge_map(o, p, path, keys),
        (None, Value::Object(p)) => merge_map(&Map::new(), p, path, keys),
        (Some(Value::Array(o)), Value::Array(p)) => merge_list(o, p, path, keys).map(Some),
        (None, Value::Array(p)) => merge_list(&[], p, path, keys).map(Some),
        (_, other) => Ok(Some(strip_directives(other))),
    }
}

fn directive(map: &Map<String, Value>, path: &str) -> Result<Option<String>, PatchError> {
    match map.get(DIRECTIVE) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(PatchError::BadDirective(path.to_owned())),
    }
}

/// A value as it lands in the result: directives never do.
fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !is_directive_key(k))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn is_directive_key(key: &str) -> bool {
    key == DIRECTIVE
        || key == RETAIN_KEYS
        || key.starts_with(DELETE_FROM)
        || key.starts_with(ELEMENT_ORDER)
}

fn merge_map(
    original: &Map<String, Value>,
    patch: &Map<String, Value>,
    path: &str,
    keys: &dyn MergeKeys,
) -> Result<Option<Value>, PatchError> {
    match directive(patch, path)?.as_deref() {
        None => {}
        Some("replace") => return Ok(Some(strip_directives(&Value::Object(patch.clone())))),
        Some("delete") => return Ok(None),
        Some(other) => {
            return Err(PatchError::UnknownDirective(
                other.to_owned(),
                path.to_owned(),
            ));
        }
    }
    let mut result = original.clone();
    if let Some(Value::Array(retain)) = patch.get(RETAIN_KEYS) {
        let retain: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        result.retain(|k, _| retain.contains(&k.as_str()));
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(DELETE_FROM) {
            if let (Some(Value::Array(list)), Value::Array(gone)) = (result.get_mut(field), value) {
                list.retain(|v| !gone.contains(v));
            }
            continue;
        }
        if is_directive_key(key) {
            continue;
        }
        match merge_value(original.get(key), value, &join(path, key), keys)? {
            Some(merged) => {
                result.insert(key.clone(), merged);
            }
            None => {
                result.remove(key);
            }
        }
    }
    for (key, order) in patch {
        if let (Some(field), Value::Array(order)) = (key.strip_prefix(ELEMENT_ORDER), order)
            && let Some(Value::Array(list)) = result.get_mut(field)
        {
            let strategy = keys.strategy(&join(path, field));
            reorder(list, order, strategy);
        }
    }
    Ok(Some(Value::Object(result)))
}

/// Puts the elements named in `order` first, in that order; the rest keep theirs.
fn reorder(list: &mut [Value], order: &[Value], strategy: Option<ListStrategy>) {
    let id = |v: &Value| match strategy {
        Some(ListStrategy::MergeKey(k)) => v.get(k).cloned(),
        _ => Some(v.clone()),
    };
    let position = |v: &Value| {
        let id = id(v);
        order
            .iter()
            .map(|o| match strategy {
                Some(ListStrategy::MergeKey(k)) => o.get(k).cloned(),
                _ => Some(o.clone()),
            })
            .position(|o| o.is_some() && o == id)
            .unwrap_or(usize::MAX)
    };
    list.sort_by_key(position);
}

fn merge_list(
    original: &[Value],
    patch: &[Value],
    path: &str,
    keys: &dyn MergeKeys,
) -> Result<Value, PatchError> {
    let replace_all = patch
        .iter()
        .any(|p| p.get(DIRECTIVE).and_then(Value::as_str) == Some("replace"));
    if replace_all {
        let rest = patch
            .iter()
            .filter(|p| p.get(DIRECTIVE).is_none())
            .map(strip_directives)
            .collect();
        return Ok(Value::Array(rest));
    }
    match keys.strategy(path) {
        None => Ok(strip_directives(&Value::Array(patch.to_vec()))),
        Some(ListStrategy::MergePrimitives) => {
            let mut result = original.to_vec();
            for p in patch {
                if !result.contains(p) {
                    result.push(p.clone());
                }
            }
            Ok(Value::Array(result))
        }
        Some(ListStrategy::MergeKey(key)) => {
            let mut result = original.to_vec();
            for p in patch {
                let Some(id) = p.get(key) else {
                    return Err(PatchError::MissingMergeKey(path.to_owned(), key));
                };
                let found = result.iter().position(|o| o.get(key) == Some(id));
                let delete = p.get(DIRECTIVE).and_then(Value::as_str) == Some("delete");
                match (found, delete) {
                    (Some(i), true) => {
                        result.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => match merge_value(Some(&result[i]), p, path, keys)? {
                        Some(merged) => result[i] = merged,
                        None => {
                            result.remove(i);
                        }
                    },
                    (None, false) => {
                        if let Some(added) = merge_value(None, p, path, keys)? {
                            result.push(added);
                        }
                    }
                }
            }
            Ok(Value::Array(result))
        }
    }
}

/// The merge keys of a PodSpec (from the Kubernetes API's patch metadata), under `prefix`.
pub struct PodSpecKeys {
    /// Path of the PodSpec: `spec` in a Pod, `spec.template.spec` in a Reservation.
    pub spec: &'static str,
    /// Paths of object metadata to treat as such (`metadata`, `spec.template.metadata`).
    pub metadata: &'static [&'static str],
}

pub const POD_KEYS: PodSpecKeys = PodSpecKeys {
    spec: "spec",
    metadata: &["metadata"],
};

pub const RESERVATION_KEYS: PodSpecKeys = PodSpecKeys {
    spec: "spec.template.spec",
    metadata: &["metadata", "spec.template.metadata"],
};

const POD_SPEC_LISTS: &[(&str, ListStrategy)] = &[
    ("containers", ListStrategy::MergeKey("name")),
    ("initContainers", ListStrategy::MergeKey("name")),
    ("ephemeralContainers", ListStrategy::MergeKey("name")),
    ("volumes", ListStrategy::MergeKey("name")),
    ("imagePullSecrets", ListStrategy::MergeKey("name")),
    ("hostAliases", ListStrategy::MergeKey("ip")),
    (
        "topologySpreadConstraints",
        ListStrategy::MergeKey("topologyKey"),
    ),
    ("schedulingGates", ListStrategy::MergeKey("name")),
    ("resourceClaims", ListStrategy::MergeKey("name")),
];

/// Lists inside each container.
const CONTAINER_LISTS: &[(&str, ListStrategy)] = &[
    ("env", ListStrategy::MergeKey("name")),
    ("ports", ListStrategy::MergeKey("containerPort")),
    ("volumeMounts", ListStrategy::MergeKey("mountPath")),
    ("volumeDevices", ListStrategy::MergeKey("devicePath")),
    ("resizePolicy", ListStrategy::MergeKey("resourceName")),
    ("resources.claims", ListStrategy::MergeKey("name")),
];

const METADATA_LISTS: &[(&str, ListStrategy)] = &[
    ("ownerReferences", ListStrategy::MergeKey("uid")),
    ("finalizers", ListStrategy::MergePrimitives),
];

impl MergeKeys for PodSpecKeys {
    fn strategy(&self, path: &str) -> Option<ListStrategy> {
        let find = |table: &[(&str, ListStrategy)], rest: &str| {
            table.iter().find(|(p, _)| *p == rest).map(|(_, s)| *s)
        };
        for meta in self.metadata {
            if let Some(rest) = path.strip_prefix(meta).and_then(|r| r.strip_prefix('.')) {
                return find(METADATA_LISTS, rest);
            }
        }
        let rest = path.strip_prefix(self.spec)?.strip_prefix('.')?;
        if let Some(s) = find(POD_SPEC_LISTS, rest) {
            return Some(s);
        }
        let (list, inner) = rest.split_once('.')?;
        if ["containers", "initContainers", "ephemeralContainers"].contains(&list) {
            return find(CONTAINER_LISTS, inner);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(original: Value, patch: Value) -> Value {
        apply(&original, &patch, &POD_KEYS).unwrap()
    }

    fn deployment_like_pod() -> Value {
        json!({"metadata": {"name": "p", "labels": {"app": "web"}, "finalizers": ["a"]},
               "spec": {"containers": [{"name": "patch-demo-ctr", "image": "nginx",
                                        "env": [{"name": "A", "value": "1"}]}],
                        "tolerations": [{"effect": "NoSchedule", "key": "dedicated", "value": "test-team"}]}})
    }

    /// The documentation's first example: a container added by a strategic merge patch is merged
    /// by name into the list, not replacing it.
    #[test]
    fn containers_merge_by_name() {
        let out = patched(
            deployment_like_pod(),
            json!({"spec": {"containers": [{"name": "patch-demo-ctr-2", "image": "redis"}]}}),
        );
        let names: Vec<_> = out["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].clone())
            .collect();
        assert_eq!(names, [json!("patch-demo-ctr"), json!("patch-demo-ctr-2")]);
        let out = patched(
            deployment_like_pod(),
            json!({"spec": {"containers": [{"name": "patch-demo-ctr", "image": "nginx:2", "env": [{"name": "B", "value": "2"}]}]}}),
        );
        assert_eq!(out["spec"]["containers"][0]["image"], "nginx:2");
        assert_eq!(
            out["spec"]["containers"][0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
    }

    /// The documentation's second example: tolerations have no merge key, so the list is replaced.
    #[test]
    fn lists_without_a_strategy_are_replaced() {
        let out = patched(
            deployment_like_pod(),
            json!({"spec": {"tolerations": [{"effect": "NoSchedule", "key": "disktype", "value": "ssd"}]}}),
        );
        assert_eq!(
            out["spec"]["tolerations"],
            json!([{"effect": "NoSchedule", "key": "disktype", "value": "ssd"}])
        );
    }

    #[test]
    fn directives() {
        // Delete one element of a merged list, and a key by null.
        let out = patched(
            deployment_like_pod(),
            json!({"metadata": {"labels": {"app": null, "tier": "x"}},
            "spec": {"containers": [{"name": "patch-demo-ctr", "$patch": "delete"}]}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"tier": "x"}));
        assert_eq!(out["spec"]["containers"], json!([]));
        // Replace a whole list, and a whole map.
        let out = patched(
            deployment_like_pod(),
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "busybox"}]}}),
        );
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "only", "image": "busybox"}])
        );
        let out = patched(
            deployment_like_pod(),
            json!({"metadata": {"labels": {"$patch": "replace", "new": "1"}}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"new": "1"}));
        // Delete a map; primitive lists merge and delete.
        let out = patched(
            deployment_like_pod(),
            json!({"spec": {"$patch": "delete"}, "metadata": {"finalizers": ["b", "a"]}}),
        );
        assert!(out.get("spec").is_none());
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        let out = patched(
            deployment_like_pod(),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!([]));
        // Keys named in $retainKeys survive, the rest go.
        let out = patched(
            deployment_like_pod(),
            json!({"metadata": {"$retainKeys": ["name"], "name": "q"}}),
        );
        assert_eq!(out["metadata"], json!({"name": "q"}));
    }

    #[test]
    fn element_order_and_errors() {
        let original = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let out = patched(
            original.clone(),
            json!({"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}], "containers": [{"name": "a", "image": "x"}]}}),
        );
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "b"}, {"name": "a", "image": "x"}])
        );
        assert_eq!(
            apply(
                &original,
                &json!({"spec": {"containers": [{"image": "x"}]}}),
                &POD_KEYS
            ),
            Err(PatchError::MissingMergeKey(
                "spec.containers".into(),
                "name"
            ))
        );
        assert!(
            apply(
                &original,
                &json!({"spec": {"$patch": "merge-ish"}}),
                &POD_KEYS
            )
            .is_err()
        );
    }

    #[test]
    fn reservations_merge_their_template() {
        let original =
            json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}});
        let out = apply(
            &original,
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "b"}]}}}}),
            &RESERVATION_KEYS,
        )
        .unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }
}
