//! Test certificates made with the `openssl` CLI: a CA and server
//! certificates for 127.0.0.1 it signs, for the TLS tests of the agent's
//! API and of Redfish BMCs.

use std::{fs, path::Path, process::Command};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (is it installed? `cargo xtask setup`)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, `<ca>.pem` and `<ca>.key`, in `dir`.
pub fn make_ca(dir: &Path, ca: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN=pxe-agent test API CA {ca}"),
        ],
    );
}

/// A server certificate for 127.0.0.1 signed by `ca` with serial
/// `serial` (hex): `<name>.crt` (the certificate, then the CA, as a
/// chain) and `<name>.key`.
pub fn make_server(dir: &Path, ca: &str, name: &str, serial: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            "/CN=pxe-agent api",
        ],
    );
    fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-set_serial",
            &format!("0x{serial}"),
            "-out",
            &format!("{name}.leaf"),
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    let chain = fs::read_to_string(dir.join(format!("{name}.leaf"))).expect("leaf")
        + &fs::read_to_string(dir.join(format!("{ca}.pem"))).expect("ca");
    fs::write(dir.join(format!("{name}.crt")), chain).expect("write chain");
}
