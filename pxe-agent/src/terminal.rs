//! Text for the command-line tables: strings that clients chose (option 12
//! hostnames, vendor and user classes, circuit ids, requested file names)
//! made safe to print on an operator's terminal. Owns the escaping only;
//! JSON output needs none, as JSON escapes control characters itself.

use std::{borrow::Cow, fmt::Write as _};

/// `text` with everything a terminal could act on written out instead:
/// control characters (C0, DEL, C1) as `\xNN`, or `\u{NNNN}` past
/// `\xff`; the Unicode bidirectional controls, which reorder what is
/// shown around them, as `\u{NNNN}`; and `\` as `\\`, so an escape in the
/// output always came from here. Anything else, including non-ASCII
/// letters, is kept. Borrows when there is nothing to escape.
///
/// A client can put an escape sequence (`\x1b]0;...`, `\x1b[2J`) in a
/// DHCP option; printed raw, it would retitle, clear or otherwise drive
/// the terminal of whoever lists the clients.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if needs_escape(c) && u32::from(c) <= 0xff => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c == '\\' || c.is_control() || is_bidi_control(c)
}

/// The explicit directional formatting characters (Unicode UAX #9, 2.1-2.7).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for text in [
            "",
            "PXEClient:Arch:00007:UNDI:003016",
            "iPXE",
            "nœud-1 rack 3",
        ] {
            assert!(
                matches!(escape(text), Cow::Borrowed(t) if t == text),
                "{text}"
            );
        }
    }

    #[test]
    fn terminal_escape_sequences_are_written_out() {
        assert_eq!(escape("\x1b]0;owned\x07"), "\\x1b]0;owned\\x07");
        assert_eq!(escape("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(
            escape("line\r\nnext\ttab\0"),
            "line\\x0d\\x0anext\\x09tab\\x00"
        );
        assert_eq!(escape("del\x7f"), "del\\x7f");
        // C1 CSI, which some terminals take like ESC [.
        assert_eq!(escape("\u{9b}31m"), "\\x9b31m");
    }

    #[test]
    fn bidi_controls_are_written_out() {
        assert_eq!(escape("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(escape("\u{2066}x\u{2069}"), "\\u{2066}x\\u{2069}");
    }

    #[test]
    fn backslash_is_doubled_so_escapes_are_unambiguous() {
        assert_eq!(escape("\\x1b"), "\\\\x1b");
        assert_eq!(escape("a\\b\x1b"), "a\\\\b\\x1b");
    }

    #[test]
    fn escaped_text_keeps_table_padding() {
        assert_eq!(format!("{:<8}|", escape("\x1b")), "\\x1b    |");
    }
}
