//! libFuzzer target: `pxe_agent::fuzzing::http_range` (see there for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pxe_agent::fuzzing::http_range(data));
