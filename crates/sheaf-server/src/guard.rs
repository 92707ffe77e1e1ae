//! Destination URL validation, and the guard against private destinations.
//!
//! A webhook service that POSTs wherever a tenant says is a way into the network it runs
//! in. Unless `SHEAF_ALLOW_PRIVATE_DESTINATIONS` is set, a destination URL is refused when
//! its host is, or resolves to, any address that is not public: loopback, private,
//! link-local, unspecified, shared (CGNAT), documentation, benchmarking, multicast,
//! broadcast or reserved, in IPv4 and IPv6 (IPv4-mapped addresses are checked as IPv4).
//! The check runs when a destination is created or its URL changes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use reqwest::Url;

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UrlRefused(pub String);

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

/// Parses and checks a destination URL: `http` or `https`, a host, no credentials in it, and,
/// unless `allow_private`, a host whose every address is public.
pub async fn check_url(raw: &str, allow_private: bool) -> Result<Url, UrlRefused> {
    let url = Url::parse(raw).map_err(|e| UrlRefused(format!("{raw:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlRefused(format!("{raw:?} is not an http or https URL")));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlRefused(
            "a destination URL must not carry credentials; use custom headers".to_owned(),
        ));
    }
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| UrlRefused(format!("{raw:?} has no host")))?;
    if allow_private {
        return Ok(url);
    }
    let refuse = |ip: IpAddr| {
        UrlRefused(format!(
            "{raw:?} points at {ip}, which is not a public address (set SHEAF_ALLOW_PRIVATE_DESTINATIONS=true to allow it)"
        ))
    };
    // An IPv6 literal comes back in brackets.
    if let Ok(ip) = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        if !is_public(ip) {
            return Err(refuse(ip));
        }
        return Ok(url);
    }
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs = tokio::net::lookup_host((host, port)).await.map_err(|e| {
        UrlRefused(format!(
            "the host of {raw:?} does not resolve ({e}), so it cannot be checked"
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
        return Err(UrlRefused(format!("the host of {raw:?} has no address")));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

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
