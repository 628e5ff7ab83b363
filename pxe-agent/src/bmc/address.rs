//! BMC addresses in Metal3's `BareMetalHost` format: `ipmi://host[:port]`
//! (or a bare `host[:port]`, which Metal3 also reads as IPMI) and the
//! `redfish://` family: `redfish://` and `redfish+https://` (HTTPS, port
//! 443), `redfish+http://` (HTTP, port 80) and vendor variants such as
//! `idrac-redfish://` (HTTPS, spoken to as plain Redfish), each with an
//! optional system path `/redfish/v1/Systems/ID`.
//!
//! Owns parsing only; it resolves no names and opens no sockets.

use std::{fmt, str::FromStr};

/// The UDP port of RMCP / RMCP+ (IPMI 2.0 §13.1).
pub const IPMI_DEFAULT_PORT: u16 = 623;
/// The prefix every Redfish resource path has (DSP0266 §6.1).
pub const REDFISH_ROOT: &str = "/redfish/v1";

/// Where a host's BMC is and which driver speaks to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BmcAddress {
    /// IPMI 2.0 over RMCP+ (lanplus).
    Ipmi { host: String, port: u16 },
    /// A Redfish service.
    Redfish(RedfishAddress),
}

/// Where a Redfish service is and, optionally, which of its systems.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedfishAddress {
    /// The scheme as written (`redfish`, `redfish+http`, `idrac-redfish`),
    /// lowercased, for display.
    pub scheme: String,
    /// HTTPS rather than plain HTTP.
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// The ComputerSystem's path (`/redfish/v1/Systems/1`); `None` to
    /// discover it from `/redfish/v1/Systems`.
    pub system: Option<String>,
}

impl RedfishAddress {
    /// `host:port`, IPv6 literals in brackets.
    pub fn endpoint(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    /// `http(s)://host:port`, the base every request path is appended to.
    pub fn origin(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.endpoint())
    }
}

/// Why a BMC address did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("empty BMC address")]
    Empty,
    #[error(
        "unknown BMC address scheme {scheme:?} in {address:?} (expected ipmi:// or redfish://)"
    )]
    UnknownScheme { address: String, scheme: String },
    #[error("BMC address {address:?} has no host")]
    MissingHost { address: String },
    #[error("BMC address {address:?} has an invalid port {port:?} (expected 1-65535)")]
    InvalidPort { address: String, port: String },
    #[error("BMC address {address:?} has an invalid host {host:?}")]
    InvalidHost { address: String, host: String },
    #[error("ipmi:// address {address:?} may not have a path, query or user info")]
    UnexpectedPart { address: String },
    #[error(
        "Redfish address {address:?} has an invalid path {path:?} (expected none or \
         /redfish/v1/Systems/ID; no query, fragment or user info)"
    )]
    InvalidRedfishPath { address: String, path: String },
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl BmcAddress {
    /// `host:port` for messages and socket resolution; IPv6 literals in brackets.
    pub fn endpoint(&self) -> String {
        match self {
            BmcAddress::Ipmi { host, port } => join_host_port(host, *port),
            BmcAddress::Redfish(r) => r.endpoint(),
        }
    }
}

impl fmt::Display for BmcAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BmcAddress::Ipmi { .. } => write!(f, "ipmi://{}", self.endpoint()),
            BmcAddress::Redfish(r) => {
                write!(f, "{}://{}", r.scheme, r.endpoint())?;
                f.write_str(r.system.as_deref().unwrap_or(""))
            }
        }
    }
}

impl FromStr for BmcAddress {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let address = s.trim();
        if address.is_empty() {
            return Err(AddressError::Empty);
        }
        let rest = match address.split_once("://") {
            None => address,
            Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
                "ipmi" => rest,
                "redfish+http" => return redfish(address, "redfish+http", false, rest),
                s @ ("redfish" | "redfish+https") => return redfish(address, s, true, rest),
                s if s.ends_with("-redfish") || s.ends_with("-redfish+https") => {
                    return redfish(address, s, true, rest);
                }
                s if s.ends_with("-redfish+http") => return redfish(address, s, false, rest),
                _ => {
                    return Err(AddressError::UnknownScheme {
                        address: address.to_owned(),
                        scheme: scheme.to_owned(),
                    });
                }
            },
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(AddressError::UnexpectedPart {
                address: address.to_owned(),
            });
        }
        let (host, port) = host_and_port(address, rest)?;
        let port = match port {
            None => IPMI_DEFAULT_PORT,
            Some(p) => parse_port(address, p)?,
        };
        Ok(BmcAddress::Ipmi {
            host: host.to_owned(),
            port,
        })
    }
}

