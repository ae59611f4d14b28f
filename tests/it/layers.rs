//! The layering of docs/architecture.md ("Layers"), checked: every `crate::` path in a file under
//! `src/` names a module on a lower floor than the file's own top-level module, or its own module.
//! The table below is the one the document shows; a new top-level module must be given a floor here.
//! Unit tests are not the library's structure and may use any module for their fixtures: a file's
//! text from its first `#[cfg(test)]` on, and `tests.rs` files and `tests/` folders, are not read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Top-level modules by floor, lowest first (docs/architecture.md).
const FLOORS: &[(u8, &[&str])] = &[
    // Macros the leaves' serde wrappers share.
    (0, &["serde_proxy"]),
    // The allocator's count and the meter every decode is held to: any leaf may read under it.
    (1, &["memory"]),
    (
        2,
        &[
            "metrics",
            "resources",
            "apis",
            "features",
            "tls",
            "telemetry",
            "names",
            "duration",
            "kubernetes_errors",
            "kube_events",
        ],
    ),
    (3, &["cache", "selectors", "certs", "cluster_client"]),
    (4, &["slo_config", "state", "entries"]),
    (5, &["admission"]),
    (6, &["server", "install", "kube_ports"]),
    (7, &["operator"]),
    (8, &["cli"]),
    (9, &["cmd"]),
    (10, &["main", "lib"]),
    // The scripted API server of the operator's unit tests: compiled for tests only.
    (11, &["scripted_api"]),
];

fn floor_of(module: &str) -> Option<u8> {
    FLOORS
        .iter()
        .find(|(_, modules)| modules.contains(&module))
        .map(|(floor, _)| *floor)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a file's text names through `crate::`, outside comments and before its
/// unit tests.
fn crate_paths(text: &str) -> Vec<String> {
    let text = match text.find("\n#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut named = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            // `crate::{a, b::c}` names several.
            let group = if let Some(inner) = rest.strip_prefix('{') {
                inner.split('}').next().unwrap_or_default().to_owned()
            } else {
                rest.to_owned()
            };
            for part in group.split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != "self" {
                    named.push(name);
                }
            }
        }
    }
    // A `use crate::{` group that spans lines: the names on the lines that follow.
    let mut in_group = false;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default().trim();
        if in_group {
            if code.starts_with('}') {
                in_group = false;
                continue;
            }
            let name: String = code
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != "self" {
                named.push(name);
            }
        } else if code.ends_with("crate::{") {
            in_group = true;
        }
    }
    named
}

/// Files that import a module on their own floor or above: (file, module it names).
fn violations(src: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let is_tests = relative
            .components()
            .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs");
        if is_tests {
            continue;
        }
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        let own = floor_of(&top).unwrap_or_else(|| {
            panic!("src/{top} has no floor: add it to FLOORS (and docs/architecture.md)")
        });
        let text = std::fs::read_to_string(&file).unwrap();
        for named in crate_paths(&text) {
            if named == top {
                continue;
            }
            let Some(floor) = floor_of(&named) else {
                continue; // a macro or item at the crate root, not a module
            };
            if floor >= own {
                found.push((relative.display().to_string(), named));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn every_import_points_down_the_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    let mut by_file: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (file, module) in &found {
        by_file.entry(file).or_default().push(module);
    }
    assert!(
        by_file.is_empty(),
        "imports on the same floor or above (docs/architecture.md, \"Layers\"): {by_file:#?}"
    );
}

/// The check sees an upward import (and one on the same floor), and not a unit test's.
#[test]
fn an_upward_import_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let leaf = dir.path().join("names.rs");
    std::fs::write(&leaf, "use crate::admission::Admission;\n").unwrap();
    std::fs::write(
        dir.path().join("cache.rs"),
        "use crate::names;\nuse crate::{metrics, selectors};\n\n#[cfg(test)]\nuse crate::admission;\n",
    )
    .unwrap();
    let found = violations(dir.path());
    assert_eq!(
        found,
        [
            ("cache.rs".to_owned(), "selectors".to_owned()),
            ("names.rs".to_owned(), "admission".to_owned())
        ]
    );
}

/// `unsafe_code` is denied crate-wide (Cargo.toml) and allowed in one file: the counting allocator,
/// which must implement the `unsafe` trait `GlobalAlloc`.
#[test]
fn only_the_counting_allocator_allows_unsafe_code() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let allowing: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.contains("allow(unsafe_code)") || text.contains("unsafe_code)]")
        })
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert_eq!(allowing, ["memory/counting.rs"]);
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("unsafe_code = \"deny\""),
        "Cargo.toml denies unsafe_code"
    );
}

