//! Fills a cache from YAML or JSON files: the `--state` of `review` and `serve`.
//!
//! A path is one file (any number of `---`-separated documents, or a `kind: List`) or a directory whose
//! `.yaml`, `.yml` and `.json` files are read in name order.

use std::path::{Path, PathBuf};

use kube::core::PartialObjectMeta;
use kube::core::metadata::PartialObjectMetaExt;
use serde::Deserialize;
use serde_json::Value;

use super::handles::{CacheWriter, CachedObject};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: document {doc}: {message}")]
    Document {
        path: PathBuf,
        doc: usize,
        message: String,
    },
}

/// Reads every object under `path` into a new cache writer.
pub fn load_state(path: &Path) -> Result<CacheWriter, LoadError> {
    let mut writer = CacheWriter::default();
    for file in state_files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|source| LoadError::Io {
            path: file.clone(),
            source,
        })?;
        let fail = |doc: usize, message: String| LoadError::Document {
            path: file.clone(),
            doc,
            message,
        };
        if file.extension().is_some_and(|e| e == "json") {
            // One document; a list's items are decoded one at a time, never all at once.
            let (mut failed, mut index) = (None, 0);
            let mut apply = |item: Value| {
                index += 1;
                match to_cached(item) {
                    Ok(object) => writer.apply(object),
                    Err(e) => {
                        failed.get_or_insert(format!("object {index}: {e}"));
                    }
                }
            };
            let mut de = serde_json::Deserializer::from_str(&text);
            let parsed =
                serde::de::DeserializeSeed::deserialize(StreamItems { sink: &mut apply }, &mut de)
                    .and_then(|()| de.end());
            parsed.map_err(|e| fail(1, e.to_string()))?;
            if let Some(e) = failed {
                return Err(fail(1, e));
            }
            continue;
        }
        for (doc, object) in parse_yaml(&text).enumerate() {
            for item in flatten_list(object.map_err(|e| fail(doc + 1, e))?) {
                writer.apply(to_cached(item).map_err(|e| fail(doc + 1, e))?);
            }
        }
    }
    writer.mark_ready();
    Ok(writer)
}

/// A JSON document that is one object, or a list whose `items` go to `sink` one by one.
struct StreamItems<'s> {
    sink: &'s mut dyn FnMut(Value),
}

impl<'de> serde::de::DeserializeSeed<'de> for StreamItems<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for StreamItems<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Kubernetes object or list")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut fields = serde_json::Map::new();
        let mut listed = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                map.next_value_seed(Items {
                    sink: &mut *self.sink,
                })?;
                listed = true;
            } else {
                fields.insert(key, map.next_value()?);
            }
        }
        if !listed {
            (self.sink)(Value::Object(fields));
        }
        Ok(())
    }
}

struct Items<'s> {
    sink: &'s mut dyn FnMut(Value),
}

impl<'de> serde::de::DeserializeSeed<'de> for Items<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Items<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of objects")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element::<Value>()? {
            (self.sink)(item);
        }
        Ok(())
    }
}

