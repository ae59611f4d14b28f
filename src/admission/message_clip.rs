//! What an answer may quote from the object: a denial or warning names the value it refuses
//! (`Invalid value: "..."`), and a forged object can make that value megabytes long. Every message
//! and warning is clipped where it is put on the wire (`review.rs`): each quoted span to
//! [`MAX_QUOTED`] bytes, the whole text to [`MAX_MESSAGE`]. Koordinator quotes values whole; this
//! is a deliberate difference (docs/admission.md), invisible for any value shorter than a clip.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Bytes of one quoted value kept in a message: more than any message of Koordinator's quotes
/// (an SLO ConfigMap check quotes its whole JSON-encoded reason, a few hundred bytes).
pub const MAX_QUOTED: usize = 1024;
/// Bytes of a whole message or warning kept.
pub const MAX_MESSAGE: usize = 16 * 1024;

/// `text` with each `"…"` span longer than [`MAX_QUOTED`] bytes cut (saying how much was left
/// out), then cut to [`MAX_MESSAGE`] bytes. Borrowed when nothing is cut.
pub fn clip(text: &str) -> Cow<'_, str> {
    let quoted = clip_quotes(text);
    if quoted.len() <= MAX_MESSAGE {
        return quoted;
    }
    let keep = floor_boundary(&quoted, MAX_MESSAGE);
    let mut out = quoted[..keep].to_owned();
    let _ = write!(out, "… ({} bytes more)", quoted.len() - keep);
    Cow::Owned(out)
}

fn clip_quotes(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_QUOTED {
        return Cow::Borrowed(text);
    }
    let mut out: Option<String> = None;
    let mut done = 0; // bytes of `text` already in `out`
    let mut from = 0;
    while let Some(open) = text[from..].find('"').map(|i| from + i) {
        let Some(close) = closing_quote(text, open + 1) else {
            break;
        };
        let inner = open + 1..close;
        if inner.len() > MAX_QUOTED {
            let keep = floor_boundary(&text[inner.clone()], MAX_QUOTED);
            let out =
                out.get_or_insert_with(|| String::with_capacity(text.len().min(2 * MAX_MESSAGE)));
            out.push_str(&text[done..inner.start + keep]);
            let _ = write!(out, "…(+{} bytes)", inner.len() - keep);
            done = close;
        }
        from = close + 1;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[done..]);
            Cow::Owned(out)
        }
    }
}

/// The next unescaped `"` from `from`.
fn closing_quote(text: &str, mut from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    while from < bytes.len() {
        match bytes[from] {
            b'\\' => from += 2,
            b'"' => return Some(from),
            _ => from += 1,
        }
    }
    None
}

/// The largest char boundary of `text` at or below `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    (0..=at.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_messages_pass_unchanged() {
        let m = r#"labels.koordinator.sh/priority: Invalid value: "2": field is immutable"#;
        assert!(matches!(clip(m), Cow::Borrowed(t) if t == m));
    }

    #[test]
    fn a_long_quoted_value_is_cut_and_the_rest_kept() {
        let value = "x".repeat(4 << 20);
        let m =
            format!(r#"a: Invalid value: "{value}": field is immutable, b: Invalid value: "1""#);
        let clipped = clip(&m);
        assert!(clipped.len() < MAX_QUOTED + 200, "{}", clipped.len());
        assert!(
            clipped.ends_with(r#"bytes)": field is immutable, b: Invalid value: "1""#),
            "{clipped}"
        );
        assert!(clipped.contains(&format!("…(+{} bytes)", (4 << 20) - MAX_QUOTED)));
    }

    #[test]
    fn an_unquoted_run_is_cut_by_the_whole_limit() {
        let m = format!("label value {} is refused", "é".repeat(1 << 20));
        let clipped = clip(&m);
        assert!(clipped.len() <= MAX_MESSAGE + 40);
        assert!(clipped.ends_with("bytes more)"));
    }

    proptest! {
        /// Whatever the text, the clip is bounded, valid UTF-8 by construction, and a prefix of
        /// the message is kept as it was.
        #[test]
        fn any_text_is_bounded(parts in proptest::collection::vec(
            prop_oneof![Just("\"".to_owned()), Just("\\".to_owned()), "[a-zé]{0,600}"], 0..40)) {
            let text: String = parts.concat();
            let clipped = clip(&text);
            prop_assert!(clipped.len() <= MAX_MESSAGE + 40, "{}", clipped.len());
            let same = text.bytes().zip(clipped.bytes()).take_while(|(a, b)| a == b).count();
            prop_assert!(same >= text.len().min(MAX_QUOTED), "kept {same} of {}", text.len());
        }
    }
}
