//! One simulated machine: its line of `machines.tsv` and its netboot chain
//! (firmware DHCP, boot file, iPXE DHCP, script, kernel, initrds,
//! phone-home), recorded stage by stage.

use std::{net::Ipv4Addr, sync::Arc};

use anyhow::{Context as _, bail};

use super::{
    Context,
    dhcp::{self, Answer, Schedule},
    http,
    record::{Event, Record, Stage},
    script::{self, Url},
    tftp,
};
use crate::{frame::Req, rng::Rng};

/// What a machine's firmware is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Bios,
    Uefi,
    UefiHttp,
    Arm64,
}

impl Class {
    /// Reads a `machines.tsv` class.
    pub fn parse(text: &str) -> Option<Class> {
        Some(match text {
            "bios" => Class::Bios,
            "uefi" => Class::Uefi,
            "uefi_http" => Class::UefiHttp,
            "arm64" => Class::Arm64,
            _ => return None,
        })
    }

    /// The name in `machines.tsv` and `machines.csv`.
    pub fn name(self) -> &'static str {
        match self {
            Class::Bios => "bios",
            Class::Uefi => "uefi",
            Class::UefiHttp => "uefi_http",
            Class::Arm64 => "arm64",
        }
    }

    /// Option 93 and option 60 as the firmware sends them.
    fn identity(self) -> (u16, &'static [u8]) {
        match self {
            Class::Bios => (0, b"PXEClient:Arch:00000:UNDI:002001"),
            Class::Uefi => (7, b"PXEClient:Arch:00007:UNDI:003016"),
            Class::Arm64 => (11, b"PXEClient:Arch:00011:UNDI:003001"),
            Class::UefiHttp => (16, b"HTTPClient:Arch:00016:UNDI:003001"),
        }
    }
}

/// One line of `machines.tsv`.
#[derive(Clone, Debug)]
pub struct Machine {
    pub mac: [u8; 6],
    pub class: Class,
    pub windowsize: u16,
}

/// Reads `machines.tsv`: `mac<TAB>class<TAB>windowsize` a line.
pub fn parse_machines(text: &str) -> anyhow::Result<Vec<Machine>> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            let fields: Vec<&str> = line.split('\t').collect();
            let [mac, class, windowsize] = fields[..] else {
                bail!("line {}: expected mac, class and windowsize", n + 1);
            };
            let mac = crate::loadgen::parse_macs(mac)
                .ok()
                .and_then(|macs| macs.first().copied())
                .with_context(|| format!("line {}: {mac:?} is not a MAC", n + 1))?;
            Ok(Machine {
                mac,
                class: Class::parse(class)
                    .with_context(|| format!("line {}: unknown class {class:?}", n + 1))?,
                windowsize: windowsize
                    .trim()
                    .parse()
                    .with_context(|| format!("line {}: bad windowsize {windowsize:?}", n + 1))?,
            })
        })
        .collect()
}

/// `02:57:...` as written in the output.
pub fn mac_text(mac: &[u8; 6]) -> String {
    mac.map(|b| format!("{b:02x}")).join(":")
}

/// A failed stage with its reason.
type Failure = (Stage, anyhow::Error);

trait At<T> {
    fn at(self, stage: Stage) -> Result<T, Failure>;
}

impl<T> At<T> for anyhow::Result<T> {
    fn at(self, stage: Stage) -> Result<T, Failure> {
        self.map_err(|err| (stage, err))
    }
}

/// Runs machine `index`'s chain, starting now; fills `record`.
pub async fn run(ctx: Arc<Context>, index: usize, machine: Machine, record: &mut Record) {
    if let Err((stage, err)) = chain(&ctx, index, &machine, record).await {
        record.failed = Some((stage, format!("{err:#}")));
    }
}

