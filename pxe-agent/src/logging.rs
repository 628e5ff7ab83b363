//! The agent's log output: text for a terminal, or one JSON object a line
//! (`--log-format json`) for log shippers. Owns the subscriber's shape and
//! [`Every`], the rate limit of warnings a storm would repeat; not what is
//! logged.

use std::time::{Duration, Instant};

use tracing::Subscriber;
use tracing_subscriber::{EnvFilter, fmt::MakeWriter};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    /// One object a line: `timestamp`, `level`, `target`, `message` and the
    /// event's fields at the top level.
    Json,
}

/// The filter from `RUST_LOG`, else `info`.
pub fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// A subscriber writing `format` lines to `writer`.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(fmt.finish()),
        LogFormat::Json => Box::new(
            fmt.json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// A warning logged at most once per `period`: the occurrences in between
/// are counted and reported with the next one, so a storm of the same
/// failure does not flood the log.
#[derive(Debug)]
pub struct Every {
    period: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Every {
    pub const fn new(period: Duration) -> Every {
        Every {
            period,
            last: None,
            suppressed: 0,
        }
    }

    /// Whether to log now; if so, how many occurrences went unlogged since
    /// the last time.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < self.period)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{Arc, Mutex},
    };

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Buffer {
            self.clone()
        }
    }

    fn log_with(format: LogFormat) -> String {
        let buf = Buffer::default();
        let sub = subscriber(format, EnvFilter::new("info"), buf.clone());
        tracing::subscriber::with_default(sub, || {
            tracing::info!(hosts = 3, iface = "eth1", "inventory loaded");
            tracing::debug!("filtered out");
        });
        String::from_utf8(buf.0.lock().unwrap().clone()).expect("utf-8")
    }

    #[test]
    fn json_lines_parse_with_level_message_and_fields() {
        let text = log_with(LogFormat::Json);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["message"], "inventory loaded", "{line}");
        assert_eq!(line["hosts"], 3, "{line}");
        assert_eq!(line["iface"], "eth1", "{line}");
        assert!(line["timestamp"].is_string(), "{line}");
    }

    #[test]
    fn text_is_the_default_and_not_json() {
        assert_eq!(LogFormat::default(), LogFormat::Text);
        let text = log_with(LogFormat::Text);
        assert!(text.contains("inventory loaded"), "{text}");
        assert!(serde_json::from_str::<serde_json::Value>(text.trim()).is_err());
    }

    #[test]
    fn warnings_are_rate_limited_and_count_what_they_skipped() {
        let mut log = Every::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(log.admit(t0), Some(0));
        assert_eq!(log.admit(t0 + Duration::from_millis(10)), None);
        assert_eq!(log.admit(t0 + Duration::from_millis(20)), None);
        assert_eq!(log.admit(t0 + Duration::from_millis(1200)), Some(2));
        assert_eq!(log.admit(t0 + Duration::from_millis(1300)), None);
    }
}
