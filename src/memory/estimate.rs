//! The memory a review will take once decoded, read off its body's bytes before anything is
//! decoded: what the server takes from its decode budget (`server/limits.rs`), and the limit the
//! allocator's meter then holds the decode to (`counting.rs`, `metered.rs`).

/// Heap one JSON string of a review costs once decoded and run, measured (bench/memory.py): a pod of
/// 3 MiB of short labels peaks 51 MiB above idle through `/mutate-pod` (the decoded object, its copy
/// and the patch), about 195 bytes per string; `/validate-pod` about 80.
pub const DECODED_BYTES_PER_STRING: usize = 200;

/// The memory a body will take once decoded and run: its bytes, a measured cost per JSON string,
/// and one per other value (a number, `true`, `false`, `null`, an array or an object). Bodies of
/// the same size differ twentyfold in decoded size (a few long strings, or a map of tiny labels),
/// and a body of bare numbers costs more than either once decoded into `serde_json::Value`s, so the
/// budget counts this, not bytes. A byte scan: ~1 ms per 3 MiB, nothing for a typical pod.
pub fn decoded_estimate(body: &[u8]) -> usize {
    BodyShape::of(body).estimate()
}

/// What a review's decode may allocate: its estimate, and room for the fixed-size parts whatever
/// the body (the typed request and its objects' structs, a few KiB for the largest kind).
pub fn decode_allowance(body: &[u8]) -> usize {
    BodyShape::of(body).allowance(1)
}

/// A body's shape, scanned once: what the server takes from its decode budget
/// ([`BodyShape::estimate`]) and what the decode is then held to ([`BodyShape::allowance`]).
#[derive(Debug, Clone, Copy)]
pub struct BodyShape {
    bytes: usize,
    shape: JsonShape,
}

impl BodyShape {
    pub fn of(body: &[u8]) -> Self {
        Self {
            bytes: body.len(),
            shape: JsonShape::of(body),
        }
    }

    /// See [`decoded_estimate`].
    pub fn estimate(&self) -> usize {
        self.bytes
            .saturating_add(self.shape.strings.saturating_mul(DECODED_BYTES_PER_STRING))
            .saturating_add(self.shape.others.saturating_mul(DECODED_BYTES_PER_VALUE))
    }

    /// As [`decode_allowance`], for a decode that will be held `copies` times at once (a mutating
    /// chain keeps the object it received beside the one its rules edit): the estimate, which
    /// counts the whole answer, is shared among the copies.
    pub fn allowance(&self, copies: usize) -> usize {
        (self.estimate() / copies.max(1))
            .saturating_add(DECODE_FLOOR)
            // An escaped string is unescaped into a buffer that grows by doubling, then copied
            // out: both live at once (a 74 KB annotation of JSON was refused before this).
            .saturating_add(self.shape.longest_escaped.saturating_mul(3))
    }
}

/// The room [`decode_allowance`] gives every review besides its estimate.
pub const DECODE_FLOOR: usize = 64 * 1024;

/// Heap one JSON value that is not a string costs once decoded, measured (bench/memory.py): an
/// 8 MiB review whose `request.options` is an array of 4 million zeros peaks ~270 MiB above idle,
/// ~67 bytes each (a 32-byte `Value` in a vector that grew by doubling).
pub const DECODED_BYTES_PER_VALUE: usize = 72;

/// The values of a JSON text, counted without parsing it: strings, and everything else.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct JsonShape {
    strings: usize,
    others: usize,
    /// The bytes of the longest string with an escape in it.
    longest_escaped: usize,
}