/// A Redfish address from what follows `scheme://`.
fn redfish(
    address: &str,
    scheme: &str,
    https: bool,
    rest: &str,
) -> Result<BmcAddress, AddressError> {
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let bad_path = || AddressError::InvalidRedfishPath {
        address: address.to_owned(),
        path: path.to_owned(),
    };
    if authority.contains('@') || path.contains(['?', '#', '@']) {
        return Err(bad_path());
    }
    let path = path.trim_end_matches('/');
    let system = match path {
        "" | REDFISH_ROOT => None,
        p => {
            let id = p
                .strip_prefix(REDFISH_ROOT)
                .and_then(|p| p.strip_prefix("/Systems/"))
                .ok_or_else(bad_path)?;
            if id.is_empty() || id.contains('/') {
                return Err(bad_path());
            }
            Some(p.to_owned())
        }
    };
    let (host, port) = host_and_port(address, authority)?;
    let port = match port {
        None if https => 443,
        None => 80,
        Some(p) => parse_port(address, p)?,
    };
    Ok(BmcAddress::Redfish(RedfishAddress {
        scheme: scheme.to_owned(),
        https,
        host: host.to_owned(),
        port,
        system,
    }))
}

/// The host (checked) and the port text of `authority`, the `host[:port]`
/// part of `address`.
fn host_and_port<'a>(
    address: &str,
    authority: &'a str,
) -> Result<(&'a str, Option<&'a str>), AddressError> {
    let (host, port) = split_host_port(authority).ok_or_else(|| AddressError::InvalidHost {
        address: address.to_owned(),
        host: authority.to_owned(),
    })?;
    if host.is_empty() {
        return Err(AddressError::MissingHost {
            address: address.to_owned(),
        });
    }
    if !valid_host(host) {
        return Err(AddressError::InvalidHost {
            address: address.to_owned(),
            host: host.to_owned(),
        });
    }
    Ok((host, port))
}

fn parse_port(address: &str, p: &str) -> Result<u16, AddressError> {
    p.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| AddressError::InvalidPort {
            address: address.to_owned(),
            port: p.to_owned(),
        })
}

/// Splits `host`, `host:port`, `[v6]` or `[v6]:port`; `None` for an
/// unbracketed IPv6 literal or unbalanced brackets.
fn split_host_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(inner) = s.strip_prefix('[') {
        let (host, after) = inner.split_once(']')?;
        host.parse::<std::net::Ipv6Addr>().ok()?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    match s.matches(':').count() {
        0 => Some((s, None)),
        1 => s.split_once(':').map(|(h, p)| (h, Some(p))),
        _ => None,
    }
}

