//! BMC addresses in Metal3's `BareMetalHost` format: `ipmi://host[:port]`
//! (or a bare `host[:port]`, which Metal3 also reads as IPMI) and the
//! `redfish://` family, which parses but has no driver yet.
//!
//! Owns parsing only; it resolves no names and opens no sockets.

use std::{fmt, str::FromStr};

/// The UDP port of RMCP / RMCP+ (IPMI 2.0 §13.1).
pub const IPMI_DEFAULT_PORT: u16 = 623;

/// Where a host's BMC is and which driver speaks to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BmcAddress {
    /// IPMI 2.0 over RMCP+ (lanplus).
    Ipmi { host: String, port: u16 },
    /// A Redfish address (`redfish://`, `redfish+http(s)://`, vendor
    /// variants such as `idrac-redfish://`), kept verbatim until a Redfish
    /// driver exists.
    Redfish { url: String },
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
}

impl BmcAddress {
    /// `host:port` for messages and socket resolution; IPv6 literals in brackets.
    pub fn endpoint(&self) -> String {
        match self {
            BmcAddress::Ipmi { host, port } if host.contains(':') => format!("[{host}]:{port}"),
            BmcAddress::Ipmi { host, port } => format!("{host}:{port}"),
            BmcAddress::Redfish { url } => url.clone(),
        }
    }
}

impl fmt::Display for BmcAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BmcAddress::Ipmi { .. } => write!(f, "ipmi://{}", self.endpoint()),
            BmcAddress::Redfish { url } => f.write_str(url),
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
                s if s == "redfish" || s.ends_with("-redfish") || s.starts_with("redfish+") => {
                    return Ok(BmcAddress::Redfish {
                        url: address.to_owned(),
                    });
                }
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
        let (host, port) = split_host_port(rest).ok_or_else(|| AddressError::InvalidHost {
            address: address.to_owned(),
            host: rest.to_owned(),
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
        let port = match port {
            None => IPMI_DEFAULT_PORT,
            Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| {
                AddressError::InvalidPort {
                    address: address.to_owned(),
                    port: p.to_owned(),
                }
            })?,
        };
        Ok(BmcAddress::Ipmi {
            host: host.to_owned(),
            port,
        })
    }
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

    #[test]
    fn redfish_schemes_parse_to_their_own_variant() {
        for url in [
            "redfish://10.77.0.2/redfish/v1/Systems/1",
            "redfish+https://bmc/redfish/v1/Systems/1",
            "idrac-redfish://10.77.0.2/redfish/v1/Systems/System.Embedded.1",
        ] {
            assert_eq!(url.parse(), Ok(BmcAddress::Redfish { url: url.into() }));
        }
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
