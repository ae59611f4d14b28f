//! Logging: `tracing` to stderr, filtered by `RUST_LOG` (default `info`), as text (coloured only
//! when stderr is a terminal, never in a file or a container log) or one JSON object per line.
//!
//! Text a caller sent (a review's uid, names, kind, user, the messages that quote its object) is
//! logged through [`Clipped`]: escaped ([`needs_escape`]) and cut to a few hundred bytes. Whatever a
//! call site writes, the text format escapes and clips every field too ([`EscapedFields`]), so no
//! field can start a log line of its own or drive the terminal that shows it; the JSON format's
//! serializer escapes control characters itself.

use std::fmt::{self, Write as _};
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{FormatFields, Writer};

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Text for people.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The filter when `RUST_LOG` is not set: `info`, without kube-client's per-call failure lines.
/// kube-client logs every failed HTTP call at ERROR (its trace layer, `client::builder`), whatever the
/// caller makes of it: through one API-server restart a replica wrote ~55 ERROR lines (`client error
/// (Connect)`) for calls it retried or answered from its cache (the soak, bench/RESULTS.md). Each
/// failure that matters is logged where it is handled, at the level it deserves (a watch's WARN, a
/// leader step's error, a denial's message); `RUST_LOG=info,kube_client=debug` shows them again.
pub const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";

pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let _ = match format {
        LogFormat::Text => tracing::subscriber::set_global_default(text_subscriber(
            filter,
            std::io::stderr,
            std::io::stderr().is_terminal(),
        )),
        // The request's span fields (uid, webhook, name) ride on every line of it.
        LogFormat::Json => tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_target(false)
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .finish(),
        ),
    };
}

/// The text format's subscriber, writing to `writer` (stderr; a buffer in tests), with every field
/// escaped and clipped ([`EscapedFields`]).
pub fn text_subscriber<W>(
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_target(false)
        .with_ansi(ansi)
        .fmt_fields(EscapedFields)
        .finish()
}

/// A request's text as a log field, cut to at most `max` bytes as written (on a character
/// boundary) with the length of what was left out, its control characters escaped
/// ([`needs_escape`]): a 1 MiB `uid` must not become 1 MiB of log, nor a newline in it a line of
/// its own. The one way text from a review reaches a log, a warning or an audit annotation.
pub struct Clipped<'a>(pub &'a str, pub usize);

/// Names, namespaces and uids as log fields.
pub const MAX_LOGGED_NAME: usize = 256;
/// Denial messages as log fields.
pub const MAX_LOGGED_MESSAGE: usize = 1024;
/// Any field of a text log line, whatever its call site wrote (a backstop: text from a review is
/// clipped shorter by [`Clipped`]).
pub const MAX_LOGGED_FIELD: usize = 4096;

impl<'a> Clipped<'a> {
    /// A name, namespace, uid, kind or user name from a review.
    pub fn name(text: &'a str) -> Self {
        Self(text, MAX_LOGGED_NAME)
    }

    /// A message that may quote a review's object.
    pub fn message(text: &'a str) -> Self {
        Self(text, MAX_LOGGED_MESSAGE)
    }
}

/// Characters a log line never carries as themselves: control characters (C0 with newline,
/// carriage return and ESC, which starts an ANSI sequence; DEL; C1 with NEL and CSI), the Unicode
/// line and paragraph separators, and the bidirectional controls that reorder what a terminal
/// shows.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// Writes as much of `text` as fits in `room` bytes, each character that [`needs_escape`] as its
/// escape (`\n`, `\u{1b}`), never cutting one; returns how many of `text`'s bytes were written and
/// how many bytes that took.
fn write_escaped(
    out: &mut dyn fmt::Write,
    text: &str,
    room: usize,
) -> Result<(usize, usize), fmt::Error> {
    let (mut read, mut written) = (0, 0);
    // Runs of characters that need no escape are written in one piece.
    let mut run = 0;
    for (at, c) in text.char_indices() {
        let width = if needs_escape(c) {
            c.escape_default().len()
        } else {
            c.len_utf8()
        };
        if written + width > room {
            break;
        }
        if needs_escape(c) {
            out.write_str(&text[run..at])?;
            for e in c.escape_default() {
                out.write_char(e)?;
            }
            run = at + c.len_utf8();
        }
        written += width;
        read = at + c.len_utf8();
    }
    out.write_str(&text[run..read])?;
    Ok((read, written))
}

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Clipped(text, max) = *self;
        // Every request's span formats these: the usual text is written in one piece.
        if text.len() <= max && !text.chars().any(needs_escape) {
            return f.write_str(text);
        }
        let (read, _) = write_escaped(f, text, max)?;
        if read < text.len() {
            write!(f, "...(+{} bytes)", text.len() - read)?;
        }
        Ok(())
    }
}

