//! Privileged integration tests of the fast path: the real XDP program in the
//! kernel through `BPF_PROG_TEST_RUN`, and on veth pairs in network
//! namespaces with real DHCP clients. Run as root by `cargo xtask test`.

pub mod agent;
pub mod bmc_lab;
pub mod bmc_sim;
pub mod browser;
pub mod certs;
pub mod fixture;
pub mod frame;
pub mod kube_api;
pub mod loadgen;
pub mod mount;
pub mod podman;
pub mod raw;
pub mod redfish_fixture;
pub mod redfish_lab;
pub mod rng;
pub mod storm;

#[cfg(test)]
mod api_access;
#[cfg(test)]
mod api_kube_auth;
#[cfg(test)]
mod api_tls;
#[cfg(test)]
mod bmc;
#[cfg(test)]
mod boot_vm;
#[cfg(test)]
mod boot_vm6;
#[cfg(test)]
mod dhcp6;
#[cfg(test)]
mod differential;
#[cfg(test)]
mod e2e;
#[cfg(test)]
mod faults;
#[cfg(test)]
mod fleet_page;
#[cfg(test)]
mod flood;
#[cfg(test)]
mod fuzz_seeds;
#[cfg(test)]
mod hostile;
#[cfg(test)]
mod hostile6;
#[cfg(test)]
mod http_boot;
#[cfg(test)]
mod image;
#[cfg(test)]
mod import;
#[cfg(test)]
mod installed_phone_home;
#[cfg(test)]
mod kube;
#[cfg(test)]
mod lease_import;
#[cfg(test)]
mod manifests;
#[cfg(test)]
mod monitoring;
#[cfg(test)]
mod netboot;
#[cfg(test)]
mod nics;
#[cfg(test)]
mod oob;
#[cfg(test)]
mod package;
#[cfg(test)]
mod peers;
#[cfg(test)]
mod peers_oob;
#[cfg(test)]
mod peers_vm;
#[cfg(test)]
mod persistence;
#[cfg(test)]
mod phone_home;
#[cfg(test)]
mod pool6;
#[cfg(test)]
mod proxy;
#[cfg(test)]
mod recovery_vm;
#[cfg(test)]
mod redfish;
#[cfg(test)]
mod redfish_fallback;
#[cfg(test)]
mod relay;
#[cfg(test)]
mod reload;
#[cfg(test)]
mod restart;
#[cfg(test)]
mod scale;
#[cfg(test)]
mod secure_boot;
#[cfg(test)]
mod sequence;
#[cfg(test)]
mod slow_path;
#[cfg(test)]
mod storm_smoke;
#[cfg(test)]
mod tftp;
#[cfg(test)]
mod trace;
#[cfg(test)]
mod turns;
#[cfg(test)]
mod vlan;
#[cfg(test)]
mod xdp_events;
#[cfg(test)]
mod xdp_mutated;
#[cfg(test)]
mod xdp_program;
