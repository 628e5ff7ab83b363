//! `BPF_PROG_TEST_RUN` against a running agent's own program: the program
//! an agent started with `--pin-dir` pinned, run on the maps it fills, for
//! one of its hosts. `cargo xtask bench scale` times replies this way at
//! each fleet size, so the time includes the lookups in maps of that size.
//!
//! Owns the class of the timed client and the OFFER-then-ACK sequence; the
//! timing loop is [`crate::fixture::time_per_run`].

use std::path::Path;

use aya::programs::{TestRun as _, TestRunOptions, Xdp};
use aya_obj::programs::XdpAttachType;

use super::{DHCPACK, DHCPOFFER, KernelTime, parse_answer};
use crate::{
    fixture::{XDP_TX, time_per_run},
    frame::Req,
};

/// The boot class the timed client asks as (option 93 and vendor class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Bios,
    Uefi,
    UefiArm64,
    Http,
}

impl Class {
    /// `bios`, `uefi`, `uefi_arm64` or `http`, as the inventory names them.
    pub fn parse(text: &str) -> Option<Class> {
        Some(match text {
            "bios" => Class::Bios,
            "uefi" => Class::Uefi,
            "uefi_arm64" => Class::UefiArm64,
            "http" => Class::Http,
            _ => return None,
        })
    }

    /// A broadcast DISCOVER of this class from `mac`.
    fn discover(self, mac: [u8; 6]) -> Req {
        let req = Req::discover(mac);
        let mut req = match self {
            Class::Bios => req.pxe(0),
            Class::Uefi => req.pxe(7),
            Class::UefiArm64 => req.pxe(11),
            Class::Http => req.http(),
        };
        req.broadcast = true;
        req
    }
}

/// Loads the program pinned at `dir/program` (an interface's directory
/// under the agent's `--pin-dir`) and times `runs` runs each of a DISCOVER
/// from `mac` and of the REQUEST that takes the OFFER it answers with.
/// Fails, rather than times a pass, when either is not answered.
pub fn kernel_time_pinned(
    dir: &Path,
    mac: [u8; 6],
    class: Class,
    runs: u32,
) -> Result<KernelTime, String> {
    let path = dir.join(pxe_agent::xdp::pin::PROGRAM);
    let program = Xdp::from_pin(&path, XdpAttachType::Interface).map_err(|err| {
        format!(
            "failed to load the program pinned at {}: {err}",
            path.display()
        )
    })?;
    let mut req = class.discover(mac);
    let discover = req.frame();
    let offer = answer(&program, &discover, DHCPOFFER, "DISCOVER")?;
    req = req.request();
    req.requested_ip = Some(offer.yiaddr);
    req.server_id = Some(offer.server_id);
    let request = req.frame();
    answer(&program, &request, DHCPACK, "REQUEST")?;
    Ok(KernelTime {
        runs,
        offer: time_per_run(&program, &discover, runs),
        ack: time_per_run(&program, &request, runs),
        harness: super::harness_cost(runs)?,
    })
}

/// One run of `frame`: the answer, if the program sent one of `msg_type`.
fn answer(program: &Xdp, frame: &[u8], msg_type: u8, what: &str) -> Result<super::Answer, String> {
    let mut out = vec![0u8; 4096];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.data_out = Some(&mut out);
    let res = program
        .test_run(opts)
        .map_err(|err| format!("BPF_PROG_TEST_RUN failed: {err}"))?;
    if res.return_value != XDP_TX {
        return Err(format!(
            "the program did not answer the {what} (XDP action {}): is the MAC in the inventory?",
            res.return_value
        ));
    }
    out.truncate(res.data_size_out as usize);
    parse_answer(&out)
        .filter(|a| a.msg_type == msg_type)
        .ok_or_else(|| {
            format!("the program's answer to the {what} is not a DHCP message type {msg_type}")
        })
}