fn state_files(path: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let io = |source| LoadError::Io {
        path: path.to_owned(),
        source,
    };
    if !path.is_dir() {
        // Surfaces "not found" with the path in the message.
        std::fs::metadata(path).map_err(io)?;
        return Ok(vec![path.to_owned()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        let file = entry.map_err(io)?.path();
        let is_state = file
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if is_state && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// The documents of a YAML file (YAML is a superset of JSON), decoded one at a time; empty
/// documents are skipped.
fn parse_yaml(text: &str) -> impl Iterator<Item = Result<Value, String>> + '_ {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).map_err(|e| e.to_string()))
        .filter(|v| !matches!(v, Ok(Value::Null)))
}

fn flatten_list(value: Value) -> Vec<Value> {
    let is_list = value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"));
    match value {
        Value::Object(mut map) if is_list => match map.remove("items") {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        },
        other => vec![other],
    }
}

/// Decodes one object by its apiVersion and kind.
pub fn to_cached(value: Value) -> Result<CachedObject, String> {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    fn de<T: serde::de::DeserializeOwned>(v: Value, kind: &str) -> Result<T, String> {
        serde_json::from_value(v).map_err(|e| format!("{kind}: {e}"))
    }
    let object = match (api_version.as_str(), kind.as_str()) {
        ("scheduling.sigs.k8s.io/v1alpha1", "ElasticQuota") => {
            CachedObject::ElasticQuota(de(value, &kind)?)
        }
        ("quota.koordinator.sh/v1alpha1", "ElasticQuotaProfile") => {
            CachedObject::ElasticQuotaProfile(de(value, &kind)?)
        }
        ("scheduling.koordinator.sh/v1alpha1", "Reservation") => {
            CachedObject::Reservation(de(value, &kind)?)
        }
        ("config.koordinator.sh/v1alpha1", "ClusterColocationProfile") => {
            CachedObject::ColocationProfile(de(value, &kind)?)
        }
        ("v1", "ConfigMap") => CachedObject::ConfigMap(de(value, &kind)?),
        ("v1", "Namespace") => CachedObject::Namespace(de(value, &kind)?),
        ("scheduling.k8s.io/v1", "PriorityClass") => CachedObject::PriorityClass(de(value, &kind)?),
        ("v1", "Node") => CachedObject::Node(metadata_only(value, &kind)?),
        ("v1", "Pod") => CachedObject::Pod(super::pod_index::IndexedPod::from_meta(
            &metadata_only(value, &kind)?,
        )),
        _ => {
            return Err(format!(
                "unsupported object apiVersion={api_version:?} kind={kind:?} (the cache holds ElasticQuota, \
                 ElasticQuotaProfile, Reservation, ClusterColocationProfile, ConfigMap, Namespace, \
                 PriorityClass, Node, Pod)"
            ));
        }
    };
    Ok(object)
}

/// The object's metadata alone, as the metadata-only watches receive it.
fn metadata_only<K>(mut value: Value, kind: &str) -> Result<PartialObjectMeta<K>, String>
where
    K: kube::Resource<DynamicType = ()>,
{
    let metadata = value
        .get_mut("metadata")
        .map(Value::take)
        .unwrap_or_default();
    let metadata = serde_json::from_value::<kube::core::ObjectMeta>(metadata)
        .map_err(|e| format!("{kind}: {e}"))?;
    Ok(metadata.into_response_partial::<K>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_multi_document_yaml_json_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, labels: {x: y}}\n---\n\
             apiVersion: scheduling.sigs.k8s.io/v1alpha1\nkind: ElasticQuota\nmetadata: {name: q, namespace: team-a}\n\
             spec: {max: {cpu: '4'}}\n---\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.json"),
            r#"{"kind":"List","apiVersion":"v1","items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"team-a"},"spec":{"containers":[]}}]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let cache = load_state(dir.path()).unwrap().reader();
        assert_eq!(cache.namespaces.len(), 1);
        assert_eq!(cache.elastic_quotas.len(), 1);
        assert_eq!(cache.pods.len(), 1);
        assert!(cache.pods.any_in_namespaces(&["team-a"]));
    }

    #[test]
    fn json_lists_name_the_bad_item_and_bad_json_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("list.json");
        std::fs::write(
            &file,
            r#"{"apiVersion":"v1","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}},{"apiVersion":"v1","kind":"Secret"}],"kind":"List"}"#,
        )
        .unwrap();
        let err = load_state(&file).err().unwrap().to_string();
        assert!(
            err.contains("list.json: document 1: object 2: unsupported object"),
            "{err}"
        );
        std::fs::write(&file, r#"{"apiVersion":"v1","items":[{"#).unwrap();
        let err = load_state(&file).err().unwrap().to_string();
        assert!(err.contains("list.json: document 1: EOF"), "{err}");
    }

    #[test]
    fn reports_file_and_document_of_a_bad_object() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.yaml");
        std::fs::write(&file, "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Secret\n").unwrap();
        let err = load_state(&file).err().unwrap().to_string();
        assert!(
            err.contains("bad.yaml: document 2: unsupported object"),
            "{err}"
        );
        let missing = load_state(&dir.path().join("nope"))
            .err()
            .unwrap()
            .to_string();
        assert!(missing.starts_with("cannot read"), "{missing}");
    }
}
