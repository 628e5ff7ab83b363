//! libFuzzer target: `pxe_agent::fuzzing::ipxe_script` (see there for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pxe_agent::fuzzing::ipxe_script(data));
