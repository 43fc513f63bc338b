//! Text from a job (its events, reasons, node reports, process output) made safe to print on
//! an operator's terminal: a job must not be able to set the terminal's title, clear or
//! rewrite the screen, or hide a line behind another through escape sequences. [`printable`]
//! shows every control character but the newline and the tab as `\xNN` (ESC, CR, BEL, the
//! C1 controls, DEL); [`printable_output`] keeps the carriage return too, for a process's own
//! output (progress bars), and shows the rest alike.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with every control character but `\n` and `\t` shown as `\xNN` (C1 controls as
/// `\u{NN}`).
pub fn printable(text: &str) -> Cow<'_, str> {
    shown(text, &['\n', '\t'])
}

/// [`printable`] that keeps `\r` too: a process's output, whose progress bars rewrite their
/// line (a whole line is never hidden by it: `\r` moves to the line's start, nothing more).
pub fn printable_output(text: &str) -> Cow<'_, str> {
    shown(text, &['\n', '\t', '\r'])
}

fn shown<'a>(text: &'a str, kept: &[char]) -> Cow<'a, str> {
    let unsafe_char = |c: char| c.is_control() && !kept.contains(&c);
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !unsafe_char(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_not_sent() {
        // A title set (OSC), a screen clear (CSI), a bell, a C1 CSI, DEL, a hiding CR.
        let hostile = "node-1 \x1b]0;pwned\x07 \x1b[2J\x1b[H ok\u{9b}31m\x7f\rfake";
        let shown = printable(hostile);
        assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
        assert_eq!(
            shown,
            "node-1 \\x1b]0;pwned\\x07 \\x1b[2J\\x1b[H ok\\u{9b}31m\\x7f\\x0dfake"
        );
        assert!(matches!(printable("plain\n\ttext"), Cow::Borrowed(_)));
        assert_eq!(
            printable_output("step 1\rstep 2\x1b[K\n"),
            "step 1\rstep 2\\x1b[K\n"
        );
    }
}
