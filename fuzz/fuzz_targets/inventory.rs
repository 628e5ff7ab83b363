//! libFuzzer target: `pxe_agent::fuzzing::inventory` (see there for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pxe_agent::fuzzing::inventory(data));
