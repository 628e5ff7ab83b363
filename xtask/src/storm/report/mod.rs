//! The storm report: reads `<root>/<N>/<stack>/` result directories and
//! writes report.html (plots and summary tables) or the plots as SVG files.
//! Running the storm and writing the results is the storm command's.

mod data;
mod html;
mod plot;
mod stages;
mod table;

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::Context;

/// Writes `out` (report.html, SVGs inline) from every `<N>/<stack>/` under `root`; returns the
/// summary table as Markdown (one table per N) for the docs.
pub fn write(root: &Path, out: &Path) -> anyhow::Result<String> {
    let groups = data::load_all(root)?;
    let page = html::page(&groups)?;
    if let Some(parent) = out.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("failed to create {}", parent.display()))?;
    }
    fs::write(out, page).with_context(|| format!("failed to write {}", out.display()))?;
    let mut markdown = String::new();
    for group in &groups {
        let _ = writeln!(
            markdown,
            "### {} machines\n\n{}\n",
            group.n,
            html::setting(group)
        );
        for (label, error) in html::sim_errors(group) {
            let _ = writeln!(markdown, "{label}: simulator error: {error}\n");
        }
        markdown.push_str(&table::markdown(&table::rows(group)));
        markdown.push('\n');
        markdown.push_str(&stages::markdown(&stages::rows(group)));
        markdown.push('\n');
    }
    Ok(markdown)
}