fn valid_host(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_ok()
        || (host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipmi(host: &str, port: u16) -> BmcAddress {
        BmcAddress::Ipmi {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn ipmi_address_with_port_parses() {
        assert_eq!("ipmi://10.77.0.2:623".parse(), Ok(ipmi("10.77.0.2", 623)));
        assert_eq!("ipmi://10.77.0.2:6230".parse(), Ok(ipmi("10.77.0.2", 6230)));
    }

    #[test]
    fn port_defaults_to_623() {
        assert_eq!("ipmi://10.77.0.2".parse(), Ok(ipmi("10.77.0.2", 623)));
        assert_eq!("IPMI://bmc-1.rack3".parse(), Ok(ipmi("bmc-1.rack3", 623)));
    }

    #[test]
    fn bare_host_is_read_as_ipmi_like_metal3() {
        assert_eq!("10.77.0.2:624".parse(), Ok(ipmi("10.77.0.2", 624)));
    }

    #[test]
    fn bracketed_ipv6_literal_parses() {
        let addr: BmcAddress = "ipmi://[fd00::2]:6623".parse().unwrap();
        assert_eq!(addr, ipmi("fd00::2", 6623));
        assert_eq!(addr.endpoint(), "[fd00::2]:6623");
        assert_eq!(addr.to_string(), "ipmi://[fd00::2]:6623");
    }

    fn redfish(
        scheme: &str,
        https: bool,
        host: &str,
        port: u16,
        system: Option<&str>,
    ) -> BmcAddress {
        BmcAddress::Redfish(RedfishAddress {
            scheme: scheme.into(),
            https,
            host: host.into(),
            port,
            system: system.map(Into::into),
        })
    }

    #[test]
    fn metal3_redfish_forms_parse() {
        assert_eq!(
            "redfish://10.1.1.1/redfish/v1/Systems/1".parse(),
            Ok(redfish(
                "redfish",
                true,
                "10.1.1.1",
                443,
                Some("/redfish/v1/Systems/1")
            ))
        );
        assert_eq!(
            "redfish+http://h:8000/redfish/v1/Systems/abc".parse(),
            Ok(redfish(
                "redfish+http",
                false,
                "h",
                8000,
                Some("/redfish/v1/Systems/abc")
            ))
        );
        let v6: BmcAddress = "redfish+https://[fd00::1]:8443/redfish/v1/Systems/x/"
            .parse()
            .unwrap();
        assert_eq!(
            v6,
            redfish(
                "redfish+https",
                true,
                "fd00::1",
                8443,
                Some("/redfish/v1/Systems/x")
            )
        );
        assert_eq!(v6.endpoint(), "[fd00::1]:8443");
        assert_eq!(
            v6.to_string(),
            "redfish+https://[fd00::1]:8443/redfish/v1/Systems/x"
        );
        assert_eq!(
            "redfish+http://bmc".parse(),
            Ok(redfish("redfish+http", false, "bmc", 80, None))
        );
    }

    #[test]
    fn vendor_redfish_variants_are_plain_redfish_over_https() {
        assert_eq!(
            "idrac-redfish://10.77.0.2/redfish/v1/Systems/System.Embedded.1".parse(),
            Ok(redfish(
                "idrac-redfish",
                true,
                "10.77.0.2",
                443,
                Some("/redfish/v1/Systems/System.Embedded.1")
            ))
        );
        assert_eq!(
            "ilo5-redfish+http://bmc:8080".parse(),
            Ok(redfish("ilo5-redfish+http", false, "bmc", 8080, None))
        );
    }

    #[test]
    fn redfish_address_without_a_system_path_is_discovered_later() {
        let addr: BmcAddress = "redfish://bmc.rack3:8443/redfish/v1/".parse().unwrap();
        assert_eq!(addr, redfish("redfish", true, "bmc.rack3", 8443, None));
    }

    #[test]
    fn redfish_address_with_another_path_is_refused() {
        for bad in [
            "redfish://bmc/redfish/v1/Managers/1",
            "redfish://bmc/redfish/v1/Systems/",
            "redfish://bmc/redfish/v1/Systems/1/Bios",
            "redfish://bmc/x",
            "redfish://bmc/redfish/v1/Systems/1?x=1",
            "redfish://user@bmc/redfish/v1/Systems/1",
        ] {
            assert!(
                matches!(
                    bad.parse::<BmcAddress>(),
                    Err(AddressError::InvalidRedfishPath { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            "redfish://bmc:0/redfish/v1/Systems/1".parse::<BmcAddress>(),
            Err(AddressError::InvalidPort { .. })
        ));
    }

    #[test]
    fn malformed_addresses_are_rejected_with_the_reason() {
        assert_eq!("".parse::<BmcAddress>(), Err(AddressError::Empty));
        assert!(matches!(
            "ftp://10.0.0.1".parse::<BmcAddress>(),
            Err(AddressError::UnknownScheme { scheme, .. }) if scheme == "ftp"
        ));
        assert!(matches!(
            "ipmi://:623".parse::<BmcAddress>(),
            Err(AddressError::MissingHost { .. })
        ));
        for bad_port in [
            "ipmi://10.0.0.1:0",
            "ipmi://10.0.0.1:70000",
            "ipmi://10.0.0.1:x",
        ] {
            assert!(
                matches!(
                    bad_port.parse::<BmcAddress>(),
                    Err(AddressError::InvalidPort { .. })
                ),
                "{bad_port}"
            );
        }
        assert!(matches!(
            "ipmi://10.0.0.1/path".parse::<BmcAddress>(),
            Err(AddressError::UnexpectedPart { .. })
        ));
        assert!(matches!(
            "ipmi://fd00::2".parse::<BmcAddress>(),
            Err(AddressError::InvalidHost { .. })
        ));
        assert!(matches!(
            "ipmi://bad_host!".parse::<BmcAddress>(),
            Err(AddressError::InvalidHost { .. })
        ));
    }
}