/// The text format's fields (as tracing-subscriber's default: the message, then `name=value`
/// with values as `Debug`), each value escaped and clipped to [`MAX_LOGGED_FIELD`] bytes as it is
/// written: a `%field` whose `Display` writes a newline or an ESC cannot forge a line or colour one.
#[derive(Clone, Copy, Debug, Default)]
pub struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = EscapedVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapedVisitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl EscapedVisitor<'_> {
    fn field(&mut self, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
        if !std::mem::take(&mut self.first) {
            self.writer.write_char(' ')?;
        }
        let name = field.name();
        if name != "message" {
            let name = name.strip_prefix("r#").unwrap_or(name);
            if self.writer.has_ansi_escapes() {
                // Italic name, dimmed `=`, as the default format shows them on a terminal.
                write!(self.writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m")?;
            } else {
                write!(self.writer, "{name}=")?;
            }
        }
        let mut out = Escaping {
            out: &mut self.writer,
            room: MAX_LOGGED_FIELD,
            full: false,
        };
        match write!(out, "{value:?}") {
            // The value was cut where it filled its room (its formatting stopped there).
            Err(fmt::Error) if out.full => self.writer.write_str("...(clipped)"),
            result => result,
        }
    }
}

impl Visit for EscapedVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_ok() {
            self.result = self.field(field, value);
        }
    }
}

/// A writer that escapes what [`needs_escape`] and takes at most `room` bytes: past that it fails,
/// so that a huge value's formatting stops there.
struct Escaping<'a> {
    out: &'a mut dyn fmt::Write,
    room: usize,
    full: bool,
}

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let (read, written) = write_escaped(self.out, s, self.room)?;
        self.room -= written;
        if read < s.len() {
            self.full = true;
            return Err(fmt::Error);
        }
        Ok(())
    }
}

