//! The SVG plots of one N (plotters, SVG backend): completion-time CDFs per
//! stage, DHCP answers and retransmissions per second, totals per stack, and
//! server and simulator CPU and memory over time. Text is SVG `<text>`, so the
//! viewer picks the font. The numbers of the table live in `table`.

use anyhow::Context;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::data::{Group, Machine, Run, Tick, stack_rank};

const SIZE: (u32, u32) = (560, 340);
/// At most this many points per CDF curve, so 100,000 machines stay a small
/// SVG.
const CDF_POINTS: usize = 1000;

/// One plot: a file stem (unique within its N) and its SVG text.
#[derive(Debug)]
pub struct Plot {
    /// File stem, e.g. `cdf-dhcp`.
    pub name: String,
    /// The chart's title.
    pub title: String,
    /// The SVG document.
    pub svg: String,
}

/// A stage of the CDF plots: its name and when a machine completed it.
struct Stage {
    name: &'static str,
    title: &'static str,
    at: fn(&Machine) -> Option<f64>,
}

const STAGES: [Stage; 6] = [
    Stage {
        name: "dhcp",
        title: "DHCP (firmware ACK)",
        at: |m| m.ack_ms,
    },
    Stage {
        name: "bootfile",
        title: "boot file",
        at: |m| m.bootfile_ms,
    },
    Stage {
        name: "ipxe-dhcp",
        title: "iPXE DHCP (ACK)",
        at: |m| m.ipxe_ack_ms,
    },
    Stage {
        name: "script",
        title: "iPXE script",
        at: |m| m.script_ms,
    },
    Stage {
        name: "kernel-initrd",
        title: "kernel + initrd (the later)",
        at: kernel_and_initrd,
    },
    Stage {
        name: "phone-home",
        title: "phone-home",
        at: |m| m.phone_home_ms,
    },
];

/// The later of kernel and initrd; a machine that phoned home without an
/// initrd counts its kernel alone.
fn kernel_and_initrd(m: &Machine) -> Option<f64> {
    match (m.kernel_ms?, m.initrd_ms) {
        (k, Some(i)) => Some(k.max(i)),
        (k, None) => m.phone_home_ms.map(|_| k),
    }
}

/// The stack's fixed colour: pxe-agent, kea, dnsmasq, then others.
fn colour(stack: &str) -> RGBColor {
    const COLOURS: [RGBColor; 5] = [
        RGBColor(31, 119, 180),
        RGBColor(230, 110, 0),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(120, 120, 120),
    ];
    COLOURS[stack_rank(stack).min(COLOURS.len() - 1)]
}

/// A curve: the run's label, colour and points.
struct Curve<'a> {
    label: &'a str,
    colour: RGBColor,
    points: Vec<(f64, f64)>,
}

/// A per-run quantity plotted as one chart.
struct Metric<T> {
    /// File stem.
    name: &'static str,
    title: &'static str,
    /// The y axis.
    unit: &'static str,
    of: fn(&Run) -> T,
}

/// The charts over time: (s, value) per run.
const OVER_TIME: [Metric<Vec<(f64, f64)>>; 7] = [
    Metric {
        name: "dhcp-answers",
        title: "DHCP answers per second (OFFER + ACK)",
        unit: "answers/s",
        of: |r| per_second(&r.timeline, |t| t.dhcp_answers),
    },
    Metric {
        name: "retransmissions",
        title: "Retransmissions per second (DHCP + TFTP)",
        unit: "resends/s",
        of: |r| per_second(&r.timeline, |t| t.retransmissions),
    },
    Metric {
        name: "server-cpu",
        title: "Server CPU",
        unit: "% of one core",
        of: Run::server_cpu_percent,
    },
    Metric {
        name: "server-memory",
        title: "Server memory (PSS, all its processes)",
        unit: "MiB",
        of: |r| {
            r.server
                .iter()
                .map(|s| (s.t_ms / 1000.0, s.pss_kib / 1024.0))
                .collect()
        },
    },
    Metric {
        name: "sim-cpu",
        title: "Simulator CPU (saturated near 100 % per core)",
        unit: "% of one core",
        of: Run::sim_cpu_percent,
    },
    Metric {
        name: "sim-sent",
        title: "Simulator sends per second (datagrams + HTTP requests)",
        unit: "packets/s",
        of: |r| per_second(&r.timeline, |t| t.sent_pkts),
    },
    Metric {
        name: "sim-received",
        title: "Simulator receives per second (datagrams + HTTP responses)",
        unit: "packets/s",
        of: |r| per_second(&r.timeline, |t| t.recv_pkts),
    },
];

