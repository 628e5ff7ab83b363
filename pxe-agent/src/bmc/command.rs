//! The chassis commands ipmi-rs lacks, as [`ipmi_rs::connection::IpmiCommand`]s:
//! Get Chassis Status, Chassis Control, and Set / Get System Boot Options
//! (IPMI 2.0 §28.2, §28.3, §28.12, §28.13). Also the Get Device ID mapping.
//!
//! Owns request bytes and response parsing only; sessions, retries and
//! read-back live in [`super::ipmi`]. Response parsers take the data after
//! the completion code, as ipmi-rs hands it to them, and never index past
//! what they checked.

use ipmi_rs::connection::{IpmiCommand, Message, NetFn};

use super::{BmcInfo, BootTarget, CommandName, PowerAction, PowerState};

const GET_CHASSIS_STATUS: u8 = 0x01;
const CHASSIS_CONTROL: u8 = 0x02;
const SET_SYSTEM_BOOT_OPTIONS: u8 = 0x08;
const GET_SYSTEM_BOOT_OPTIONS: u8 = 0x09;

/// A response too short or inconsistent for its command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed {cmd} response")]
pub struct DecodeError {
    pub cmd: CommandName,
}

/// Get Chassis Status (§28.2) response bytes 1-3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChassisStatus {
    /// Byte 1 bit 0: system power is on.
    pub power_on: bool,
    /// Byte 1 bit 1: power overload.
    pub overload: bool,
    /// Byte 1 bit 3: power fault.
    pub power_fault: bool,
    /// Byte 1 bits 6:5: power restore policy (0 off, 1 previous, 2 on, 3 unknown).
    pub restore_policy: u8,
    /// Byte 2: last power event bits.
    pub last_power_event: u8,
    /// Byte 3: misc chassis state bits.
    pub misc: u8,
}

impl ChassisStatus {
    pub fn power(&self) -> PowerState {
        if self.power_on {
            PowerState::On
        } else {
            PowerState::Off
        }
    }
}

pub struct GetChassisStatus;

impl From<GetChassisStatus> for Message {
    fn from(_: GetChassisStatus) -> Message {
        Message::new_request(NetFn::Chassis, GET_CHASSIS_STATUS, Vec::new())
    }
}

impl IpmiCommand for GetChassisStatus {
    type Output = ChassisStatus;
    type Error = DecodeError;

    fn parse_success_response(data: &[u8]) -> Result<ChassisStatus, DecodeError> {
        let &[power, last, misc, ..] = data else {
            return Err(DecodeError {
                cmd: CommandName::GetChassisStatus,
            });
        };
        Ok(ChassisStatus {
            power_on: power & 0x01 != 0,
            overload: power & 0x02 != 0,
            power_fault: power & 0x08 != 0,
            restore_policy: (power >> 5) & 0x03,
            last_power_event: last,
            misc,
        })
    }
}

pub struct ChassisControl(pub PowerAction);

impl ChassisControl {
    /// Data byte 1 bits 3:0 (§28.3).
    pub fn code(action: PowerAction) -> u8 {
        match action {
            PowerAction::Off => 0x00,
            PowerAction::On => 0x01,
            PowerAction::Cycle => 0x02,
            PowerAction::Reset => 0x03,
            PowerAction::SoftOff => 0x05,
        }
    }
}

impl From<ChassisControl> for Message {
    fn from(c: ChassisControl) -> Message {
        Message::new_request(
            NetFn::Chassis,
            CHASSIS_CONTROL,
            vec![ChassisControl::code(c.0)],
        )
    }
}

impl IpmiCommand for ChassisControl {
    type Output = ();
    type Error = DecodeError;

    fn parse_success_response(_: &[u8]) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// Boot device selector, boot flags data byte 2 bits 5:2 (§28.13, parameter 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootDevice {
    /// 0001b: force PXE.
    Pxe,
    /// 0010b: force boot from the default hard drive.
    Disk,
    /// 0110b: force boot into BIOS setup.
    BiosSetup,
    /// UEFI HTTP boot (Redfish `UefiHttp`). IPMI has no selector for it:
    /// over IPMI it is PXE (0001b) with the EFI boot type bit set, which
    /// UEFI firmware serves from the same network stack.
    UefiHttp,
}

impl BootDevice {
    pub fn selector(self) -> u8 {
        match self {
            BootDevice::Pxe => 0x1,
            BootDevice::Disk => 0x2,
            BootDevice::BiosSetup => 0x6,
            BootDevice::UefiHttp => 0x1,
        }
    }

