//! Webhook URL validation, and the private-address guard (`sheaf_destination::guard`) applied
//! to HTTP.
//!
//! Unless private destinations are allowed, a webhook URL is refused when its host is, or
//! resolves to, an address that is not public. The check runs twice:
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
//! Redirects are never followed (`send.rs`), so a receiver cannot point a delivery at a
//! refused address with a `Location` either.

use sheaf_destination::guard::{self, check_resolved, is_public};

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UrlRefused(pub String);

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
    let port = url.port_or_known_default().unwrap_or(443);
    guard::check_host(raw, host, port, allow_private)
        .await
        .map_err(|e| UrlRefused(e.0))?;
    Ok(url)
}

/// The connect-time check of a URL whose host is an IP literal (reqwest connects to those
/// without asking the resolver): `Err` when it is not public. Names pass; the resolver checks them.
pub fn check_literal(url: &Url) -> Result<(), UrlRefused> {
    let Some(ip) = url.host_str().and_then(guard::literal) else {
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
}
