//! The guard against private destinations, shared by every type that connects somewhere.
//!
//! A service that connects wherever a tenant says is a way into the network it runs in. Unless
//! the operator allows private destinations (`SHEAF_ALLOW_PRIVATE_DESTINATIONS`), a destination
//! whose host is, or resolves to, any address that is not public is refused: loopback, private,
//! link-local, unspecified, shared (CGNAT), documentation, benchmarking, multicast, broadcast or
//! reserved, in IPv4 and IPv6 (IPv4-mapped addresses are checked as IPv4).
//!
//! A type checks twice: when a `config` is validated ([`check_host`]), so a bad destination is
//! refused with a 400 before anything is stored, and when it connects ([`resolve_public`] or a
//! resolver built on [`check_resolved`]), because a name's addresses can change after it was
//! checked (DNS rebinding). It then connects only to the addresses it checked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Why a destination's address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Whether `ip` is an address a public destination may have.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let not_public = ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240; // reserved
    !not_public
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    let not_public = ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (segments[0] & 0xfe00) == 0xfc00 // unique local
        || (segments[0] & 0xffc0) == 0xfe80 // link-local
        || (segments[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (segments[0] == 0x2001 && segments[1] == 0x0db8) // documentation
        || (segments[0] == 0x0064 && segments[1] == 0xff9b) // NAT64: an IPv4 address inside
        || segments[0] == 0x0100 && segments[1..4] == [0, 0, 0]; // discard-only
    !not_public
}

/// The addresses `host` resolved to, if every one is public; otherwise the refusal naming the
/// first address that is not. An empty answer is refused too.
pub fn check_resolved(
    host: &str,
    addrs: impl IntoIterator<Item = SocketAddr>,
) -> Result<Vec<SocketAddr>, Refused> {
    let addrs: Vec<SocketAddr> = addrs.into_iter().collect();
    if addrs.is_empty() {
        return Err(Refused(format!("{host} has no address")));
    }
    if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
        return Err(Refused(format!(
            "{host} resolves to {}, which is not a public address (SHEAF_ALLOW_PRIVATE_DESTINATIONS is false)",
            bad.ip()
        )));
    }
    Ok(addrs)
}

/// The literal IP of `host`, if it is one (an IPv6 literal may come in brackets).
pub fn literal(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// The check at validation: `host` (a name or an IP literal) must, unless `allow_private`, be a
/// public address or resolve only to public ones. `what` names the destination in the refusal
/// (a URL, say).
pub async fn check_host(
    what: &str,
    host: &str,
    port: u16,
    allow_private: bool,
) -> Result<(), Refused> {
    if allow_private {
        return Ok(());
    }
    let refuse = |ip: IpAddr| {
        Refused(format!(
            "{what:?} points at {ip}, which is not a public address (set SHEAF_ALLOW_PRIVATE_DESTINATIONS=true to allow it)"
        ))
    };
    if let Some(ip) = literal(host) {
        return if is_public(ip) {
            Ok(())
        } else {
            Err(refuse(ip))
        };
    }
    let addrs = tokio::net::lookup_host((host, port)).await.map_err(|e| {
        Refused(format!(
            "the host of {what:?} does not resolve ({e}), so it cannot be checked"
        ))
    })?;
    let mut any = false;
    for addr in addrs {
        any = true;
        if !is_public(addr.ip()) {
            return Err(refuse(addr.ip()));
        }
    }
    if !any {
        return Err(Refused(format!("the host of {what:?} has no address")));
    }
    Ok(())
}

/// The check at connect time: the addresses to connect to for `host:port`, every one public
/// unless `allow_private` (then simply what the name resolves to).
pub async fn resolve_public(
    host: &str,
    port: u16,
    allow_private: bool,
) -> Result<Vec<SocketAddr>, Refused> {
    if let Some(ip) = literal(host) {
        let addr = SocketAddr::new(ip, port);
        return if allow_private || is_public(ip) {
            Ok(vec![addr])
        } else {
            Err(Refused(format!(
                "{ip} is not a public address (SHEAF_ALLOW_PRIVATE_DESTINATIONS is false)"
            )))
        };
    }
    let found = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| Refused(format!("{host} does not resolve: {e}")))?;
    if allow_private {
        let found: Vec<SocketAddr> = found.collect();
        if found.is_empty() {
            return Err(Refused(format!("{host} has no address")));
        }
        return Ok(found);
    }
    check_resolved(host, found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolved_addresses_must_all_be_public() {
        let public: SocketAddr = "93.184.216.34:0".parse().unwrap();
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let private: SocketAddr = "[fd00::1]:0".parse().unwrap();
        assert_eq!(check_resolved("a.test", [public]).unwrap(), vec![public]);
        let err = check_resolved("a.test", [public, loopback]).unwrap_err();
        assert!(err.0.contains("127.0.0.1"), "{err}");
        assert!(check_resolved("a.test", [private]).is_err());
        assert!(check_resolved("a.test", []).is_err());
    }

    #[tokio::test]
    async fn names_and_literals_are_checked_unless_private_is_allowed() {
        let err = check_host("amqp://localhost", "localhost", 5672, false)
            .await
            .unwrap_err();
        assert!(err.0.contains("not a public address"), "{err}");
        assert!(check_host("x", "127.0.0.1", 1, false).await.is_err());
        assert!(check_host("x", "[::1]", 1, false).await.is_err());
        assert!(check_host("x", "93.184.216.34", 1, false).await.is_ok());
        assert!(check_host("x", "localhost", 1, true).await.is_ok());
        assert!(resolve_public("127.0.0.1", 9, false).await.is_err());
        assert_eq!(
            resolve_public("127.0.0.1", 9, true).await.unwrap(),
            vec!["127.0.0.1:9".parse().unwrap()]
        );
        assert!(resolve_public("localhost", 9, false).await.is_err());
    }

    #[test]
    fn private_and_special_addresses_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip} must not be public");
        }
        for ip in ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111"] {
            assert!(is_public(ip.parse().unwrap()), "{ip} is public");
        }
    }
}
