//! Who is asking (pure): the client address a request's wakes are counted under. The gate
//! sits behind an ingress controller or gateway, so the connection's peer is that proxy; the
//! address it saw is the last one it added to `X-Forwarded-For`. Only a proxy previewd trusts
//! (`--gate-trusted-proxies`, by default the private and loopback ranges: a cluster's pods and
//! nodes) may say who the client is, so the header is read from its right end, hop by hop,
//! while each hop is trusted; the first address that is not is the client. A header from
//! anyone else is ignored (anyone can write one), and so is an entry that is no address.

use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

/// The forwarded-for header ingress controllers and gateways add to.
const FORWARDED_FOR: &str = "x-forwarded-for";

/// The ranges trusted to say who the client is when none are configured: private (RFC 1918,
/// RFC 4193), shared (RFC 6598, where some clusters put pods) and loopback addresses.
pub const DEFAULT_TRUSTED_PROXIES: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "fc00::/7",
    "::1/128",
];

/// Parses `--gate-trusted-proxies`: a JSON list of networks (`10.0.0.0/8`) or addresses.
pub fn parse_trusted_proxies(text: &str) -> Result<Vec<IpNet>, String> {
    let entries: Vec<String> = serde_json::from_str(text)
        .map_err(|e| format!("expected a JSON list of networks, e.g. [\"10.0.0.0/8\"]: {e}"))?;
    entries.iter().map(|entry| network(entry)).collect()
}

fn network(entry: &str) -> Result<IpNet, String> {
    entry
        .parse::<IpNet>()
        .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{entry:?} is neither a network (10.0.0.0/8) nor an address"))
}

/// [`DEFAULT_TRUSTED_PROXIES`], parsed.
pub fn default_trusted_proxies() -> Vec<IpNet> {
    DEFAULT_TRUSTED_PROXIES
        .iter()
        .filter_map(|entry| entry.parse().ok())
        .collect()
}

/// The client of a request that came from `peer` with `headers`.
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |address: &IpAddr| trusted.iter().any(|net| net.contains(address));
    let mut client = peer;
    if !is_trusted(&client) {
        return client;
    }
    let hops: Vec<&str> = headers
        .get_all(FORWARDED_FOR)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .collect();
    for hop in hops.iter().rev() {
        let Ok(address) = hop.trim().parse::<IpAddr>() else {
            return client;
        };
        client = address;
        if !is_trusted(&client) {
            return client;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(FORWARDED_FOR, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_trusted_proxy_says_who_the_client_is_and_nobody_else_does() {
        let trusted = default_trusted_proxies();
        let via_ingress = forwarded(&["203.0.113.9"]);
        assert_eq!(
            client_address(ip("10.1.2.3"), &via_ingress, &trusted),
            ip("203.0.113.9")
        );
        // Straight from the internet, a header is the client's own word: ignored.
        let forged = forwarded(&["198.51.100.1"]);
        assert_eq!(
            client_address(ip("203.0.113.9"), &forged, &trusted),
            ip("203.0.113.9")
        );
        // What the client wrote before the proxy added its view is never reached.
        let prefixed = forwarded(&["198.51.100.1, 198.51.100.2", "203.0.113.9"]);
        assert_eq!(
            client_address(ip("10.1.2.3"), &prefixed, &trusted),
            ip("203.0.113.9")
        );
        // Through two trusted hops, the first untrusted address from the right.
        let chained = forwarded(&["203.0.113.9, 10.0.0.5"]);
        assert_eq!(
            client_address(ip("10.1.2.3"), &chained, &trusted),
            ip("203.0.113.9")
        );
        // No header, or a hop that is no address: the last trusted hop is all there is.
        assert_eq!(
            client_address(ip("10.1.2.3"), &HeaderMap::new(), &trusted),
            ip("10.1.2.3")
        );
        let junk = forwarded(&["unknown"]);
        assert_eq!(
            client_address(ip("10.1.2.3"), &junk, &trusted),
            ip("10.1.2.3")
        );
    }

    #[test]
    fn trusted_proxies_are_networks_or_addresses() {
        let parsed =
            parse_trusted_proxies(r#"["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"]"#).unwrap();
        assert_eq!(parsed.len(), 3);
        assert!(parsed[1].contains(&ip("192.0.2.7")));
        assert!(parse_trusted_proxies(r#"["10.0.0.0/33"]"#).is_err());
        assert!(parse_trusted_proxies("10.0.0.0/8").is_err());
        assert_eq!(
            default_trusted_proxies().len(),
            DEFAULT_TRUSTED_PROXIES.len()
        );
    }
}
