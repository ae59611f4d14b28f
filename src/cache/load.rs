//! Fills a cache from YAML or JSON files: the `--state` of `review` and `serve`.
//!
//! A path is one file (any number of `---`-separated documents, or a `kind: List`) or a directory whose
//! `.yaml`, `.yml` and `.json` files are read in name order.

use std::path::{Path, PathBuf};

use kube::core::PartialObjectMeta;
use kube::core::metadata::PartialObjectMetaExt;
use serde::Deserialize;
use serde_json::Value;

use super::{CacheWriter, CachedObject};

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
        let is_json = file.extension().is_some_and(|e| e == "json");
        for (doc, object) in parse_documents(&text, is_json).enumerate() {
            let fail = |message: String| LoadError::Document {
                path: file.clone(),
                doc: doc + 1,
                message,
            };
            for item in flatten_list(object.map_err(fail)?) {
                writer.apply(to_cached(item).map_err(fail)?);
            }
        }
    }
    Ok(writer)
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

/// The documents of one file, decoded one at a time so a large state never sits in memory twice.
/// JSON files skip the YAML parser, which is much slower on large lists.
fn parse_documents(
    text: &str,
    is_json: bool,
) -> Box<dyn Iterator<Item = Result<Value, String>> + '_> {
    if is_json {
        let one = serde_json::from_str::<Value>(text).map_err(|e| e.to_string());
        return Box::new(std::iter::once(one));
    }
    // YAML is a superset of JSON, so one parser reads both; empty documents are skipped.
    Box::new(
        serde_yaml::Deserializer::from_str(text)
            .map(|doc| Value::deserialize(doc).map_err(|e| e.to_string()))
            .filter(|v| !matches!(v, Ok(Value::Null))),
    )
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
        ("v1", "Pod") => CachedObject::Pod(metadata_only(value, &kind)?),
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

/// Keeps what the metadata-only watches keep.
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
    let mut partial = metadata.into_response_partial::<K>();
    super::slim(&mut partial);
    Ok(partial)
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
        assert_eq!(cache.pods.state()[0].metadata.name.as_deref(), Some("p"));
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
