//! Building blocks of the CEL expressions written as `matchConditions`.
//!
//! Every expression here must be unable to error on any object the API server can send: under
//! `failurePolicy: Fail` a condition that errors rejects the request. So a map is indexed only
//! after `has()` and `in` have shown the key, and `oldObject` (null on CREATE) is read only where
//! the operation is UPDATE. Only the CEL both the API server and the `cel` crate evaluate alike is
//! used: `has()`, `in` on maps and lists, `==`/`!=` on strings, integers and maps, `&&`, `||`,
//! `!`, `?:`, the `exists` macro and `string.contains`.

/// The metadata map an expression reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meta {
    Labels,
    Annotations,
}

impl Meta {
    pub fn field(self) -> &'static str {
        match self {
            Meta::Labels => "labels",
            Meta::Annotations => "annotations",
        }
    }
}

/// `object` or `oldObject`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Var {
    Object,
    OldObject,
}

impl Var {
    pub fn name(self) -> &'static str {
        match self {
            Var::Object => "object",
            Var::OldObject => "oldObject",
        }
    }
}

/// A CEL string literal. The texts written are label and annotation names and a ServiceAccount's
/// user name (letters, digits, `-._/:`), so no escaping is ever needed; anything else is a bug
/// caught here.
pub fn literal(text: &str) -> String {
    assert!(is_literal(text), "{text:?} needs escaping in a CEL literal");
    format!("'{text}'")
}

/// Whether `text` can be written as a CEL literal without escaping (label names and values,
/// namespace names, user names: letters, digits, `-._/:`).
pub fn is_literal(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._/:".contains(&b))
}

/// Some element of the list or key of the map at `path` (read only where `has()` showed it) meets
/// `predicate`, a CEL expression over `var`.
pub fn exists(path: &str, var: &str, predicate: &str) -> String {
    format!("{path}.exists({var}, {predicate})")
}

/// `var.metadata.<map>` is present.
pub fn has_map(var: Var, meta: Meta) -> String {
    format!("has({}.metadata.{})", var.name(), meta.field())
}

/// `key` is in `var.metadata.<map>`.
pub fn has_key(var: Var, meta: Meta, key: &str) -> String {
    format!(
        "({} && {} in {}.metadata.{})",
        has_map(var, meta),
        literal(key),
        var.name(),
        meta.field()
    )
}

/// Any of `keys` is in `var.metadata.<map>`.
pub fn has_any_key(var: Var, meta: Meta, keys: &[&str]) -> String {
    let any: Vec<String> = keys
        .iter()
        .map(|k| format!("{} in {}.metadata.{}", literal(k), var.name(), meta.field()))
        .collect();
    format!("({} && ({}))", has_map(var, meta), any.join(" || "))
}

/// The entry `key` of the map differs between `object` and `oldObject` (present in one only, or
/// with other values). UPDATE only.
pub fn key_changed(meta: Meta, key: &str) -> String {
    let new = has_key(Var::Object, meta, key);
    let old = has_key(Var::OldObject, meta, key);
    // When both are present the second operand indexes both; when presence differs the first is
    // true, and CEL's `||` is true whatever the other side gives.
    format!(
        "({new} != {old} || ({new} && object.metadata.{f}[{k}] != oldObject.metadata.{f}[{k}]))",
        f = meta.field(),
        k = literal(key)
    )
}

/// The whole map differs between `object` and `oldObject` (absent and present count as a
/// difference even when empty, as the rules' own comparison does). UPDATE only.
pub fn map_changed(meta: Meta) -> String {
    let new = has_map(Var::Object, meta);
    let old = has_map(Var::OldObject, meta);
    format!(
        "({new} != {old} || ({new} && object.metadata.{f} != oldObject.metadata.{f}))",
        f = meta.field()
    )
}

/// The top-level field `field` (e.g. `spec`) differs between `object` and `oldObject`. UPDATE only.
pub fn field_changed(field: &str) -> String {
    format!(
        "(has(object.{field}) != has(oldObject.{field}) || (has(object.{field}) && object.{field} != oldObject.{field}))"
    )
}

/// Any of `parts`, in parentheses.
pub fn any(parts: &[String]) -> String {
    format!("({})", parts.join(" || "))
}