    /// Whether IPMI must set the EFI boot type bit whatever was asked.
    pub fn needs_efi(self) -> bool {
        self == BootDevice::UefiHttp
    }

    pub fn from_selector(selector: u8) -> Option<BootDevice> {
        match selector {
            0x1 => Some(BootDevice::Pxe),
            0x2 => Some(BootDevice::Disk),
            0x6 => Some(BootDevice::BiosSetup),
            _ => None,
        }
    }
}

/// Boot flags (boot option parameter 5) as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootFlags {
    /// Byte 1 bit 7: the flags are valid (the BMC clears it after use or timeout).
    pub valid: bool,
    /// Byte 1 bit 6: applies to all future boots.
    pub persistent: bool,
    /// Byte 1 bit 5: EFI boot type.
    pub efi: bool,
    /// Byte 2 bits 5:2, raw (0 = no override; see [`BootDevice`]).
    pub selector: u8,
}

impl BootFlags {
    pub fn device(&self) -> Option<BootDevice> {
        BootDevice::from_selector(self.selector)
    }

    /// The five data bytes of parameter 5.
    pub fn encode(&self) -> [u8; 5] {
        let byte1 =
            u8::from(self.valid) << 7 | u8::from(self.persistent) << 6 | u8::from(self.efi) << 5;
        [byte1, (self.selector & 0x0f) << 2, 0, 0, 0]
    }

    pub fn decode(data: &[u8]) -> Option<BootFlags> {
        let &[b1, b2, ..] = data else { return None };
        Some(BootFlags {
            valid: b1 & 0x80 != 0,
            persistent: b1 & 0x40 != 0,
            efi: b1 & 0x20 != 0,
            selector: (b2 >> 2) & 0x0f,
        })
    }
}

impl From<BootTarget> for BootFlags {
    fn from(t: BootTarget) -> BootFlags {
        BootFlags {
            valid: true,
            persistent: t.persistent,
            efi: t.efi || t.device.needs_efi(),
            selector: t.device.selector(),
        }
    }
}

/// One boot option parameter to write (§28.12, Table 28-14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootParameter {
    /// Parameter 0, set-in-progress: `true` marks set in progress (01b),
    /// `false` set complete (00b).
    SetInProgress(bool),
    /// Parameter 3, BMC boot flag valid bit clearing: bit 3 keeps the valid
    /// bit past the 60-second Chassis Control timeout; the other bits keep it
    /// across resets (0 = default clearing).
    ValidBitClearing(u8),
    /// Parameter 4, boot info acknowledge: write mask, then data (a 1 says
    /// that boot initiator has not yet handled the boot info).
    InfoAcknowledge { mask: u8, data: u8 },
    /// Parameter 5, boot flags.
    BootFlags(BootFlags),
}

/// Bit 3 of parameter 3: don't clear the valid bit on the 60-second timeout.
pub const KEEP_VALID_PAST_TIMEOUT: u8 = 0x08;

pub struct SetSystemBootOptions(pub BootParameter);

impl SetSystemBootOptions {
    fn data(&self) -> Vec<u8> {
        // Byte 1 bit 7 = 0: mark the parameter valid / unlocked.
        match self.0 {
            BootParameter::SetInProgress(on) => vec![0x00, u8::from(on)],
            BootParameter::ValidBitClearing(bits) => vec![0x03, bits & 0x1f],
            BootParameter::InfoAcknowledge { mask, data } => vec![0x04, mask, data],
            BootParameter::BootFlags(flags) => {
                let mut v = vec![0x05];
                v.extend_from_slice(&flags.encode());
                v
            }
        }
    }
}

impl From<SetSystemBootOptions> for Message {
    fn from(c: SetSystemBootOptions) -> Message {
        Message::new_request(NetFn::Chassis, SET_SYSTEM_BOOT_OPTIONS, c.data())
    }
}

impl IpmiCommand for SetSystemBootOptions {
    type Output = ();
    type Error = DecodeError;

    fn parse_success_response(_: &[u8]) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// Get System Boot Options for parameter 5 (boot flags), no set or block selector.
pub struct GetBootFlags;

impl From<GetBootFlags> for Message {
    fn from(_: GetBootFlags) -> Message {
        Message::new_request(
            NetFn::Chassis,
            GET_SYSTEM_BOOT_OPTIONS,
            vec![0x05, 0x00, 0x00],
        )
    }
}

impl IpmiCommand for GetBootFlags {
    type Output = BootFlags;
    type Error = DecodeError;

