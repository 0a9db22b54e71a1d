//! Access lists: which client addresses a route (or a listener) serves. A list has `deny` and
//! `allow` entries, each an address or a CIDR block; a client matching any `deny` entry is
//! refused, then, if `allow` has entries, only a client matching one of them is served.
//! IPv4 clients that reach a dual-stack socket as IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`)
//! are matched as the IPv4 addresses they are.

use serde::{Deserialize, Deserializer};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An address block: `10.0.0.0/8`, `2001:db8::/32`, or one address (`192.0.2.7`, `::1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The block's first address (bits past the prefix are zero).
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                mask_v4(u32::from(ip), self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                mask_v6(u128::from(ip), self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }
}

/// `bits` with all but the first `prefix` bits cleared.
fn mask_v4(bits: u32, prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => bits & (u32::MAX << (32 - u32::from(p))),
    }
}

fn mask_v6(bits: u128, prefix: u8) -> u128 {
    match prefix {
        0 => 0,
        p => bits & (u128::MAX << (128 - u32::from(p))),
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let expected = || {
            format!("invalid address block {s:?}; expected an IP address or a CIDR block like \"10.0.0.0/8\" or \"2001:db8::/32\"")
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip = IpAddr::from_str(addr.trim()).map_err(|_| expected())?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(expected)?,
        };
        // An IPv4-mapped block (`::ffff:10.0.0.0/104`) is the IPv4 block it maps.
        let (ip, prefix) = match ip {
            IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), prefix - 96),
                None => (ip, prefix),
            },
            _ => (ip, prefix),
        };
        let net = match ip {
            IpAddr::V4(v4) => IpAddr::V4(mask_v4(u32::from(v4), prefix).into()),
            IpAddr::V6(v6) => IpAddr::V6(mask_v6(u128::from(v6), prefix).into()),
        };
        if net != ip {
            return Err(format!(
                "address block {s:?} has bits set past its prefix; did you mean \"{net}/{prefix}\"?"
            ));
        }
        Ok(Cidr { net, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A route's or listener's `allow` and `deny` entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessList {
    allow: Vec<Cidr>,
    deny: Vec<Cidr>,
}

impl AccessList {
    pub fn new(allow: &[Cidr], deny: &[Cidr]) -> Self {
        AccessList {
            allow: allow.to_vec(),
            deny: deny.to_vec(),
        }
    }

    /// True when the list has no entries (everyone is served).
    #[cfg(test)]
    pub fn is_open(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Whether a client at `ip` is served.
    pub fn permits(&self, ip: IpAddr) -> bool {
        !self.deny.iter().any(|c| c.contains(ip))
            && (self.allow.is_empty() || self.allow.iter().any(|c| c.contains(ip)))
    }
}

/// A listener's access list, shared by every worker's copy of the listener (TCP and QUIC)
/// and replaced whole by a configuration reload: a connection is checked against the list in
/// force when it arrives.
pub type SharedAccessList = crate::swappable::Swappable<AccessList>;

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_contain_their_addresses_only() {
        let b = cidr("10.1.0.0/16");
        assert!(b.contains(ip("10.1.0.0")) && b.contains(ip("10.1.255.255")));
        assert!(!b.contains(ip("10.2.0.0")) && !b.contains(ip("9.255.255.255")));
        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(
            !cidr("0.0.0.0/0").contains(ip("::1")),
            "families do not mix"
        );
        assert!(cidr("192.0.2.7").contains(ip("192.0.2.7")));
        assert!(!cidr("192.0.2.7").contains(ip("192.0.2.8")));
        let v6 = cidr("2001:db8::/32");
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        assert!(cidr("::/0").contains(ip("::1")));
        assert!(cidr("::1").contains(ip("::1")));
    }

    #[test]
    fn ipv4_mapped_clients_match_ipv4_blocks() {
        assert!(cidr("127.0.0.0/8").contains(ip("::ffff:127.0.0.1")));
        assert!(cidr("::ffff:10.0.0.0/104").contains(ip("10.0.0.1")));
    }

    #[test]
    fn bad_blocks_say_what_was_expected() {
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0/8",
            "::/129",
            "host",
            "10.0.0.0/x",
            "1.2.3.4/-1",
        ] {
            let e = bad.parse::<Cidr>().unwrap_err();
            assert!(
                e.contains("expected an IP address or a CIDR block"),
                "{bad}: {e}"
            );
        }
        let e = "10.0.0.1/8".parse::<Cidr>().unwrap_err();
        assert!(e.contains("did you mean \"10.0.0.0/8\""), "{e}");
        assert_eq!(cidr("10.0.0.0/8").to_string(), "10.0.0.0/8");
    }

    #[test]
    fn deny_wins_then_allow_limits() {
        let open = AccessList::default();
        assert!(open.is_open() && open.permits(ip("198.51.100.1")));
        let list = AccessList::new(&[cidr("10.0.0.0/8")], &[cidr("10.9.0.0/16")]);
        assert!(list.permits(ip("10.1.2.3")));
        assert!(!list.permits(ip("10.9.1.1")), "deny is checked first");
        assert!(!list.permits(ip("192.0.2.1")), "not in allow");
        let deny_only = AccessList::new(&[], &[cidr("192.0.2.0/24")]);
        assert!(!deny_only.permits(ip("192.0.2.50")) && deny_only.permits(ip("192.0.3.1")));
    }
}
