//! Destination URL validation, and the guard against private destinations.
//!
//! A webhook service that POSTs wherever a tenant says is a way into the network it runs
//! in. Unless `SHEAF_ALLOW_PRIVATE_DESTINATIONS` is set, a destination URL is refused when
//! its host is, or resolves to, any address that is not public: loopback, private,
//! link-local, unspecified, shared (CGNAT), documentation, benchmarking, multicast,
//! broadcast or reserved, in IPv4 and IPv6 (IPv4-mapped addresses are checked as IPv4).
//! The check runs twice:
//! - when a destination is created or its URL changes ([`check_url`]), so a bad URL is refused
//!   with a 400 before anything is stored;
//! - when a delivery connects ([`GuardedResolver`], installed in the webhook client, and
//!   [`check_literal`] for IP literals, which reqwest does not resolve), because a name's
//!   addresses can change after it was checked: a DNS name that answered a public address at
//!   creation and a loopback one at delivery (DNS rebinding) is refused at connect time, and the
//!   attempt fails with the reason. The address checked is the address connected to: the client
//!   connects only to what the resolver returned, and it uses no proxy while the guard is on (a
//!   proxy would resolve the name itself, out of the guard's sight).
//!
//! Redirects are never followed (`webhook.rs`), so a receiver cannot point a delivery at a
//! refused address with a `Location` either.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

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

/// The addresses `host` resolved to, if every one is public; otherwise the refusal naming the
/// first address that is not. An empty answer is refused too.
pub fn check_resolved(
    host: &str,
    addrs: impl IntoIterator<Item = SocketAddr>,
) -> Result<Vec<SocketAddr>, UrlRefused> {
    let addrs: Vec<SocketAddr> = addrs.into_iter().collect();
    if addrs.is_empty() {
        return Err(UrlRefused(format!("{host} has no address")));
    }
    if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
        return Err(UrlRefused(format!(
            "{host} resolves to {}, which is not a public address (SHEAF_ALLOW_PRIVATE_DESTINATIONS is false)",
            bad.ip()
        )));
    }
    Ok(addrs)
}

/// The connect-time check of a URL whose host is an IP literal (reqwest connects to those
/// without asking the resolver): `Err` when it is not public. Names pass; the resolver checks them.
pub fn check_literal(url: &Url) -> Result<(), UrlRefused> {
    // An IPv6 literal comes back in brackets.
    let literal = url
        .host_str()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
        .and_then(|h| h.parse::<IpAddr>().ok());
    let Some(ip) = literal else {
        return Ok(());
    };
    if is_public(ip) {
        Ok(())
    } else {
        Err(UrlRefused(format!(
            "{ip} is not a public address (SHEAF_ALLOW_PRIVATE_DESTINATIONS is false)"
        )))
    }
}

/// The webhook client's DNS resolver while the guard is on: the system's answer (as reqwest's
/// default resolver gives it), refused whole when any address is not public. Refusing rather
/// than filtering keeps the rule the same as at creation: a name that can mean the inside of
/// the network is not a destination, whichever of its addresses a connection would pick.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuardedResolver;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's port on the addresses it gets back.
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let addrs = check_resolved(&host, found)?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
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

    #[test]
    fn ip_literals_are_checked_at_connect_time() {
        for (url, ok) in [
            ("http://127.0.0.1:9/hook", false),
            ("http://[::1]:9/hook", false),
            ("http://10.1.2.3/hook", false),
            ("http://[::ffff:169.254.169.254]/", false),
            ("http://93.184.216.34/hook", true),
            ("http://localhost:9/hook", true), // a name: the resolver's job
        ] {
            let url = Url::parse(url).unwrap();
            assert_eq!(check_literal(&url).is_ok(), ok, "{url}");
        }
    }

    #[tokio::test]
    async fn the_resolver_refuses_a_name_that_resolves_to_loopback() {
        let name: Name = "localhost".parse().unwrap();
        let err = match GuardedResolver.resolve(name).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(err) => err,
        };
        assert!(err.to_string().contains("not a public address"), "{err}");
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