/// A log written to memory, for tests: `text_subscriber(filter, buffer.clone(), false)`.
#[cfg(test)]
#[derive(Clone, Default)]
pub struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl LogBuffer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[cfg(test)]
impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Clipped, LogBuffer, MAX_LOGGED_FIELD, needs_escape, text_subscriber};
    use tracing_subscriber::EnvFilter;

    #[test]
    fn long_fields_are_cut_on_a_character_boundary() {
        assert_eq!(Clipped("short", 8).to_string(), "short");
        assert_eq!(Clipped("abcdefghij", 4).to_string(), "abcd...(+6 bytes)");
        // 'é' is two bytes: the cut moves back before it.
        assert_eq!(Clipped("abcé", 4).to_string(), "abc...(+2 bytes)");
        // An escape counts as what it takes in the log, and is not cut either.
        assert_eq!(Clipped("ab\u{1b}cd", 4).to_string(), "ab...(+3 bytes)");
        assert_eq!(
            Clipped("ab\u{1b}cd", 8).to_string(),
            r"ab\u{1b}...(+2 bytes)"
        );
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
        // C1's CSI and NEL, the line separator, a right-to-left override, DEL.
        assert_eq!(
            Clipped("a\u{9b}31m\u{85}\u{2028}\u{202e}\u{7f}", 256).to_string(),
            r"a\u{9b}31m\u{85}\u{2028}\u{202e}\u{7f}"
        );
    }

    /// kube-client's line for a failed call is left out by default; an ERROR of ours is not.
    #[test]
    fn the_default_filter_leaves_out_kube_clients_per_call_failures() {
        let buffer = LogBuffer::default();
        let filter = EnvFilter::new(super::DEFAULT_FILTER);
        let subscriber = text_subscriber(filter, buffer.clone(), false);
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "kube_client::client::builder", "failed with error client error (Connect)");
            tracing::warn!(target: "koord_webhook::cache::watch", "watch failed; resuming");
            tracing::error!("handler panicked");
        });
        let text = buffer.text();
        assert!(!text.contains("client error (Connect)"), "{text}");
        assert!(
            text.contains("watch failed; resuming") && text.contains("handler panicked"),
            "{text}"
        );
    }

    /// Strings of anything, with control characters (C0, DEL, C1), separators and bidirectional
    /// controls much more often than chance would give them.
    fn hostile() -> impl Strategy<Value = String> {
        let c = prop_oneof![
            3 => any::<char>(),
            3 => (0u32..0x20).prop_map(|c| char::from_u32(c).unwrap()),
            2 => (0x7fu32..0xa0).prop_map(|c| char::from_u32(c).unwrap()),
            1 => prop::sample::select(vec![
                '\u{1b}', '\n', '\r', '\u{2028}', '\u{2029}', '\u{202e}', '\u{2066}', '\u{61c}'
            ]),
            3 => prop::sample::select(vec!['a', '[', '3', '1', 'm', ';', ' ', '\\', 'é']),
        ];
        prop::collection::vec(c, 0..300).prop_map(|cs| cs.into_iter().collect())
    }

    /// One event with `text` in a field of each form and in the message, as the text format
    /// writes it.
    fn logged(text: &str) -> String {
        let buffer = LogBuffer::default();
        let subscriber = text_subscriber(EnvFilter::new("info"), buffer.clone(), false);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("admission", uid = %text);
            let _in = span.enter();
            tracing::info!(
                raw = %text,
                debug = ?text,
                plain = text,
                clipped = %Clipped::name(text),
                "forged: {text}"
            );
        });
        buffer.text()
    }

    proptest! {
        #[test]
        fn clipped_text_has_no_control_characters_and_keeps_its_bound(
            text in hostile(),
            max in 0usize..300,
        ) {
            let shown = Clipped(&text, max).to_string();
            prop_assert!(!shown.chars().any(needs_escape), "{shown:?}");
            let suffix = format!("...(+{} bytes)", text.len());
            prop_assert!(shown.len() <= max + suffix.len(), "{} > {max}", shown.len());
            if text.len() <= max && !text.chars().any(needs_escape) {
                prop_assert_eq!(&shown, &text);
            }
        }

        #[test]
        fn a_text_log_line_has_no_control_characters_whatever_its_fields_write(
            text in hostile(),
        ) {
            let line = logged(&text);
            let body = line.strip_suffix('\n').unwrap_or_else(|| panic!("no line end: {line:?}"));
            prop_assert!(
                !body.chars().any(needs_escape),
                "a control character in {body:?}"
            );
        }
    }

    #[test]
    fn the_text_format_clips_every_field_and_reads_as_the_default_one() {
        let line = logged("ok");
        assert!(
            line.trim_end().ends_with(
                r#"admission{uid=ok}: forged: ok raw=ok debug="ok" plain="ok" clipped=ok"#
            ),
            "{line:?}"
        );
        let huge = "u".repeat(1 << 20);
        let line = logged(&huge);
        // Five fields (with the span's) and the message, each cut to its room.
        assert!(
            line.len() < 6 * MAX_LOGGED_FIELD + 400,
            "{} bytes",
            line.len()
        );
        assert!(line.contains("...(clipped)"));
    }

    /// What the text format guards against: tracing-subscriber's own writes a `%field` as its
    /// `Display` writes it.
    #[test]
    fn the_default_format_alone_would_write_a_raw_newline_and_esc() {
        let buffer = LogBuffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(raw = %"a\nb\u{1b}[31m", "x");
        });
        let text = buffer.text();
        assert!(
            text.trim_end().contains('\n') && text.contains('\u{1b}'),
            "{text:?}"
        );
    }
}
