//! What the demo tells the user while it runs.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Event lines and the progress bar: data goes to stdout, so with --json the events go
/// to stderr; the bar is drawn on stderr only when it is a terminal.
pub struct Say {
    json: bool,
    /// The progress bar (hidden when stderr is not a terminal).
    pub bar: ProgressBar,
}

impl Say {
    /// A bar with no length yet.
    pub fn new(json: bool) -> Say {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{prefix:>7} [{bar:30}] {pos}/{len} {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        Say { json, bar }
    }

    /// Prints one event line above the bar.
    pub fn say(&self, line: impl AsRef<str>) {
        let line = line.as_ref();
        self.bar.suspend(|| {
            if self.json {
                eprintln!("{line}");
            } else {
                outln!("{line}");
            }
        });
    }
}
