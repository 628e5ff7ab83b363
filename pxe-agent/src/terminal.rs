//! Text for the command-line tables: strings that clients chose (option 12
//! hostnames, vendor and user classes, circuit ids, requested file names)
//! made safe to print on an operator's terminal, and laid out in aligned
//! columns ([`Table`]), long cells cut to a width. Owns the escaping and
//! the layout; JSON output needs neither, as JSON escapes control
//! characters itself.

use std::{borrow::Cow, fmt::Write as _};

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// Aligned columns: each as wide as its widest cell (or title), at most
/// its `max` characters; longer cells are cut and end with `…`. Cells are
/// counted in characters, which is what terminals show for the text
/// printed here (escaped, see [`escape`]), bar wide CJK and emoji.
pub struct Table {
    columns: Vec<(&'static str, usize, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns as `(title, max, align)`.
    pub fn new(columns: &[(&'static str, usize, Align)]) -> Table {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; cells past the columns are dropped, missing ones empty.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table, a title line first, two spaces between columns and no
    /// trailing blanks.
    pub fn render(&self) -> String {
        let cell = |row: &[String], i: usize| -> String {
            let text = row.get(i).map_or("", String::as_str);
            cut(text, self.columns[i].1).into_owned()
        };
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, (title, max, _))| {
                self.rows
                    .iter()
                    .map(|r| cell(r, i).chars().count())
                    .chain([title.chars().count().min(*max)])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let titles: Vec<String> = self.columns.iter().map(|c| c.0.to_string()).collect();
        let mut out = String::new();
        for row in std::iter::once(&titles).chain(&self.rows) {
            let mut line = String::new();
            for (i, (_, _, align)) in self.columns.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let text = cell(row, i);
                let pad = widths[i].saturating_sub(text.chars().count());
                match align {
                    Align::Left => {
                        line.push_str(&text);
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(&text);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `text` cut to `max` characters, the last one `…` when anything was cut.
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.chars().count() <= max {
        return Cow::Borrowed(text);
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    if max > 0 {
        out.push('…');
    }
    Cow::Owned(out)
}

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
    fn a_long_cell_is_cut_and_the_columns_stay_in_line() {
        let mut t = Table::new(&[
            ("MAC", 17, Align::Left),
            ("LAST DHCP", 20, Align::Left),
            ("N", 4, Align::Right),
            ("BOOTED", 30, Align::Left),
        ]);
        t.row(vec![
            "52:54:00:12:34:56".into(),
            "14s ago ack 10.66.1.10 (plain, xdp) relayed by 10.66.9.1".into(),
            "3".into(),
            "4s ago ramdisk up".into(),
        ]);
        t.row(vec![
            "52:54:00:12:34:57".into(),
            "-".into(),
            "12".into(),
            "-".into(),
        ]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "MAC                LAST DHCP              N  BOOTED",
                "52:54:00:12:34:56  14s ago ack 10.66.1…   3  4s ago ramdisk up",
                "52:54:00:12:34:57  -                     12  -",
            ],
            "{text}"
        );
        // Every column starts at the same character on every line.
        for start in [19, 41, 45] {
            for line in &lines {
                let before = line.chars().nth(start - 1);
                assert_eq!(before, Some(' '), "column at {start}: {line}");
            }
        }
    }

    #[test]
    fn cut_keeps_short_text_and_marks_what_it_cuts() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("exactly-10", 10), "exactly-10");
        assert_eq!(cut("eleven-char", 10), "eleven-ch…");
        assert_eq!(cut("nœud-1-du-rack", 6), "nœud-…");
    }

    #[test]
    fn escaped_text_keeps_table_padding() {
        assert_eq!(format!("{:<8}|", escape("\x1b")), "\\x1b    |");
    }
}
