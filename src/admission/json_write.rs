//! JSON written by hand on the hot path: strings escaped as serde_json escapes them, byte for byte,
//! without going through a Serializer (tens of instructions a byte for JSON held in annotations).

/// Which bytes a JSON string cannot hold as they are: control characters, `"` and `\\`.
const fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The index of the first byte to escape, eight bytes at a time: the text of an annotation holding
/// JSON is mostly plain runs between quotes.
fn first_escape(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    // Per byte, the high bit set where the byte is zero (exact as to whether any byte is).
    let zero_bytes = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let (chunks, tail) = bytes.as_chunks::<8>();
    for (n, chunk) in chunks.iter().enumerate() {
        let x = u64::from_ne_bytes(*chunk);
        let control = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
        let quote = zero_bytes(x ^ (ONES * u64::from(b'"')));
        let backslash = zero_bytes(x ^ (ONES * u64::from(b'\\')));
        if control | quote | backslash != 0
            && let Some(i) = chunk.iter().position(|&b| needs_escape(b))
        {
            return Some(n * 8 + i);
        }
    }
    let i = tail.iter().position(|&b| needs_escape(b))?;
    Some(chunks.len() * 8 + i)
}

/// Appends `s` as a JSON string.
pub fn string(out: &mut Vec<u8>, s: &str) {
    let mut rest = s.as_bytes();
    out.reserve(rest.len() + 2);
    out.push(b'"');
    while let Some(i) = first_escape(rest) {
        out.extend_from_slice(&rest[..i]);
        escape(out, rest[i]);
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest);
    out.push(b'"');
}

fn escape(out: &mut Vec<u8>, b: u8) {
    let short: &[u8] = match b {
        b'"' => br#"\""#,
        b'\\' => br"\\",
        b'\n' => br"\n",
        b'\r' => br"\r",
        b'\t' => br"\t",
        0x08 => br"\b",
        0x0c => br"\f",
        _ => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let hex = [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]];
            out.extend_from_slice(br"\u00");
            out.extend_from_slice(&hex);
            return;
        }
    };
    out.extend_from_slice(short);
}

#[cfg(test)]
mod tests {
    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let every_control: String = (0u8..0x20).map(char::from).collect();
        // Longer than the stack buffer, escapes falling on its end.
        let long_controls = every_control.repeat(20);
        let long_quotes = "\"x".repeat(300);
        for s in [
            "plain/path",
            "",
            "quote\"d",
            "back\\slash",
            "tab\tnew\nline\r",
            "\u{1}\u{8}\u{c}\u{1f}\u{7f}",
            "ünï ☃",
            r#"{"containers":{"a":{"limits":{"kubernetes.io/batch-cpu":"1k"}}}}"#,
            &every_control,
            &long_controls,
            &long_quotes,
            "seven b\"ight bytes\\ with\u{7f}\u{80}\u{ff} escapes\tat every offset\u{1f}",
        ] {
            let mut out = Vec::new();
            super::string(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
            // Every alignment of every escape against the eight-byte chunks.
            for start in (0..s.len()).filter(|&i| s.is_char_boundary(i)) {
                let mut out = Vec::new();
                super::string(&mut out, &s[start..]);
                assert_eq!(out, serde_json::to_vec(&s[start..]).unwrap(), "{s:?}");
            }
        }
    }
}