/// The bar charts: one total per run.
const TOTALS: [Metric<u64>; 3] = [
    Metric {
        name: "total-retransmissions",
        title: "Retransmissions (total)",
        unit: "resends",
        of: |r| r.summary.retransmissions,
    },
    Metric {
        name: "total-failed",
        title: "Failed machines",
        unit: "machines",
        of: |r| r.failed().count() as u64,
    },
    Metric {
        name: "total-drops",
        title: "Server drops (NIC, UDP buffers, storm guard)",
        unit: "packets",
        of: |r| r.meta.server_drops.total(),
    },
];

/// Every plot of `group`, in the order the page shows them.
pub fn all(group: &Group) -> anyhow::Result<Vec<Plot>> {
    let mut plots = Vec::new();
    for stage in &STAGES {
        let curves = group
            .runs
            .iter()
            .map(|run| curve(run, cdf(&run.machines, stage.at)))
            .collect();
        let title = format!("Completed: {}", stage.title);
        let svg = lines(
            &title,
            "s since the machine's first DISCOVER",
            "share of machines",
            curves,
            Some(1.0),
            SeriesLabelPosition::LowerRight,
        )?;
        plots.push(Plot {
            name: format!("cdf-{}", stage.name),
            title,
            svg,
        });
    }
    for m in &OVER_TIME {
        let curves = group
            .runs
            .iter()
            .map(|run| curve(run, (m.of)(run)))
            .collect();
        let svg = lines(
            m.title,
            "s since start",
            m.unit,
            curves,
            None,
            SeriesLabelPosition::UpperRight,
        )?;
        plots.push(Plot {
            name: m.name.to_owned(),
            title: m.title.to_owned(),
            svg,
        });
    }
    for m in &TOTALS {
        let bars: Vec<_> = group.runs.iter().map(|r| (r, (m.of)(r))).collect();
        plots.push(Plot {
            name: m.name.to_owned(),
            title: m.title.to_owned(),
            svg: bars_svg(m.title, m.unit, &bars)?,
        });
    }
    Ok(plots)
}

fn curve(run: &Run, points: Vec<(f64, f64)>) -> Curve<'_> {
    Curve {
        label: run.label(),
        colour: colour(&run.stack),
        points,
    }
}

/// The step CDF (s, share of all machines) of the stage time minus the
/// machine's start; machines that never got there keep it below 1.
fn cdf(machines: &[Machine], at: fn(&Machine) -> Option<f64>) -> Vec<(f64, f64)> {
    let mut times: Vec<f64> = machines
        .iter()
        .filter_map(|m| Some((at(m)? - m.start_ms?) / 1000.0))
        .collect();
    times.sort_by(f64::total_cmp);
    let total = machines.len().max(1) as f64;
    let step = times.len().div_ceil(CDF_POINTS).max(1);
    let mut points = vec![(0.0, 0.0)];
    let mut last = 0.0;
    for (i, &t) in times.iter().enumerate() {
        if (i + 1) % step == 0 || i + 1 == times.len() {
            points.push((t, last));
            last = (i + 1) as f64 / total;
            points.push((t, last));
        }
    }
    points
}

/// The 100 ms bucket counts summed per whole second (a rate per second), at
/// the second's start.
fn per_second(timeline: &[Tick], value: fn(&Tick) -> f64) -> Vec<(f64, f64)> {
    let mut seconds: Vec<(f64, f64)> = Vec::new();
    for t in timeline {
        let second = (t.t_ms / 1000.0).floor();
        match seconds.last_mut() {
            Some(last) if last.0 == second => last.1 += value(t),
            _ => seconds.push((second, value(t))),
        }
    }
    seconds
}

/// An axis label with as many decimals as the axis' range needs.
fn tick(value: f64, max: f64) -> String {
    if max >= 10.0 {
        format!("{value:.0}")
    } else if max >= 1.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// A line chart; `y_max` fixes the y range (CDFs), else it fits the data.
fn lines(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    curves: Vec<Curve>,
    y_max: Option<f64>,
    legend: SeriesLabelPosition,
) -> anyhow::Result<String> {
    let all = curves.iter().flat_map(|c| c.points.iter());
    let x_max = all.clone().map(|p| p.0).fold(0.0, f64::max);
    // Headroom above the data for the legend.
    let y_max = y_max.unwrap_or_else(|| all.map(|p| p.1).fold(0.0, f64::max) * 1.4);
    let x_max = if x_max > 0.0 { x_max * 1.05 } else { 1.0 };
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).context("failed to draw")?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .context("failed to lay out the chart")?;
        mesh(&mut chart, x_desc, y_desc, (x_max, y_max))?;
        // A CDF's median: a grey line across at half the machines, and a
        // dot where each stack's curve crosses it.
        if y_max == 1.0 && !curves.is_empty() {
            chart
                .draw_series(LineSeries::new(
                    [(0.0, 0.5), (x_max, 0.5)],
                    BLACK.mix(0.35).stroke_width(1),
                ))
                .context("failed to draw the median line")?
                .label("median (50 %)")
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.35).stroke_width(1))
                });
            for c in &curves {
                if let Some(&(t, _)) = c.points.iter().find(|p| p.1 >= 0.5) {
                    chart
                        .draw_series([Circle::new((t, 0.5), 4, c.colour.filled())])
                        .context("failed to mark a median")?;
                }
            }
        }
        for c in &curves {
            let colour = c.colour;
            chart
                .draw_series(LineSeries::new(
                    c.points.iter().copied(),
                    colour.stroke_width(2),
                ))
                .context("failed to draw a curve")?
                .label(c.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(legend)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 13))
            .draw()
            .context("failed to draw the legend")?;
        root.present().context("failed to finish the SVG")?;
    }
    Ok(svg)
}