impl JsonShape {
    /// Outside strings, each `[` and `{` is a value and so is each run of the characters numbers and
    /// literals are made of; a string is skipped to its closing quote with `memchr` (most of a
    /// review's bytes are in strings: a byte-by-byte walk cost a sixth of a small review's time).
    /// Malformed text is counted all the same (the decoder refuses it after).
    fn of(body: &[u8]) -> Self {
        let mut shape = Self::default();
        let (mut i, mut in_scalar) = (0, false);
        while let Some(&b) = body.get(i) {
            i += 1;
            if b == b'"' {
                shape.strings += 1;
                in_scalar = false;
                let (start, mut escaped) = (i, false);
                // To the closing quote, stepping over escapes (`\"`, `\\`, `\u....`).
                loop {
                    match memchr::memchr2(b'"', b'\\', body.get(i..).unwrap_or_default()) {
                        None => return shape,
                        Some(k) if body[i + k] == b'\\' => {
                            escaped = true;
                            i += k + 2;
                        }
                        Some(k) => {
                            i += k + 1;
                            break;
                        }
                    }
                }
                if escaped {
                    shape.longest_escaped = shape.longest_escaped.max(i - start);
                }
                continue;
            }
            let scalar = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.');
            if matches!(b, b'[' | b'{') || (scalar && !in_scalar) {
                shape.others += 1;
            }
            in_scalar = scalar;
        }
        shape
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_counts_values_outside_strings_only() {
        let shape = |text: &str| JsonShape::of(text.as_bytes());
        assert_eq!(
            shape(r#"{"a":[0,-1.5e+3,true,null,{}],"b":"x\"[1,2]"}"#),
            JsonShape {
                strings: 3,
                others: 7,
                longest_escaped: 9,
            }
        );
        assert_eq!(
            shape("[0,0,0,0]"),
            JsonShape {
                strings: 0,
                others: 5,
                longest_escaped: 0,
            }
        );
    }

    /// A long escaped string (a `last-applied-configuration` annotation of JSON) fits its
    /// allowance: it is unescaped into a growing buffer and then copied.
    #[test]
    fn a_long_escaped_string_fits_its_allowance() {
        let inner = "{\\\"a\\\":1},".repeat(10_000);
        let body = format!("{{\"annotation\":\"{inner}\"}}");
        let meter = crate::memory::Meter::start(usize::MAX);
        let decoded: std::collections::BTreeMap<String, String> =
            serde_json::from_str(&body).unwrap();
        assert!(
            meter.peak() < decode_allowance(body.as_bytes()),
            "{} of {}",
            meter.peak(),
            decode_allowance(body.as_bytes())
        );
        drop(decoded);
    }

    /// The smallest review of the largest kind decodes within its allowance.
    #[test]
    fn a_tiny_review_of_a_large_kind_fits_its_allowance() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"","version":"v1","kind":"Node"},"resource":{"group":"","version":"v1","resource":"nodes"},"operation":"UPDATE","object":{"status":{}},"oldObject":{"status":{}}}}"#;
        let meter = crate::memory::Meter::start(usize::MAX);
        let decoded: serde_json::Value = serde_json::from_slice(body).unwrap();
        let node: k8s_openapi::api::core::v1::Node =
            serde_json::from_value(decoded["request"]["object"].clone()).unwrap();
        let old = Box::new((node.clone(), node));
        assert!(
            meter.peak() < decode_allowance(body),
            "{} of {}",
            meter.peak(),
            decode_allowance(body)
        );
        drop(old);
    }

    #[test]
    fn numbers_cost_what_they_cost_once_decoded() {
        // 4 million zeros in 8 MiB: about 300 MiB once decoded, more than the budget of a 256Mi
        // replica (96 MiB), so such a review is refused before it is decoded.
        let zeros = format!("[{}0]", "0,".repeat(4 << 20));
        let estimate = decoded_estimate(zeros.as_bytes());
        assert!(estimate > 280 << 20, "{} MiB", estimate >> 20);
        assert!(
            estimate > 96 << 20,
            "more than a 256Mi replica's decode budget"
        );
    }

    #[test]
    fn the_estimate_counts_strings_not_only_bytes() {
        let few_long = format!("{{\"a\":\"{}\"}}", "x".repeat(1000));
        let many_short = "{\"a\":\"b\",".repeat(100);
        assert_eq!(few_long.len(), 1008);
        assert_eq!(
            decoded_estimate(few_long.as_bytes()),
            1008 + 2 * DECODED_BYTES_PER_STRING + DECODED_BYTES_PER_VALUE
        );
        assert_eq!(
            decoded_estimate(many_short.as_bytes()),
            many_short.len() + 200 * DECODED_BYTES_PER_STRING + 100 * DECODED_BYTES_PER_VALUE
        );
    }
}
