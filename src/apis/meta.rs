//! Reading an object's labels and annotations by key.

use kube::Resource;

/// The value of label `key`, if the object has it.
pub fn label<'a, K: Resource>(object: &'a K, key: &str) -> Option<&'a str> {
    object.meta().labels.as_ref()?.get(key).map(String::as_str)
}

/// The most an object's annotations hold, keys and values together: the API server's limit
/// (`TotalAnnotationSizeLimitB`), which it checks when it validates an object.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// The API server's own refusal when `object`'s annotations pass [`MAX_ANNOTATIONS_BYTES`].
pub fn annotations_too_long<K: Resource>(object: &K) -> Option<String> {
    let total: usize = object
        .meta()
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    (total > MAX_ANNOTATIONS_BYTES).then(|| {
        format!("metadata.annotations: Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes")
    })
}

/// The value of annotation `key`, if the object has it.
pub fn annotation<'a, K: Resource>(object: &'a K, key: &str) -> Option<&'a str> {
    object
        .meta()
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}
