//! `pxe-agent bmc`: the power, boot-device and info subcommands, each
//! turned into the out-of-band operation it asks for.

use std::process::ExitCode;

use clap::Subcommand;
use pxe_agent::{
    bmc::BootTarget,
    control::{self, Op},
};

use super::oob::{Select, oob};

#[derive(Subcommand)]
pub enum BmcCommand {
    /// Power state or action.
    Power {
        /// Read the power state, or the power action to take.
        #[arg(value_enum)]
        action: PowerArg,
        /// Hosts by name or MAC (or select them with --all or --label).
        #[arg(value_name = "HOST")]
        hosts: Vec<String>,
        #[command(flatten)]
        select: Select,
    },
    /// Set the boot device (read back before answering).
    Bootdev {
        /// The boot device.
        #[arg(value_enum)]
        device: DeviceArg,
        /// For all future boots, not only the next one.
        #[arg(long)]
        persistent: bool,
        /// Boot in EFI mode.
        #[arg(long)]
        efi: bool,
        /// Hosts by name or MAC (or select them with --all or --label).
        #[arg(value_name = "HOST")]
        hosts: Vec<String>,
        #[command(flatten)]
        select: Select,
    },
    /// The BMC's device id, the chassis power and the boot device.
    Info {
        /// Hosts by name or MAC (or select them with --all or --label).
        #[arg(value_name = "HOST")]
        hosts: Vec<String>,
        #[command(flatten)]
        select: Select,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum PowerArg {
    Status,
    On,
    Off,
    Cycle,
    Reset,
    Soft,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum DeviceArg {
    Pxe,
    Disk,
    Bios,
    /// UEFI HTTP boot (Redfish UefiHttp; EFI PXE over IPMI).
    Http,
}

/// `pxe-agent bmc`: the operation the subcommand names, on the hosts it
/// selects.
pub fn bmc(command: BmcCommand) -> anyhow::Result<ExitCode> {
    let (op, hosts, select) = match command {
        BmcCommand::Power {
            action,
            hosts,
            select,
        } => {
            let name = match action {
                PowerArg::Status => "status",
                PowerArg::On => "on",
                PowerArg::Off => "off",
                PowerArg::Cycle => "cycle",
                PowerArg::Reset => "reset",
                PowerArg::Soft => "soft",
            };
            let op = control::parse_power(name).expect("every power argument parses");
            (op, hosts, select)
        }
        BmcCommand::Bootdev {
            device,
            persistent,
            efi,
            hosts,
            select,
        } => {
            let name = match device {
                DeviceArg::Pxe => "pxe",
                DeviceArg::Disk => "disk",
                DeviceArg::Bios => "bios",
                DeviceArg::Http => "http",
            };
            let device = control::parse_device(name).expect("every device parses");
            (
                Op::BootDevice(BootTarget {
                    device,
                    persistent,
                    efi,
                }),
                hosts,
                select,
            )
        }
        BmcCommand::Info { hosts, select } => (Op::Info, hosts, select),
    };
    oob(op, hosts, &select)
}
