//! The stage table of one N: per stack, the time since the storm began at
//! which 10 %, 50 %, 90 % and 100 % of all machines had reached each
//! stage ("never" where fewer did), and how many had their script within
//! a second of their boot file. The median says when the typical machine
//! of a rack is up, the 100 % when the last one is.

use super::data::{Group, Machine, Run};
use super::table;

/// The shares of all machines the table gives a time for.
pub const SHARES: [f64; 4] = [0.1, 0.5, 0.9, 1.0];

/// A script this soon after the boot file counts as not queued behind
/// other machines' transfers.
const SCRIPT_WITHIN_MS: f64 = 1000.0;

/// When a machine reached a stage, if it did.
type At = fn(&Machine) -> Option<f64>;

/// The stages, in boot order: column title and the machine's time.
const STAGES: [(&str, At); 6] = [
    ("DHCP", |m| m.ack_ms),
    ("boot file", |m| m.bootfile_ms),
    ("script", |m| m.script_ms),
    ("kernel", |m| m.kernel_ms),
    ("initrd", |m| m.initrd_ms),
    ("phone-home", |m| m.phone_home_ms),
];

/// One stack's row: per stage, the times (ms since t0) at [`SHARES`].
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub label: String,
    pub times: [[Option<f64>; SHARES.len()]; STAGES.len()],
    /// Machines with their script within [`SCRIPT_WITHIN_MS`] of their
    /// boot file, and all machines.
    pub script_soon: (usize, usize),
}

/// The time by which `share` of all `machines` had reached the stage, or
/// `None` if fewer ever did.
pub fn reached(machines: &[Machine], at: At, share: f64) -> Option<f64> {
    let mut times: Vec<f64> = machines.iter().filter_map(at).collect();
    times.sort_by(f64::total_cmp);
    let need = ((share * machines.len() as f64).ceil() as usize).max(1);
    times.get(need - 1).copied()
}

fn row(run: &Run) -> Row {
    let m = &run.machines;
    let script_soon = m
        .iter()
        .filter(|m| matches!((m.bootfile_ms, m.script_ms), (Some(b), Some(s)) if s - b <= SCRIPT_WITHIN_MS))
        .count();
    Row {
        label: run.label().to_owned(),
        times: STAGES.map(|(_, at)| SHARES.map(|share| reached(m, at, share))),
        script_soon: (script_soon, m.len()),
    }
}

pub fn rows(group: &Group) -> Vec<Row> {
    group.runs.iter().map(row).collect()
}

fn header() -> Vec<String> {
    let mut h = vec!["stack".to_owned()];
    h.extend(
        STAGES
            .iter()
            .map(|(name, _)| format!("{name} (10/50/90/100 %)")),
    );
    h.push(format!(
        "script within {} s of boot file",
        SCRIPT_WITHIN_MS / 1000.0
    ));
    h
}

impl Row {
    fn cells(&self) -> Vec<String> {
        let mut cells = vec![self.label.clone()];
        cells.extend(self.times.iter().map(|t| {
            t.iter()
                .map(|v| v.map_or("never".to_owned(), |ms| format!("{:.1}", ms / 1000.0)))
                .collect::<Vec<_>>()
                .join(" / ")
                + " s"
        }));
        cells.push(format!("{} of {}", self.script_soon.0, self.script_soon.1));
        cells
    }
}

/// The table as Markdown.
pub fn markdown(rows: &[Row]) -> String {
    table::markdown_of(&header(), rows.iter().map(Row::cells))
}

/// The table as HTML.
pub fn html(rows: &[Row]) -> String {
    table::html_of(&header(), rows.iter().map(Row::cells))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(bootfile: f64, script: f64, phone_home: Option<f64>) -> Machine {
        Machine {
            start_ms: Some(0.0),
            ack_ms: Some(100.0),
            bootfile_ms: Some(bootfile),
            script_ms: Some(script),
            phone_home_ms: phone_home,
            ..Machine::default()
        }
    }

    #[test]
    fn shares_count_every_machine_and_never_when_too_few_got_there() {
        let m: Vec<Machine> = (1..=10)
            .map(|i| {
                let t = f64::from(i) * 1000.0;
                machine(t, t + 500.0, (i <= 8).then_some(t + 2000.0))
            })
            .collect();
        let at = |m: &Machine| m.phone_home_ms;
        assert_eq!(reached(&m, at, 0.1), Some(3000.0));
        assert_eq!(reached(&m, at, 0.5), Some(7000.0));
        assert_eq!(reached(&m, at, 0.9), None, "8 of 10 phoned home");
        assert_eq!(reached(&m, at, 1.0), None);
        let run_row = Row {
            label: "x".into(),
            times: STAGES.map(|(_, at)| SHARES.map(|s| reached(&m, at, s))),
            script_soon: (10, 10),
        };
        let text = markdown(&[run_row]);
        assert!(
            text.contains("| 3.0 / 7.0 / never / never s | 10 of 10 |"),
            "{text}"
        );
        assert!(text.contains("| 1.5 / 5.5 / 9.5 / 10.5 s |"), "{text}");
    }
}
