//! `pxe-agent check`: an inventory file validated and compiled as `run`
//! would, without running.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::ExitCode,
};

use pxe_agent::{
    dhcp::Server,
    inventory::{self, LoadError},
    rollout,
    xdp::Capacity,
};

/// `pxe-agent check FILE`: one line saying what it compiles to, or the
/// problems found (and a failure).
pub fn check(
    file: &Path,
    server_ip: Option<Ipv4Addr>,
    map_capacity: Option<u32>,
) -> anyhow::Result<ExitCode> {
    let server = Server {
        ip: server_ip.unwrap_or(Ipv4Addr::BROADCAST),
        mac: [0; 6],
    };
    let checked = rollout::prepare(file, &server, inventory::DEFAULT_HTTP_PORT).and_then(
        |(inv, compiled)| {
            let capacity = Capacity::for_inventory([&compiled], map_capacity);
            capacity
                .fits(&compiled, inv.hosts.len())
                .map_err(|problem| LoadError::Invalid {
                    path: PathBuf::from(file),
                    problems: vec![problem],
                })?;
            Ok((inv, compiled, capacity))
        },
    );
    match checked {
        Ok((inv, compiled, capacity)) => {
            println!(
                "{}: ok, {} hosts, {} compiled replies sharing {} bodies, \
                 maps for {} host entries",
                file.display(),
                inv.hosts.len(),
                compiled.replies(),
                compiled.bodies.len(),
                capacity.hosts
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