    /// Response: parameter version, parameter selector (bit 7 = invalid /
    /// locked), then the parameter data.
    fn parse_success_response(data: &[u8]) -> Result<BootFlags, DecodeError> {
        let err = DecodeError {
            cmd: CommandName::GetSystemBootOptions,
        };
        match data {
            [_version, param, rest @ ..] if param & 0x7f == 0x05 && rest.len() >= 5 => {
                BootFlags::decode(rest).ok_or(err)
            }
            _ => Err(err),
        }
    }
}

/// Administrator privilege level (IPMI 2.0 Table 6-1).
pub const ADMINISTRATOR: u8 = 0x04;

/// Set Session Privilege Level (§22.18, App netfn 06h, cmd 3Bh); answers
/// the new level.
pub struct SetSessionPrivilege(pub u8);

impl From<SetSessionPrivilege> for Message {
    fn from(c: SetSessionPrivilege) -> Message {
        Message::new_request(NetFn::App, 0x3b, vec![c.0 & 0x0f])
    }
}

impl IpmiCommand for SetSessionPrivilege {
    type Output = u8;
    type Error = DecodeError;

    fn parse_success_response(data: &[u8]) -> Result<u8, DecodeError> {
        data.first().map(|l| l & 0x0f).ok_or(DecodeError {
            cmd: CommandName::SetSessionPrivilege,
        })
    }
}

/// Get Device ID, ipmi-rs's own command, reduced to [`BmcInfo`].
pub fn bmc_info(id: &ipmi_rs::app::DeviceId) -> BmcInfo {
    BmcInfo {
        device_id: id.device_id,
        device_revision: id.device_revision,
        firmware_major: id.major_fw_revision,
        firmware_minor: id.minor_fw_revision,
        ipmi_version: (id.major_version, id.minor_version),
        manufacturer_id: id.manufacturer_id,
        product_id: id.product_id,
        vendor: None,
        model: None,
        firmware_version: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(m: impl Into<Message>) -> (u8, u8, Vec<u8>) {
        let m = m.into();
        (m.netfn_raw(), m.cmd(), m.data().to_vec())
    }

    #[test]
    fn get_chassis_status_request_is_empty_chassis_01() {
        assert_eq!(wire(GetChassisStatus), (0x00, 0x01, vec![]));
    }

    #[test]
    fn chassis_status_decodes_power_bits() {
        let on = GetChassisStatus::parse_success_response(&[0x41, 0x10, 0x00]).unwrap();
        assert!(on.power_on && !on.overload && !on.power_fault);
        assert_eq!(on.restore_policy, 2);
        assert_eq!(on.last_power_event, 0x10);
        assert_eq!(on.power(), PowerState::On);
        let off = GetChassisStatus::parse_success_response(&[0x0a, 0, 0, 0x77]).unwrap();
        assert_eq!(off.power(), PowerState::Off);
        assert!(off.overload && off.power_fault);
    }

    #[test]
    fn truncated_chassis_status_is_an_error() {
        for short in [&[][..], &[0x01], &[0x01, 0x00]] {
            assert!(GetChassisStatus::parse_success_response(short).is_err());
        }
    }

    #[test]
    fn chassis_control_encodes_each_action() {
        let cases = [
            (PowerAction::Off, 0x00),
            (PowerAction::On, 0x01),
            (PowerAction::Cycle, 0x02),
            (PowerAction::Reset, 0x03),
            (PowerAction::SoftOff, 0x05),
        ];
        for (action, byte) in cases {
            assert_eq!(
                wire(ChassisControl(action)),
                (0x00, 0x02, vec![byte]),
                "{action:?}"
            );
        }
    }

    #[test]
    fn boot_flags_encode_valid_persistent_efi_and_device() {
        let flags = |device, persistent, efi| {
            BootFlags::from(BootTarget {
                device,
                persistent,
                efi,
            })
            .encode()
        };
        assert_eq!(flags(BootDevice::Pxe, false, false), [0x80, 0x04, 0, 0, 0]);
        assert_eq!(flags(BootDevice::Pxe, true, true), [0xe0, 0x04, 0, 0, 0]);
        assert_eq!(flags(BootDevice::Disk, true, false), [0xc0, 0x08, 0, 0, 0]);
        assert_eq!(
            flags(BootDevice::BiosSetup, false, true),
            [0xa0, 0x18, 0, 0, 0]
        );
    }

    #[test]
    fn uefi_http_is_efi_pxe_over_ipmi() {
        let target = BootTarget {
            device: BootDevice::UefiHttp,
            persistent: false,
            efi: false,
        };
        let flags = BootFlags::from(target);
        assert_eq!(flags.encode(), [0xa0, 0x04, 0, 0, 0]);
        assert_eq!(flags.device(), Some(BootDevice::Pxe));
    }

    #[test]
    fn set_boot_options_requests_carry_selector_and_data() {
        let set = |p| wire(SetSystemBootOptions(p));
        assert_eq!(
            set(BootParameter::SetInProgress(true)),
            (0x00, 0x08, vec![0x00, 0x01])
        );
        assert_eq!(
            set(BootParameter::SetInProgress(false)),
            (0x00, 0x08, vec![0x00, 0x00])
        );
        assert_eq!(
            set(BootParameter::ValidBitClearing(KEEP_VALID_PAST_TIMEOUT)),
            (0x00, 0x08, vec![0x03, 0x08])
        );
        assert_eq!(
            set(BootParameter::InfoAcknowledge {
                mask: 0x01,
                data: 0x01
            }),
            (0x00, 0x08, vec![0x04, 0x01, 0x01])
        );
        let efi_pxe = BootFlags {
            valid: true,
            persistent: false,
            efi: true,
            selector: 1,
        };
        assert_eq!(
            set(BootParameter::BootFlags(efi_pxe)),
            (0x00, 0x08, vec![0x05, 0xa0, 0x04, 0, 0, 0])
        );
    }

    #[test]
    fn get_boot_flags_request_selects_parameter_5() {
        assert_eq!(wire(GetBootFlags), (0x00, 0x09, vec![0x05, 0x00, 0x00]));
    }

    #[test]
    fn boot_flags_response_decodes_every_bit() {
        let got = GetBootFlags::parse_success_response(&[0x01, 0x05, 0xe0, 0x04, 0, 0, 0]).unwrap();
        assert_eq!(
            got,
            BootFlags {
                valid: true,
                persistent: true,
                efi: true,
                selector: 1
            }
        );
        assert_eq!(got.device(), Some(BootDevice::Pxe));
        let legacy_disk_once =
            GetBootFlags::parse_success_response(&[0x01, 0x05, 0x80, 0x08, 0, 0, 0]).unwrap();
        assert!(legacy_disk_once.valid && !legacy_disk_once.persistent && !legacy_disk_once.efi);
        assert_eq!(legacy_disk_once.device(), Some(BootDevice::Disk));
    }

    #[test]
    fn simulator_style_boot_flags_keep_only_the_device() {
        // ipmi_sim answers byte 1 = 0 whatever was set.
        let got = GetBootFlags::parse_success_response(&[0x01, 0x05, 0x00, 0x18, 0, 0, 0]).unwrap();
        assert!(!got.valid && !got.persistent && !got.efi);
        assert_eq!(got.device(), Some(BootDevice::BiosSetup));
    }

    #[test]
    fn boot_flags_response_for_another_parameter_or_truncated_is_an_error() {
        for bad in [
            &[][..],
            &[0x01],
            &[0x01, 0x05, 0x80, 0x04],
            &[0x01, 0x04, 0x80, 0x04, 0, 0, 0],
        ] {
            assert!(
                GetBootFlags::parse_success_response(bad).is_err(),
                "{bad:?}"
            );
        }
        // The locked bit (selector bit 7) does not change which parameter it is.
        assert!(GetBootFlags::parse_success_response(&[0x01, 0x85, 0x80, 0x04, 0, 0, 0]).is_ok());
    }

    #[test]
    fn set_session_privilege_asks_for_administrator() {
        assert_eq!(
            wire(SetSessionPrivilege(ADMINISTRATOR)),
            (0x06 << 2 >> 2, 0x3b, vec![0x04])
        );
        assert_eq!(
            SetSessionPrivilege::parse_success_response(&[0x04]),
            Ok(0x04)
        );
        assert!(SetSessionPrivilege::parse_success_response(&[]).is_err());
    }

    #[test]
    fn unknown_selectors_are_kept_raw() {
        let cdrom = BootFlags::decode(&[0x80, 0x05 << 2]).unwrap();
        assert_eq!(cdrom.selector, 5);
        assert_eq!(cdrom.device(), None);
    }
}