fn mesh(
    chart: &mut ChartContext<SVGBackend, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    x_desc: &str,
    y_desc: &str,
    (x_max, y_max): (f64, f64),
) -> anyhow::Result<()> {
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| tick(*v, x_max))
        .y_label_formatter(&|v| tick(*v, y_max))
        .light_line_style(BLACK.mix(0.05))
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 13))
        .draw()
        .context("failed to draw the axes")
}

/// One bar per stack, its value written above it.
fn bars_svg(title: &str, unit: &str, bars: &[(&Run, u64)]) -> anyhow::Result<String> {
    let y_max = bars.iter().map(|b| b.1).max().unwrap_or(0).max(1) as f64 * 1.2;
    let labels: Vec<&str> = bars.iter().map(|b| b.0.label()).collect();
    let label = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) => usize::try_from(*i)
            .ok()
            .and_then(|i| labels.get(i))
            .map_or(String::new(), |l| l.to_string()),
        _ => String::new(),
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).context("failed to draw")?;
        let count = i32::try_from(bars.len()).context("too many stacks")?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((0..(count - 1).max(0)).into_segmented(), 0.0..y_max)
            .context("failed to lay out the chart")?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(unit)
            .axis_desc_style(("sans-serif", 13))
            .x_label_formatter(&label)
            .y_label_formatter(&|v| tick(*v, y_max))
            .light_line_style(BLACK.mix(0.05))
            .label_style(("sans-serif", 12))
            .draw()
            .context("failed to draw the axes")?;
        for (i, (run, value)) in (0..).zip(bars) {
            let v = *value as f64;
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), v),
                ],
                colour(&run.stack).filled(),
            );
            bar.set_margin(0, 0, 25, 25);
            chart.draw_series([bar]).context("failed to draw a bar")?;
            let style = ("sans-serif", 13)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            chart
                .draw_series([Text::new(
                    value.to_string(),
                    (SegmentValue::CenterOf(i), v),
                    style,
                )])
                .context("failed to draw a label")?;
        }
        root.present().context("failed to finish the SVG")?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(start: f64, ack: Option<f64>) -> Machine {
        Machine {
            start_ms: Some(start),
            ack_ms: ack,
            ..Machine::default()
        }
    }

    #[test]
    fn cdf_of_machines_that_never_got_there_stays_below_one() {
        let machines = [
            machine(0.0, Some(500.0)),
            machine(1000.0, Some(3000.0)),
            machine(0.0, None),
            machine(0.0, Some(1000.0)),
        ];
        let points = cdf(&machines, |m| m.ack_ms);
        assert_eq!(points.first(), Some(&(0.0, 0.0)));
        assert_eq!(points.last(), Some(&(2.0, 0.75)));
        assert!(points.contains(&(0.5, 0.25)) && points.contains(&(1.0, 0.5)));
        assert!(
            points
                .windows(2)
                .all(|w| w[1].0 >= w[0].0 && w[1].1 >= w[0].1)
        );
    }

    #[test]
    fn cdf_of_many_machines_is_thinned_but_ends_at_the_last() {
        let machines: Vec<_> = (0..10_000)
            .map(|i| machine(0.0, Some(f64::from(i))))
            .collect();
        let points = cdf(&machines, |m| m.ack_ms);
        assert!(points.len() <= 2 * CDF_POINTS + 1, "{}", points.len());
        assert_eq!(points.last(), Some(&(9.999, 1.0)));
    }

    #[test]
    fn buckets_add_up_per_second() {
        let tick = |t_ms, dhcp_answers| Tick {
            t_ms,
            sent_pkts: 0.0,
            recv_pkts: 0.0,
            dhcp_answers,
            retransmissions: 0.0,
            sim_cpu_ms: 0.0,
        };
        let timeline = [tick(0.0, 1.0), tick(900.0, 2.0), tick(1000.0, 5.0)];
        assert_eq!(
            per_second(&timeline, |t| t.dhcp_answers),
            [(0.0, 3.0), (1.0, 5.0)]
        );
    }
}
