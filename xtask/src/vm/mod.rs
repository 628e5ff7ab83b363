//! Network boot with real firmware under QEMU: the guest (a Debian kernel
//! and a busybox initramfs that phones home), the VMs (SeaBIOS + iPXE ROM,
//! OVMF PXE, OVMF HTTP boot, over IPv4 or IPv6), and the boot lab that
//! runs `pxe-agent` on tap devices for them. Used by `cargo xtask demo` and
//! the `boot_vm` and `boot_vm6` tests.
//!
//! - [`guest`]: kernel, NIC modules and busybox-static from Debian packages,
//!   cached under `~/.cache/pxe-agent/guest/` (`cargo xtask setup` fills it);
//! - [`initramfs`]: the initramfs and the console markers its `/init` prints;
//! - [`qemu`]: starting a VM and following its serial console;
//! - [`bootlab`]: namespace, taps or bridge, radvd, the agent and its roots;
//! - [`signed`]: Debian's signed shim and grub for Secure Boot guests,
//!   cached under `~/.cache/pxe-agent/signed/`.

pub mod bootlab;
pub mod guest;
pub mod initramfs;
pub mod qemu;
pub mod signed;

pub use bootlab::{BootLab, BootLabConfig, Family, SERVER_IP, SERVER_IP6, SUBNET6, Wiring};
pub use qemu::{BootReport, BootSource, Firmware, Vm, VmSpec, wait_all};
