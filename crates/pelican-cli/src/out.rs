//! Standard output. SIGPIPE stays ignored, as Rust sets it: a write to a socket whose
//! peer is gone (a Redis node killed mid-write) raises it too, and there it must be an
//! error pelican handles, not the end of a worker. What SIGPIPE did for standard output
//! is done here instead: when its reader goes away (`pelican stats | head -1`), the
//! process ends as other Unix tools do, by SIGPIPE, quietly.

use std::io::Write;

/// Writes `args` to standard output, then a newline if `newline`.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut out = std::io::stdout().lock();
    let r = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    if let Err(e) = r {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            end_by_sigpipe();
        }
        panic!("failed printing to stdout: {e}");
    }
}

/// Ends the process as SIGPIPE's default action would.
fn end_by_sigpipe() -> ! {
    // SAFETY: restores the default action of SIGPIPE and raises it on this thread; the
    // process ends there (the exit below is for the impossible case that it does not).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(141)
}
