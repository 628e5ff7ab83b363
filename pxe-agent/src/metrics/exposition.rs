//! The one writer of the Prometheus text exposition format (0.0.4) that
//! every `/metrics` section goes through: a family's `# HELP` and `# TYPE`
//! lines, then its samples, with help text and label values escaped as
//! the format says. It knows no metric; the names live with what counts.
//!
//! Hand-written rather than the `prometheus-client` crate: that crate
//! writes OpenMetrics (a `# EOF` line, counters named without `_total` in
//! their `# TYPE` line, another content type) and owns the counters in its
//! own registry, while the page's names, labels and 0.0.4 text are what
//! dashboards and the end-to-end tests read, and the counters live in the
//! services (atomics, BPF maps, snapshots) that are read once a scrape.

use std::fmt::{Display, Write as _};

/// The `# TYPE` of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A section of the page being written.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts the family `name`: its `# HELP` and `# TYPE` lines. Its
    /// samples are written through what this returns, before the next
    /// family starts.
    pub fn family<'a>(&'a mut self, name: &'a str, kind: Kind, help: &str) -> Family<'a> {
        debug_assert!(is_name(name), "metric name {name:?}");
        let text = &mut self.text;
        let _ = write!(text, "# HELP {name} ");
        escape(text, help, false);
        let _ = writeln!(text, "\n# TYPE {name} {}", kind.as_str());
        Family { text, name }
    }

    /// A histogram family with one series per `(labels, snapshot)`: its
    /// `_bucket` samples (cumulative, `le` last among the labels), `_sum`
    /// and `_count`.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        series: &[(&[(&str, &str)], &super::HistogramSnapshot)],
    ) {
        let _ = self.family(name, Kind::Histogram, help);
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        for (labels, h) in series {
            let mut f = Family {
                text: &mut self.text,
                name: &bucket,
            };
            let les = h
                .bounds
                .iter()
                .map(f64::to_string)
                .chain(std::iter::once("+Inf".to_string()));
            let counts = h.cumulative.iter().copied().chain(std::iter::once(h.count));
            for (le, n) in les.zip(counts) {
                let mut with_le = labels.to_vec();
                with_le.push(("le", le.as_str()));
                f.sample(&with_le, n);
            }
            Family {
                text: &mut self.text,
                name: &sum,
            }
            .sample(labels, h.sum_seconds);
            Family {
                text: &mut self.text,
                name: &count,
            }
            .sample(labels, h.count);
        }
    }

    /// The text written.
    pub fn finish(self) -> String {
        self.text
    }
}

/// The samples of one family.
#[derive(Debug)]
pub struct Family<'a> {
    text: &'a mut String,
    name: &'a str,
}

impl Family<'_> {
    /// One sample: `name{label="value",...} value`, without braces when
    /// `labels` is empty.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Display) -> &mut Self {
        let text = &mut *self.text;
        text.push_str(self.name);
        for (i, (label, v)) in labels.iter().enumerate() {
            debug_assert!(is_name(label) && !label.contains(':'), "label {label:?}");
            text.push_str(if i == 0 { "{" } else { "," });
            text.push_str(label);
            text.push_str("=\"");
            escape(text, v, true);
            text.push('"');
        }
        if !labels.is_empty() {
            text.push('}');
        }
        let _ = writeln!(text, " {value}");
        self
    }

    /// The family's one sample, without labels.
    pub fn value(&mut self, value: impl Display) {
        self.sample(&[], value);
    }
}

/// Appends `s` with `\` and line feeds escaped, and `"` too in a label
/// value (help text keeps its quotes).
fn escape(out: &mut String, s: &str, label: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if label => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// A metric or label name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_its_header_then_its_samples() {
        let mut out = Exposition::new();
        out.family("pxe_things_total", Kind::Counter, "Things seen.")
            .sample(&[("kind", "a"), ("by", "b")], 3)
            .sample(&[("kind", "c"), ("by", "d")], 0);
        out.family("pxe_level", Kind::Gauge, "A level.").value(1.5);
        assert_eq!(
            out.finish(),
            "# HELP pxe_things_total Things seen.\n\
             # TYPE pxe_things_total counter\n\
             pxe_things_total{kind=\"a\",by=\"b\"} 3\n\
             pxe_things_total{kind=\"c\",by=\"d\"} 0\n\
             # HELP pxe_level A level.\n\
             # TYPE pxe_level gauge\n\
             pxe_level 1.5\n"
        );
    }

    #[test]
    fn help_and_label_values_are_escaped() {
        let mut out = Exposition::new();
        out.family("pxe_x", Kind::Gauge, "a \"b\" c\\d\ne")
            .sample(&[("v", "q\"u\\o\nte")], 0);
        assert_eq!(
            out.finish(),
            "# HELP pxe_x a \"b\" c\\\\d\\ne\n\
             # TYPE pxe_x gauge\n\
             pxe_x{v=\"q\\\"u\\\\o\\nte\"} 0\n"
        );
    }

    #[test]
    fn a_histogram_is_its_cumulative_buckets_sum_and_count() {
        let h = crate::metrics::Histogram::default();
        h.observe(std::time::Duration::from_millis(2));
        h.observe(std::time::Duration::from_secs(2));
        let mut out = Exposition::new();
        out.histogram(
            "pxe_wait_seconds",
            "Waits.",
            &[(&[("k", "v")], &h.snapshot())],
        );
        let text = out.finish();
        assert!(
            text.starts_with(
                "# HELP pxe_wait_seconds Waits.\n\
                 # TYPE pxe_wait_seconds histogram\n\
                 pxe_wait_seconds_bucket{k=\"v\",le=\"0.0005\"} 0\n\
                 pxe_wait_seconds_bucket{k=\"v\",le=\"0.001\"} 0\n\
                 pxe_wait_seconds_bucket{k=\"v\",le=\"0.0025\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "pxe_wait_seconds_bucket{k=\"v\",le=\"1\"} 1\n\
                 pxe_wait_seconds_bucket{k=\"v\",le=\"+Inf\"} 2\n\
                 pxe_wait_seconds_sum{k=\"v\"} 2.002\n\
                 pxe_wait_seconds_count{k=\"v\"} 2\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn names_are_checked_against_the_format() {
        assert!(is_name("pxe_a:b_total"));
        assert!(!is_name(""));
        assert!(!is_name("1x"));
        assert!(!is_name("pxe-x"));
    }
}
