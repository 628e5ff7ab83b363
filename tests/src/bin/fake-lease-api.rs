//! `fake-lease-api [ADDR]`: the Lease-only fake of the Kubernetes API
//! (`pxe_tests::lease_api`) on its own, listening on ADDR (default
//! 127.0.0.1:0) and printing the bound address on stdout.

use std::net::TcpListener;

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = TcpListener::bind(&addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    let api = pxe_tests::lease_api::LeaseApi::serve(listener).expect("serve");
    println!("{}", api.addr());
    loop {
        std::thread::park();
    }
}
