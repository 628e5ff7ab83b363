//! The storm report: HTML page and SVG plots from the per-run result directories.

/// Writes `out` (report.html, SVGs inline) from every `<N>/<stack>/` under `root`; returns the
/// summary table as Markdown (one table per N) for the docs.
pub fn write(root: &std::path::Path, out: &std::path::Path) -> anyhow::Result<String> {
    let _ = (root, out);
    anyhow::bail!("report not built")
}

/// Writes the plots of `<root>/<N>/` as SVG files into `dir` (for docs/storm/), returns their names.
pub fn svg_files(
    root: &std::path::Path,
    n: &str,
    dir: &std::path::Path,
) -> anyhow::Result<Vec<String>> {
    let _ = (root, n, dir);
    anyhow::bail!("report not built")
}
