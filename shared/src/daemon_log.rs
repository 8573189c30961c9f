//! How the daemons log (`rcp serve`, `rblock serve`, `rblock connect`):
//! through `tracing` events with fields (`client`, `export`, `session`,
//! `lane`, ...), shown two ways.
//!
//! - Started by systemd with its output going to the journal
//!   (`JOURNAL_STREAM` set) and journald's socket there: native journal
//!   entries. The fields become journal fields of their own (`CLIENT=`,
//!   `EXPORT=`, ... : `journalctl -u rblock-serve CLIENT=10.0.0.7:5123`),
//!   the level becomes `PRIORITY=`, the tool `SYSLOG_IDENTIFIER=`.
//! - Anywhere else: one readable line per event on stderr, `TOOL: MESSAGE
//!   (field=value, ...)`, with `warning:` or `error:` before the message
//!   when it is one: the lines the daemons printed before they had fields.
//!
//! `RUST_LOG` sets the levels as usual (`warn`, `rblock=debug`, ...); the
//! default is `info`. The interactive tools (`rcp` copies, `rblock
//! detach`) print plain messages and do not use this.
#![forbid(unsafe_code)]

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Where the events went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Journal,
    Terminal,
}

/// Sets up the process's logging for daemon `tool` (as it names itself
/// in each line, and as its journal identifier). Call once, early.
pub fn init(tool: &'static str) -> Sink {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        if let Ok(journal) = tracing_journald::layer() {
            let journal = journal
                .with_field_prefix(None)
                .with_syslog_identifier(tool.replace(' ', "-"));
            let ok = tracing_subscriber::registry()
                .with(filter())
                .with(journal)
                .try_init()
                .is_ok();
            if ok {
                return Sink::Journal;
            }
        }
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .event_format(Lines { tool })
        .try_init();
    Sink::Terminal
}

/// The terminal form of an event: `TOOL: [warning: |error: ]MESSAGE
/// (field=value, ...)`.
#[derive(Debug, Clone, Copy)]
pub struct Lines {
    pub tool: &'static str,
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        write!(w, "{}: ", self.tool)?;
        match *event.metadata().level() {
            Level::ERROR => w.write_str("error: ")?,
            Level::WARN => w.write_str("warning: ")?,
            Level::INFO => {}
            Level::DEBUG => w.write_str("debug: ")?,
            Level::TRACE => w.write_str("trace: ")?,
        }
        w.write_str(&fields.message)?;
        if !fields.rest.is_empty() {
            write!(w, " ({})", fields.rest)?;
        }
        writeln!(w)
    }
}

/// An event's message, and its other fields as `name=value, ...`.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Fields {
    fn add(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if field.name() == "message" {
            let _ = self.message.write_fmt(value);
            return;
        }
        if !self.rest.is_empty() {
            self.rest.push_str(", ");
        }
        let _ = write!(self.rest, "{}={value}", field.name());
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.add(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.add(field, format_args!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Runs `f` with the terminal format writing into a buffer; the text.
    fn lines(filter: &str, f: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&out);
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(filter))
            .with_writer(move || Buffer(Arc::clone(&sink)))
            .event_format(Lines {
                tool: "rblock serve",
            })
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(out.lock().unwrap().clone()).unwrap()
    }

    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_is_the_tool_the_level_the_message_and_the_fields() {
        let text = lines("info", || {
            tracing::info!("listening on 127.0.0.1:10809");
            let client = "127.0.0.1:5555";
            tracing::warn!(
                client,
                export = "disk",
                "refusing a connection: too many open"
            );
            tracing::error!(lane = 2, "the server broke the protocol");
            tracing::debug!("not shown at info");
        });
        assert_eq!(
            text,
            "rblock serve: listening on 127.0.0.1:10809\n\
             rblock serve: warning: refusing a connection: too many open \
             (client=127.0.0.1:5555, export=disk)\n\
             rblock serve: error: the server broke the protocol (lane=2)\n"
        );
    }

    #[test]
    fn levels_follow_the_filter() {
        let text = lines("warn", || {
            tracing::info!("hidden");
            tracing::warn!("shown");
        });
        assert_eq!(text, "rblock serve: warning: shown\n");
        let text = lines("rfabric=debug", || tracing::debug!("shown"));
        assert_eq!(text, "rblock serve: debug: shown\n");
    }
}