async fn chain(
    ctx: &Context,
    index: usize,
    machine: &Machine,
    record: &mut Record,
) -> Result<(), Failure> {
    let timeline = &ctx.timeline;
    let mut rng = Rng(ctx.seed ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let (arch, vendor) = machine.class.identity();
    let mut req = Req::discover(machine.mac);
    req.broadcast = true;
    req.giaddr = ctx.relay;
    req.arch = Some(arch);
    req.vendor = Some(vendor);
    if ctx.uuid {
        let mut uuid = vec![0u8; 17];
        uuid[11..].copy_from_slice(&machine.mac);
        req.extra.push((97, uuid));
    }
    req.extra.push((57, 1260u16.to_be_bytes().to_vec()));

    // Firmware DHCP.
    req.xid = dhcp::xid(ctx.seed, index, 0);
    let (_, ack) = dora(ctx, &mut req, dhcp::PXE, &mut rng, record, false)
        .await
        .at(Stage::Dhcp)?;
    let ip = dhcp::leased(&ack).at(Stage::Dhcp)?;
    let file = ack
        .bootfile
        .clone()
        .context("the ACK names no boot file")
        .at(Stage::Bootfile)?;

    // Sockets from here on: wait for room under the descriptor limit.
    let _permit = ctx
        .sockets
        .acquire()
        .await
        .context("socket limit closed")
        .at(Stage::Bootfile)?;
    if machine.class == Class::UefiHttp {
        let url = Url::parse(&file).at(Stage::Bootfile)?;
        get(ip, &url, false, timeline).await.at(Stage::Bootfile)?;
    } else {
        let server = if ack.siaddr.is_unspecified() {
            ack.server_id.unwrap_or(ctx.server)
        } else {
            ack.siaddr
        };
        // Firmware opens a new port for each session, so late answers to
        // the probe never reach the transfer.
        let mut probe = tftp::Client::bind(ip, server, timeline)
            .await
            .at(Stage::Bootfile)?;
        let probed = probe.probe(&file).await.context("tsize probe");
        record.tftp_retx = probe.retx;
        drop(probe);
        probed.at(Stage::Bootfile)?;
        let mut client = tftp::Client::bind(ip, server, timeline)
            .await
            .at(Stage::Bootfile)?;
        let result = client.fetch(&file, machine.windowsize).await;
        record.tftp_retx += client.retx;
        result.at(Stage::Bootfile)?;
    }
    record.bootfile = Some(timeline.now());

    // iPXE DHCP.
    req.xid = dhcp::xid(ctx.seed, index, 1);
    req.user_class = Some(ctx.user_class);
    req.opt175 = true;
    req.requested_ip = None;
    req.server_id = None;
    let (_, ack) = dora(ctx, &mut req, dhcp::IPXE, &mut rng, record, true)
        .await
        .at(Stage::IpxeDhcp)?;
    let ip = dhcp::leased(&ack).at(Stage::IpxeDhcp)?;
    let script_url = ack
        .bootfile
        .context("the iPXE ACK names no script")
        .and_then(|u| Url::parse(&u))
        .at(Stage::Script)?;

    let body = get(ip, &script_url, true, timeline)
        .await
        .at(Stage::Script)?;
    let text = String::from_utf8(body)
        .context("script is not UTF-8")
        .at(Stage::Script)?;
    let plan = script::parse(&text, &script_url).at(Stage::Script)?;
    record.script = Some(timeline.now());

    get(ip, &plan.kernel, false, timeline)
        .await
        .at(Stage::Kernel)?;
    record.kernel = Some(timeline.now());
    for initrd in &plan.initrds {
        get(ip, initrd, false, timeline).await.at(Stage::Initrd)?;
    }
    record.initrd = Some(timeline.now());

    let mut phone = script_url
        .join(&format!("/api/v1/hosts/{}/booted", mac_text(&machine.mac)))
        .at(Stage::PhoneHome)?;
    if let Some(token) = &plan.token {
        phone.path.push_str(&format!("?token={token}"));
    }
    if let Some(port) = ctx.phone_home_port {
        phone.addr.set_port(port);
        phone.authority = format!("{}:{port}", phone.addr.ip());
    }
    let response = http::request(ip, "POST", &phone, false, timeline)
        .await
        .at(Stage::PhoneHome)?;
    if !(200..300).contains(&response.status) {
        return Err((
            Stage::PhoneHome,
            anyhow::anyhow!("phone-home answered {}", response.status),
        ));
    }
    record.phone_home = Some(timeline.now());
    timeline.count(Event::Completed);
    Ok(())
}

/// A GET that must answer 2xx; returns the body when `keep`.
async fn get(
    ip: Ipv4Addr,
    url: &Url,
    keep: bool,
    timeline: &super::record::Timeline,
) -> anyhow::Result<Vec<u8>> {
    let response = http::request(ip, "GET", url, keep, timeline).await?;
    if !(200..300).contains(&response.status) {
        bail!("GET {} answered {}", url.path, response.status);
    }
    Ok(response.body)
}

/// DISCOVER→OFFER then REQUEST→ACK on `schedule`, each with its own waits,
/// run by the DHCP engine; records times (as the answers arrived) and send
/// counts (the iPXE ones with `ipxe`).
async fn dora(
    ctx: &Context,
    req: &mut Req,
    schedule: Schedule,
    rng: &mut Rng,
    record: &mut Record,
    ipxe: bool,
) -> anyhow::Result<(Answer, Answer)> {
    let waits = [schedule.draw(rng), schedule.draw(rng)];
    let done = ctx.dhcp.dora(req.clone(), waits).await;
    let (discover_tx, request_tx, ack_at) = if ipxe {
        (
            &mut record.ipxe_discover_tx,
            &mut record.ipxe_request_tx,
            &mut record.ipxe_ack,
        )
    } else {
        record.start = Some(done.started);
        (
            &mut record.discover_tx,
            &mut record.request_tx,
            &mut record.ack,
        )
    };
    *discover_tx = done.discover_tx;
    *request_tx = done.request_tx;
    let offer = done.offer.context("DISCOVER")?;
    if !ipxe {
        record.offer = Some(offer.at);
    }
    let ack = done.ack.context("no REQUEST sent")?.context("REQUEST")?;
    *ack_at = Some(ack.at);
    Ok((offer, ack))
}
