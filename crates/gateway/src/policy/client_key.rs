//! What per-client limits count a client by: its address, with an IPv6 address cut to its
//! network prefix (`limits.client_ipv6_prefix`, /64 by default). One IPv6 client (a phone, a
//! home, a cloud VM) holds a whole /64 and can send from any of its 2^64 addresses; counted by
//! full address, it would get a fresh share of every per-client limit with each one: the
//! route's rate limit, a cluster's `max_requests_per_client`, the listener's
//! `new_connections_per_address`. A /64 is the IPv6 counterpart of one IPv4 address. Access
//! lists, logs and forwarding headers keep the full address.

use std::net::{IpAddr, Ipv6Addr};

/// The prefix per-client limits count an IPv6 client by, unless configured.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// `client`'s key for per-client limits: an IPv4 address (or an IPv4-mapped IPv6 one) as
/// itself; an IPv6 address with all but its first `ipv6_prefix` bits cleared (1 to 128).
pub fn client_key(client: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match client.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let bits = u32::from(ipv6_prefix.clamp(1, 128));
            let mask = u128::MAX << (128 - bits);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str, prefix: u8) -> String {
        client_key(s.parse().unwrap(), prefix).to_string()
    }

    #[test]
    fn an_ipv6_client_is_counted_by_its_prefix_and_ipv4_by_its_address() {
        assert_eq!(
            key("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 64),
            "2001:db8:1:2::"
        );
        assert_eq!(key("2001:db8:1:2::1", 64), key("2001:db8:1:2:ffff::9", 64));
        assert_ne!(key("2001:db8:1:2::1", 64), key("2001:db8:1:3::1", 64));
        assert_eq!(key("2001:db8:1:2ff::1", 56), "2001:db8:1:200::");
        assert_eq!(key("2001:db8::1", 128), "2001:db8::1");
        assert_eq!(key("203.0.113.7", 64), "203.0.113.7");
        assert_eq!(key("::ffff:203.0.113.7", 64), "203.0.113.7", "mapped IPv4");
        assert_eq!(key("::1", 64), "::");
    }
}
