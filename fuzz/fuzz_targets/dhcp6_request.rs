//! libFuzzer target: `pxe_agent::fuzzing::dhcp6_request` (see there for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pxe_agent::fuzzing::dhcp6_request(data));
