//! Logging: `tracing` to stderr, filtered by `RUST_LOG` (default `info`), as text (coloured only
//! when stderr is a terminal, never in a file or a container log) or one JSON object per line.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Text for people.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        // The request's span fields (uid, webhook, name) ride on every line of it.
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}

/// A request's text as a log field, cut to at most `max` bytes (on a character boundary) with the
/// length of what was left out: a 1 MiB `uid` must not become 1 MiB of log.
pub struct Clipped<'a>(pub &'a str, pub usize);

/// Names, namespaces and uids as log fields.
pub const MAX_LOGGED_NAME: usize = 256;
/// Denial messages as log fields.
pub const MAX_LOGGED_MESSAGE: usize = 1024;

impl std::fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Clipped(text, max) = *self;
        let mut end = max.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        // Control characters escaped: a caller's newline must not start a log line of its own.
        // Every request's span formats these: the usual text is written in one piece.
        let shown = &text[..end];
        if !shown.chars().any(char::is_control) {
            f.write_str(shown)?;
        } else {
            for c in shown.chars() {
                if c.is_control() {
                    write!(f, "{}", c.escape_debug())?;
                } else {
                    write!(f, "{c}")?;
                }
            }
        }
        if end < text.len() {
            write!(f, "...(+{} bytes)", text.len() - end)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Clipped;

    #[test]
    fn long_fields_are_cut_on_a_character_boundary() {
        assert_eq!(Clipped("short", 8).to_string(), "short");
        assert_eq!(Clipped("abcdefghij", 4).to_string(), "abcd...(+6 bytes)");
        // 'é' is two bytes: the cut moves back before it.
        assert_eq!(Clipped("abcé", 4).to_string(), "abc...(+2 bytes)");
    }

    #[test]
    fn control_characters_cannot_forge_a_log_line() {
        let forged = "u1\n2026-11-25T00:00:00Z  INFO admitted\r\u{1b}[31m";
        let shown = Clipped(forged, 256).to_string();
        assert!(!shown.contains('\n') && !shown.contains('\r') && !shown.contains('\u{1b}'));
        assert_eq!(
            shown,
            r"u1\n2026-11-25T00:00:00Z  INFO admitted\r\u{1b}[31m"
        );
        let huge = "u".repeat(1 << 20);
        assert!(Clipped(&huge, 256).to_string().len() < 300);
    }
}
