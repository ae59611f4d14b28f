//! The reference tables generated into the docs from the code: README.md's table of every `serve`
//! flag (from clap's definitions) and docs/admission.md's feature gates (from the `gates!` list),
//! each between `<!-- NAME -->` and `<!-- /NAME -->`. `koord-webhook doc-tables DIR` (run by
//! scripts/gen) rewrites them; `tests/it/generated.rs` fails on a stale one.

use std::path::Path;

use anyhow::Context as _;

use crate::features::Gate;
use crate::install::serve_flags::OWNED;

/// A generated section: the file it is in (relative to the repository), its marker, its table.
pub struct Section {
    pub file: &'static str,
    pub marker: &'static str,
    pub table: fn() -> String,
}

pub const SECTIONS: &[Section] = &[
    Section {
        file: "README.md",
        marker: "serve-flags",
        table: serve_flag_table,
    },
    Section {
        file: "docs/admission.md",
        marker: "gates",
        table: gate_table,
    },
];

/// A cell's text on one line, its pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// Every `serve` flag: its environment variable, default, what it does, and the install value
/// that sets it when an install owns it.
pub fn serve_flag_table() -> String {
    let serve = super::manifests::serve_command();
    let mut out = String::from(
        "| flag | environment | default | what it does |\n| --- | --- | --- | --- |\n",
    );
    for arg in serve.get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long) = arg.get_long().filter(|l| *l != "help") else {
            continue;
        };
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect();
        let mut what = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        if let Some((_, owner)) = OWNED.iter().find(|(name, _)| *name == long) {
            what = format!(
                "{} (installs set it from {owner})",
                what.trim_end_matches('.')
            );
        }
        out.push_str(&format!(
            "| `--{long}` | {env} | {} | {} |\n",
            defaults.join(", "),
            cell(&what)
        ));
    }
    out
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// Every feature gate: its default here, Koordinator v1.8.0's, and what it turns on.
pub fn gate_table() -> String {
    let mut out = String::from(
        "| gate | default | Koordinator v1.8.0 | what it turns on |\n| --- | --- | --- | --- |\n",
    );
    for gate in Gate::all() {
        let koordinator = gate.koordinator_default().map_or("(not in v1.8.0)", on_off);
        let ours = on_off(gate.default_enabled());
        let ours = match gate.koordinator_default() {
            Some(k) if k != gate.default_enabled() => format!("**{ours}**"),
            _ => ours.to_owned(),
        };
        out.push_str(&format!(
            "| `{gate}` | {ours} | {koordinator} | {} |\n",
            cell(gate.what())
        ));
    }
    out
}

/// `text` with the section between `<!-- marker -->` and `<!-- /marker -->` replaced by `table`;
/// `None` when the markers are not there.
pub fn replaced(text: &str, marker: &str, table: &str) -> Option<String> {
    let (open, close) = (
        format!("<!-- {marker} -->\n"),
        format!("<!-- /{marker} -->"),
    );
    let start = text.find(&open)? + open.len();
    let end = start + text[start..].find(&close)?;
    Some(format!("{}{table}{}", &text[..start], &text[end..]))
}

/// Rewrites every generated section under the repository `root`.
pub fn write(root: &Path) -> anyhow::Result<()> {
    for section in SECTIONS {
        let path = root.join(section.file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
        let new = replaced(&text, section.marker, &(section.table)()).with_context(|| {
            format!(
                "{} has no <!-- {} --> section",
                path.display(),
                section.marker
            )
        })?;
        if new != text {
            std::fs::write(&path, new).with_context(|| format!("{}", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_replaced_between_its_markers_only() {
        let text = "a\n<!-- t -->\nold\n<!-- /t -->\nb\n";
        assert_eq!(
            replaced(text, "t", "new\n").unwrap(),
            "a\n<!-- t -->\nnew\n<!-- /t -->\nb\n"
        );
        assert!(replaced(text, "u", "x").is_none());
    }

    #[test]
    fn the_tables_name_every_flag_and_gate() {
        let flags = serve_flag_table();
        for flag in [
            "--own-user",
            "--would-deny-events",
            "--memory-limit",
            "--log-format",
        ] {
            assert!(flags.contains(&format!("`{flag}`")), "{flag} missing");
        }
        assert!(flags.contains("(installs set it from resources.limits.memory)"));
        let gates = gate_table();
        assert_eq!(gates.lines().count(), 2 + Gate::all().count());
        assert!(gates.contains("| `NodeMutatingWebhook` | **on** | off |"));
        assert!(gates.contains("| `AmplifyNodeCapacity` | on | (not in v1.8.0) |"));
    }
}