/// Every JSON text a rule reads (an annotation, a ConfigMap's data) is read under a meter
/// (`memory::metered::read_within`, or the review's own decode): the decode budget counts such a
/// text as one string, and read as a tree it can cost tens of times its bytes (issue 60: an
/// annotation of 8 MiB took 225 MiB). The few reads that keep nothing are named here with why.
#[test]
fn every_json_read_under_admission_is_metered() {
    const KEEP_NOTHING: &[(&str, &str)] = &[
        // The review itself, under the endpoint's meter (`endpoint.rs`).
        ("admission/review.rs", "Deserializer::from_"),
        // The strict-check keys, streamed one at a time and never kept.
        (
            "admission/elastic_quota/self_checks.rs",
            "Deserializer::from_",
        ),
        // Read into `IgnoredAny` to tell a parse error: nothing is built.
        (
            "admission/node/amplification.rs",
            "from_str::<serde::de::IgnoredAny>",
        ),
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("admission"), &mut files);
    let mut unmetered = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap().display().to_string();
        if relative.ends_with("tests.rs") || relative.contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let text = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let reads = [
                "serde_json::from_str",
                "serde_json::from_slice",
                "serde_json::from_reader",
            ]
            .iter()
            .any(|r| code.contains(r))
                || code.contains("Deserializer::from_");
            let allowed = KEEP_NOTHING
                .iter()
                .any(|(f, what)| relative == *f && code.contains(what));
            if reads && !allowed {
                unmetered.push(format!("src/{relative}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        unmetered.is_empty(),
        "JSON read outside a meter (use memory::metered::read_within):\n{}",
        unmetered.join("\n")
    );
}

/// Items a file takes from its own folder's `mod.rs` (through `super::` or the folder's `crate::`
/// path) rather than from a sibling: (file, item). A folder's `mod.rs` registers and composes its
/// children; what they share lives in a leaf beside them (docs/architecture.md, "Layers").
fn from_folder_mod(src: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let name = relative.file_name().unwrap().to_string_lossy().into_owned();
        let folder = file.parent().unwrap();
        let skip = name == "mod.rs"
            || name == "tests.rs"
            || relative.components().any(|c| c.as_os_str() == "tests")
            || relative.parent().is_none_or(|p| p.as_os_str().is_empty())
            || !folder.join("mod.rs").exists();
        if skip {
            continue;
        }
        let module_path = relative
            .parent()
            .unwrap()
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("::");
        let text = std::fs::read_to_string(&file).unwrap();
        let text = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        let prefixes = ["super::".to_owned(), format!("crate::{module_path}::")];
        // Comments dropped and the lines joined: rustfmt wraps a long `use super::{..}` over lines.
        let code = text
            .lines()
            .map(|line| line.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(" ");
        {
            let code = code.as_str();
            for prefix in &prefixes {
                for (at, _) in code.match_indices(prefix.as_str()) {
                    // `super::super::` climbs further: an ancestor's child, not this folder's.
                    let rest = &code[at + prefix.len()..];
                    if code[..at].ends_with("super::") || rest.starts_with("super::") {
                        continue;
                    }
                    // `super::{a, b::c}` names several; `super::a::b` names `a` alone.
                    let group: Vec<&str> = match rest.strip_prefix('{') {
                        Some(inner) => inner
                            .split('}')
                            .next()
                            .unwrap_or_default()
                            .split(',')
                            .collect(),
                        None => vec![rest],
                    };
                    for part in group {
                        let item: String = part
                            .trim()
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '*')
                            .collect();
                        if item.is_empty() || item == "self" {
                            continue;
                        }
                        let child = folder.join(format!("{item}.rs")).exists()
                            || folder.join(&item).is_dir();
                        if !child {
                            found.push((relative.display().to_string(), item));
                        }
                    }
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn no_child_takes_from_its_folders_mod_rs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = from_folder_mod(&src);
    assert!(
        found.is_empty(),
        "children importing their folder's mod.rs (move what they share into a leaf beside them):\n{}",
        found
            .iter()
            .map(|(f, i)| format!("src/{f}: {i}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The check sees a child importing what its folder's `mod.rs` defines, by `super::` or by the
/// folder's path, and not what a sibling defines.
#[test]
fn a_child_importing_its_folders_mod_rs_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("cache");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(
        folder.join("mod.rs"),
        "pub mod load;\npub mod shared;\npub struct Writer;\n",
    )
    .unwrap();
    std::fs::write(folder.join("shared.rs"), "pub struct Shared;\n").unwrap();
    std::fs::write(
        folder.join("load.rs"),
        "use super::shared::Shared;\nuse super::Writer;\nuse crate::cache::{shared, Other};\n\
         use super::{\n    shared::Shared as Again,\n    Wrapped, // a comment\n};\n",
    )
    .unwrap();
    assert_eq!(
        from_folder_mod(dir.path()),
        [
            ("cache/load.rs".to_owned(), "Other".to_owned()),
            ("cache/load.rs".to_owned(), "Wrapped".to_owned()),
            ("cache/load.rs".to_owned(), "Writer".to_owned())
        ]
    );
}
