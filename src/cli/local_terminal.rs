//! The terminal `client shell` runs in: raw mode while a remote shell owns the keyboard
//! (restored when dropped, also on an error or a panic), and the window size the remote
//! terminal should have. When standard input is not a terminal (piped input), nothing is
//! changed and the size is the conventional 24 × 80.

use std::io::IsTerminal as _;

use rustix::termios::{self, OptionalActions, Termios};

/// The size a remote terminal gets when the local one cannot tell.
pub const DEFAULT_SIZE: (u32, u32) = (24, 80);
/// The largest remote terminal, each way (docs/commands.md §6).
const MAX_DIMENSION: u16 = 1000;

/// The local terminal, in raw mode while this value lives (when standard input is one).
pub struct LocalTerminal {
    /// The settings to restore; `None` when standard input is not a terminal.
    saved: Option<Termios>,
}

impl LocalTerminal {
    /// Puts standard input in raw mode when it is a terminal: every key (^C, ^D, ^Z included)
    /// reaches the remote shell as a byte, and nothing is echoed locally.
    pub fn raw() -> anyhow::Result<Self> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(Self { saved: None });
        }
        let saved = termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(Self { saved: Some(saved) })
    }

    /// Whether standard input is a terminal in raw mode.
    pub fn is_raw(&self) -> bool {
        self.saved.is_some()
    }

    /// Rows and columns of the local terminal (standard input's, else standard output's; at
    /// most 1000 each), else [`DEFAULT_SIZE`].
    pub fn size() -> (u32, u32) {
        let of = |size: termios::Winsize| {
            let (rows, cols) = (
                size.ws_row.min(MAX_DIMENSION),
                size.ws_col.min(MAX_DIMENSION),
            );
            (rows > 0 && cols > 0).then_some((u32::from(rows), u32::from(cols)))
        };
        termios::tcgetwinsize(std::io::stdin())
            .ok()
            .and_then(of)
            .or_else(|| termios::tcgetwinsize(std::io::stdout()).ok().and_then(of))
            .unwrap_or(DEFAULT_SIZE)
    }

    /// A line for the user: in raw mode a newline needs its carriage return.
    pub fn note(&self, text: &str) {
        if self.is_raw() {
            eprint!("{text}\r\n");
        } else {
            eprintln!("{text}");
        }
    }
}

impl Drop for LocalTerminal {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, saved);
        }
    }
}