/// Writes the plots of `<root>/<N>/` as SVG files into `dir` (for docs/storm/), returns their names.
pub fn svg_files(root: &Path, n: &str, dir: &Path) -> anyhow::Result<Vec<String>> {
    let group = data::load_group(root, n)?;
    fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let mut names = Vec::new();
    for p in plot::all(&group)? {
        let name = format!("storm-{n}-{}.svg", p.name);
        let path = dir.join(&name);
        fs::write(&path, &p.svg).with_context(|| format!("failed to write {}", path.display()))?;
        names.push(name);
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// Plots per N: six stage CDFs, five over time, three totals.
    const PLOTS_PER_N: usize = 16;

    /// A fresh directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("storm-report-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A synthetic machine: starts at `start`, then reaches `reached` of the
    /// eight stages (offer .. phone-home) `step` ms apart.
    struct Machine {
        start: u32,
        step: u32,
        reached: u32,
        failed: &'static str,
    }

    /// A synthetic stack run.
    struct Stack {
        name: &'static str,
        label: &'static str,
        machines: Vec<Machine>,
        retransmissions: u64,
        /// Cumulative server CPU ms at t = 0, 1, 2 s.
        server_cpu: [u32; 3],
        /// Simulator CPU ms at the same times.
        sim_cpu: [u32; 3],
        drops: &'static str,
    }

    fn machines(start_step: u32, step: u32, reached: &[(u32, &'static str)]) -> Vec<Machine> {
        (0..)
            .zip(reached)
            .map(|(i, &(reached, failed))| Machine {
                start: i * start_step,
                step,
                reached,
                failed,
            })
            .collect()
    }

    fn write_stack(root: &Path, n: &str, s: &Stack) {
        let dir = root.join(n).join(s.name);
        fs::create_dir_all(&dir).unwrap();
        let mut csv = String::from(
            "mac,class,windowsize,start_ms,offer_ms,ack_ms,bootfile_ms,ipxe_ack_ms,script_ms,\
             kernel_ms,initrd_ms,phone_home_ms,discover_tx,request_tx,ipxe_discover_tx,\
             ipxe_request_tx,tftp_retx,failed_stage,error\n",
        );
        for (i, m) in s.machines.iter().enumerate() {
            let stages: Vec<String> = (1..=8)
                .map(|k| {
                    if k <= m.reached {
                        format!("{}.000", m.start + k * m.step)
                    } else {
                        String::new()
                    }
                })
                .collect();
            let error = if m.failed.is_empty() { "" } else { "timed out" };
            csv.push_str(&format!(
                "02:57:00:00:00:{i:02x},bios,0,{}.000,{},1,1,1,1,0,{},{error}\n",
                m.start,
                stages.join(","),
                m.failed
            ));
        }
        fs::write(dir.join("machines.csv"), csv).unwrap();
        let mut timeline = String::from(
            "t_ms,sent_pkts,recv_pkts,dhcp_answers,retransmissions,completed,sim_cpu_ms\n",
        );
        let mut server = String::from("t_ms,cpu_ms,pss_kib\n");
        for (i, t) in [0, 1000, 2000].into_iter().enumerate() {
            timeline.push_str(&format!("{t},10,10,4,1,0,{}\n", s.sim_cpu[i]));
            server.push_str(&format!("{t},{},{}\n", s.server_cpu[i], 10240 * (i + 1)));
        }
        fs::write(dir.join("timeline.csv"), timeline).unwrap();
        fs::write(dir.join("server.csv"), server).unwrap();
        let completed = s.machines.iter().filter(|m| m.reached == 8).count();
        fs::write(
            dir.join("summary.json"),
            format!(
                r#"{{"machines":{},"completed":{completed},"failed_by_stage":{{}},"wall_ms":3000,
                "sim_cpu_ms":100,"sent_pkts":30,"recv_pkts":30,"retransmissions":{}}}"#,
                s.machines.len(),
                s.retransmissions
            ),
        )
        .unwrap();
        fs::write(
            dir.join("meta.json"),
            format!(
                r#"{{"stack":"{}","label":"{}","machines":{n},"spread_s":10,"mix":"bios",
                "windowsize_share":50,"bootfile_kib":100,"kernel_kib":1000,"initrd_kib":2000,
                "cpu":"Test CPU 9000","kernel":"6.18.0-test","date":"2026-12-02T13:00:00Z",
                "server_drops":{},"sim_error":null}}"#,
                s.name, s.label, s.drops
            ),
        )
        .unwrap();
    }

    const PXE_LABEL: &str = "pxe-agent";
    const KEA_LABEL: &str = "Kea + tftpd-hpa + nginx";
    const DNSMASQ_LABEL: &str = "dnsmasq + nginx";

    /// Two N values, three stacks each, with failures and empty cells.
    fn synthetic_tree(root: &Path) {
        let drops = r#"{"iface_rx_dropped":1,"udp_rcvbuf_errors":2,"udp_in_errors":2,"agent_storm_guard":4}"#;
        let no_guard = r#"{"iface_rx_dropped":0,"udp_rcvbuf_errors":5,"udp_in_errors":5,"agent_storm_guard":null}"#;
        let stack = |name, label, machines, retransmissions, drops| Stack {
            name,
            label,
            machines,
            retransmissions,
            server_cpu: [0, 200, 1000],
            sim_cpu: [0, 500, 1000],
            drops,
        };
        // N = 4: pxe-agent all booted by 400 + 8 * 100 ms; Kea by 400 + 8 *
        // 325 = 3000 ms (2.5 times); dnsmasq loses one machine in DHCP.
        let done = [(8, ""), (8, ""), (8, ""), (8, "")];
        let mut pxe = machines(100, 100, &done);
        pxe[3].start = 400;
        let mut kea = machines(100, 325, &done);
        kea[3].start = 400;
        let dnsmasq = machines(100, 1500, &[(8, ""), (0, "dhcp"), (8, ""), (8, "")]);
        write_stack(root, "4", &stack("pxe-agent", PXE_LABEL, pxe, 7, drops));
        write_stack(root, "4", &stack("kea", KEA_LABEL, kea, 12, no_guard));
        write_stack(
            root,
            "4",
            &stack("dnsmasq", DNSMASQ_LABEL, dnsmasq, 30, no_guard),
        );
        // N = 2: pxe-agent loses one machine after its kernel.
        let half = machines(0, 100, &[(8, ""), (6, "initrd")]);
        let both = || machines(0, 200, &[(8, ""), (8, "")]);
        write_stack(root, "2", &stack("pxe-agent", PXE_LABEL, half, 1, drops));
        write_stack(root, "2", &stack("kea", KEA_LABEL, both(), 2, no_guard));
        write_stack(
            root,
            "2",
            &stack("dnsmasq", DNSMASQ_LABEL, both(), 3, no_guard),
        );
    }

    #[test]
    fn report_has_a_plot_each_and_the_right_table() {
        let root = scratch("report");
        synthetic_tree(&root);
        let out = root.join("out").join("report.html");
        let markdown = write(&root, &out).unwrap();
        let html = fs::read_to_string(&out).unwrap();

        assert_eq!(html.matches("<svg").count(), 2 * PLOTS_PER_N);
        assert!(
            html.matches("<text").count() > 2 * PLOTS_PER_N,
            "plots carry text"
        );
        for fetched in ["<script", "<link", "src=", "@import", "url("] {
            assert!(!html.contains(fetched), "self-contained: {fetched}");
        }
        let n2 = html.find("<h2>2 machines</h2>").unwrap();
        let n4 = html.find("<h2>4 machines</h2>").unwrap();
        assert!(n2 < n4, "sections ascend by N");
        assert!(html.contains("Test CPU 9000") && html.contains("6.18.0-test"));
        assert!(html.contains("Kea + tftpd-hpa + nginx"));

        let row = |label: &str, n: &str| {
            let section = markdown
                .split("### ")
                .find(|s| s.starts_with(&format!("{n} machines")))
                .unwrap();
            section
                .lines()
                .find(|l| l.starts_with(&format!("| {label} |")))
                .unwrap()
                .to_owned()
        };
        // stack, machines, completed, failed, DHCP p50/p99/max, within 2 s,
        // all booted, ratio, 90 % booted, ratio, retransmissions, server CPU,
        // memory, sim CPU, drops, simulator drops.
        assert_eq!(
            row(PXE_LABEL, "4"),
            "| pxe-agent | 4 | 4 | 0 | 0.200 s | 0.200 s | 0.200 s | 100.0 % | 1.200 s | 1.00× | 1.200 s | 1.00× | 7 | 80 % | 30 MiB | 50 % | 7 | – |"
        );
        assert_eq!(
            row(KEA_LABEL, "4"),
            "| Kea + tftpd-hpa + nginx | 4 | 4 | 0 | 0.650 s | 0.650 s | 0.650 s | 100.0 % | 3.000 s | 2.50× | 3.000 s | 2.50× | 12 | 80 % | 30 MiB | 50 % | 5 | – |"
        );
        assert_eq!(
            row(DNSMASQ_LABEL, "4"),
            "| dnsmasq + nginx | 4 | 3 | dhcp 1 | 3.000 s | 3.000 s | 3.000 s | 0.0 % | not all (3 of 4) | – | – | – | 30 | 80 % | 30 MiB | 50 % | 5 | – |"
        );
        // Without pxe-agent's time there is no ratio.
        assert!(row(PXE_LABEL, "2").contains("| 1 | initrd 1 |"));
        assert!(row(PXE_LABEL, "2").contains("| not all (1 of 2) | – |"));
        assert!(row(KEA_LABEL, "2").contains("| 1.600 s | – |"));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn svg_files_writes_the_plots_of_one_n() {
        let root = scratch("svg");
        synthetic_tree(&root);
        let dir = root.join("svg");
        let names = svg_files(&root, "4", &dir).unwrap();
        assert_eq!(names.len(), PLOTS_PER_N);
        assert!(names.contains(&"storm-4-cdf-dhcp.svg".to_owned()));
        assert!(names.contains(&"storm-4-server-cpu.svg".to_owned()));
        for name in &names {
            let svg = fs::read_to_string(dir.join(name)).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
                "{name}"
            );
            for label in [PXE_LABEL, KEA_LABEL, DNSMASQ_LABEL] {
                assert!(svg.contains(label), "{name} names {label}");
            }
        }
        assert!(svg_files(&root, "5", &dir).is_err());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn malformed_csv_is_an_error_naming_file_and_line() {
        let root = scratch("malformed");
        synthetic_tree(&root);
        let path = root.join("4").join("kea").join("machines.csv");
        let text = fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines[2] = lines[2].replacen(",100.000,", ",zero,", 1);
        fs::write(&path, lines.join("\n")).unwrap();
        let err = format!("{:#}", write(&root, &root.join("report.html")).unwrap_err());
        assert!(err.contains(&format!("{}:3", path.display())), "{err}");
        assert!(err.contains("start_ms") && err.contains("zero"), "{err}");

        let server = root.join("2").join("dnsmasq").join("server.csv");
        fs::write(&server, "t_ms,cpu_ms,pss_kib\n0,1,2\n100,1\n").unwrap();
        let err = format!(
            "{:#}",
            svg_files(&root, "2", &root.join("svg")).unwrap_err()
        );
        assert!(err.contains(&format!("{}:3", server.display())), "{err}");

        let summary = root.join("2").join("kea").join("summary.json");
        fs::write(&summary, r#"{"machines":3,"retransmissions":0}"#).unwrap();
        let err = format!(
            "{:#}",
            svg_files(&root, "2", &root.join("svg")).unwrap_err()
        );
        assert!(err.contains(&summary.display().to_string()), "{err}");
        fs::remove_dir_all(&root).unwrap();
    }
}
