//! The report page: one self-contained HTML document (inline CSS and SVG, no
//! scripts, nothing fetched) with a section per N. The plots come from `plot`
//! and the table from `table`.

use std::fmt::Write as _;

use super::data::Group;
use super::{plot, stages, table};

const CSS: &str = "\
body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1800px}\
h1{font-size:1.5em}h2{font-size:1.25em;border-bottom:1px solid #ccc;margin-top:2em}\
h3{font-size:1.05em}p.meta{color:#555}\
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}\
th,td{border:1px solid #bbb;padding:.25em .5em;text-align:right}\
th:first-child,td:first-child{text-align:left}th{background:#f0f0f0}\
.plots{display:flex;flex-wrap:wrap;gap:8px}.plots figure{margin:0}.plots svg{border:1px solid #ddd}\
.error{color:#a00}";

/// Escapes text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The setting of one N (from the first run's meta.json): CPU, kernel, date
/// and the workload.
pub fn setting(group: &Group) -> String {
    let Some(meta) = group.runs.first().map(|r| &r.meta) else {
        return String::new();
    };
    let kib = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{v:.0} KiB"));
    let mix = match &meta.mix {
        serde_json::Value::Null => "?".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    format!(
        "CPU {}, kernel {}, {}, open-files limit {}. {} machines started over {} s, mix {mix}, windowsize {}; boot file {}, kernel {}, initrd {}.",
        or_unknown(&meta.cpu),
        or_unknown(&meta.kernel),
        or_unknown(&meta.date),
        meta.nofile.map_or("?".to_owned(), |n| n.to_string()),
        group.n,
        meta.spread_s.map_or("?".to_owned(), |s| s.to_string()),
        meta.windowsize_share
            .map_or("?".to_owned(), |s| format!("{s:.0} % of the TFTP machines")),
        kib(meta.bootfile_kib),
        kib(meta.kernel_kib),
        kib(meta.initrd_kib),
    )
}

fn or_unknown(text: &str) -> &str {
    if text.is_empty() { "?" } else { text }
}

/// Runs whose simulator reported an error: (label, error).
pub fn sim_errors(group: &Group) -> Vec<(&str, &str)> {
    group
        .runs
        .iter()
        .filter_map(|r| Some((r.label(), r.meta.sim_error.as_deref()?)))
        .collect()
}

/// The page for every group.
pub fn page(groups: &[Group]) -> anyhow::Result<String> {
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>Storm report</title>\n<style>{CSS}</style>\n</head>\n<body>\n\
         <h1>Netboot storm: pxe-agent, Kea + tftpd-hpa + nginx, dnsmasq + nginx</h1>\n"
    );
    for group in groups {
        section(&mut out, group)?;
    }
    out.push_str("</body>\n</html>\n");
    Ok(out)
}

fn section(out: &mut String, group: &Group) -> anyhow::Result<()> {
    let _ = writeln!(
        out,
        "<section id=\"n{0}\">\n<h2>{0} machines</h2>",
        escape(&group.n)
    );
    let _ = writeln!(out, "<p class=\"meta\">{}</p>", escape(&setting(group)));
    for (label, error) in sim_errors(group) {
        let _ = writeln!(
            out,
            "<p class=\"error\">{}: simulator error: {}</p>",
            escape(label),
            escape(error)
        );
    }
    out.push_str(&table::html(&table::rows(group)));
    out.push_str(&stages::html(&stages::rows(group)));
    let plots = plot::all(group)?;
    type Belongs = fn(&str) -> bool;
    let kinds: [(&str, Belongs); 3] = [
        ("Completion time per stage", |n| n.starts_with("cdf-")),
        ("Over time", |n| {
            !n.starts_with("cdf-") && !n.starts_with("total-")
        }),
        ("Totals", |n| n.starts_with("total-")),
    ];
    for (heading, belongs) in kinds {
        let _ = writeln!(out, "<h3>{heading}</h3>\n<div class=\"plots\">");
        for p in plots.iter().filter(|p| belongs(&p.name)) {
            let _ = writeln!(
                out,
                "<figure id=\"n{}-{}\" title=\"{}\">",
                escape(&group.n),
                p.name,
                escape(&p.title)
            );
            out.push_str(&p.svg);
            out.push_str("\n</figure>\n");
        }
        out.push_str("</div>\n");
    }
    out.push_str("</section>\n");
    Ok(())
}
