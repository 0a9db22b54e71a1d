//! The PROXY protocol (HAProxy's, versions 1 and 2): the header a layer-4 load balancer in
//! front of the gateway sends first on each TCP connection, carrying the client's address,
//! so that access lists, rate limits, `X-Forwarded-For` and the access log see the client
//! rather than the balancer. Pure parsing of untrusted bytes (fuzzed:
//! `fuzz/fuzz_targets/proxy_header.rs`); reading it off a socket is [`read_header`].
//!
//! Spec: <https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt>.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The version 2 signature, the header's first 12 bytes.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// Version 1's longest header, CRLF included (spec §2.1).
const V1_MAX: usize = 107;

/// The longest version 2 header taken: the 16 fixed bytes, IPv6 addresses and ports (36), and
/// 500 bytes of TLVs (spec §2.2), which are skipped.
pub const V2_MAX: usize = 16 + 36 + 500;

/// What the bytes read so far hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A header has begun but is not complete: read more.
    Incomplete,
    /// A header of `len` bytes. `client` is the source address it carries: `None` for a
    /// version 1 `UNKNOWN`, a version 2 `LOCAL` (the balancer's own health check) or an
    /// address family other than TCP over IPv4 or IPv6; the connection's own peer then stands.
    Header {
        len: usize,
        client: Option<SocketAddr>,
    },
}

/// Why the bytes are not a PROXY header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("the connection does not start with a PROXY protocol header")]
    Missing,
    #[error("malformed PROXY protocol header: {0}")]
    Malformed(&'static str),
}

/// Parses the start of a connection.
pub fn parse(buf: &[u8]) -> Result<Parsed, HeaderError> {
    if starts_like(buf, b"PROXY ") {
        parse_v1(buf)
    } else if starts_like(buf, V2_SIGNATURE) {
        parse_v2(buf)
    } else {
        Err(HeaderError::Missing)
    }
}

/// Whether `buf` and `prefix` agree over their common length.
fn starts_like(buf: &[u8], prefix: &[u8]) -> bool {
    let n = buf.len().min(prefix.len());
    buf[..n] == prefix[..n]
}

fn parse_v1(buf: &[u8]) -> Result<Parsed, HeaderError> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() >= V1_MAX {
            Err(HeaderError::Malformed("v1 line longer than 107 bytes"))
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    let line = std::str::from_utf8(&buf[..end])
        .map_err(|_| HeaderError::Malformed("v1 line is not ASCII"))?;
    let len = end + 2;
    let mut fields = line.split(' ');
    fields.next(); // "PROXY", checked by `parse`
    let client = match fields.next() {
        Some("UNKNOWN") => None, // the rest of the line is to be ignored (spec §2.1)
        Some(proto @ ("TCP4" | "TCP6")) => {
            let (Some(src), Some(_dst), Some(sport), Some(_dport), None) = (
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
            ) else {
                return Err(HeaderError::Malformed(
                    "v1 line needs four addresses and ports",
                ));
            };
            let ip: IpAddr = src
                .parse()
                .map_err(|_| HeaderError::Malformed("v1 source address"))?;
            if ip.is_ipv4() != (proto == "TCP4") {
                return Err(HeaderError::Malformed(
                    "v1 source address of the wrong family",
                ));
            }
            let port = parse_port(sport)?;
            Some(SocketAddr::new(ip, port))
        }
        _ => {
            return Err(HeaderError::Malformed(
                "v1 protocol is not TCP4, TCP6 or UNKNOWN",
            ))
        }
    };
    Ok(Parsed::Header { len, client })
}

/// A decimal port without sign or leading zeros (spec §2.1).
fn parse_port(s: &str) -> Result<u16, HeaderError> {
    let ok =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    ok.then(|| s.parse().ok())
        .flatten()
        .ok_or(HeaderError::Malformed("v1 port"))
}

fn parse_v2(buf: &[u8]) -> Result<Parsed, HeaderError> {
    if buf.len() < 16 {
        return Ok(Parsed::Incomplete);
    }
    let (version, command) = (buf[12] >> 4, buf[12] & 0x0f);
    if version != 2 {
        return Err(HeaderError::Malformed("v2 version is not 2"));
    }
    let body = u16::from_be_bytes([buf[14], buf[15]]) as usize;
    let len = 16 + body;
    if len > V2_MAX {
        return Err(HeaderError::Malformed("v2 header longer than taken"));
    }
    if buf.len() < len {
        return Ok(Parsed::Incomplete);
    }
    let body = &buf[16..len];
    let client = match command {
        0x0 => None, // LOCAL: the balancer's own connection
        0x1 => match buf[13] {
            // TCP over IPv4: source, destination, source port, destination port.
            0x11 => {
                let a = body
                    .get(..12)
                    .ok_or(HeaderError::Malformed("v2 IPv4 addresses cut short"))?;
                let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
                Some(SocketAddr::new(ip.into(), u16::from_be_bytes([a[8], a[9]])))
            }
            // TCP over IPv6.
            0x21 => {
                let a = body
                    .get(..36)
                    .ok_or(HeaderError::Malformed("v2 IPv6 addresses cut short"))?;
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&a[..16]);
                let ip = Ipv6Addr::from(octets);
                Some(SocketAddr::new(
                    ip.into(),
                    u16::from_be_bytes([a[32], a[33]]),
                ))
            }
            // UNSPEC, UDP, UNIX: no client address to take (spec §2.2).
            _ => None,
        },
        _ => return Err(HeaderError::Malformed("v2 command is not LOCAL or PROXY")),
    };
    Ok(Parsed::Header { len, client })
}

/// Reads a PROXY header off the start of `io`: the client address it carries (if any) and
/// the bytes read past it (the start of the TLS handshake). Reads at most [`V2_MAX`] bytes;
/// an error if the connection does not begin with a header, ends first, or sends a malformed
/// one. The caller bounds it in time.
pub async fn read_header<R: tokio::io::AsyncRead + Unpin>(
    io: &mut R,
) -> std::io::Result<(Option<SocketAddr>, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::with_capacity(256);
    loop {
        let mut chunk = [0u8; 256];
        let room = (V2_MAX + 256 - buf.len()).min(chunk.len());
        let n = io.read(&mut chunk[..room]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        match parse(&buf) {
            Ok(Parsed::Incomplete) => continue,
            Ok(Parsed::Header { len, client }) => return Ok((client, buf.split_off(len))),
            Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family);
        h.extend_from_slice(&(body.len() as u16).to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    #[test]
    fn v1_tcp4_tcp6_and_unknown() {
        let h = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n\x16\x03\x01";
        assert_eq!(
            parse(h),
            Ok(Parsed::Header {
                len: h.len() - 3,
                client: Some("192.0.2.7:56324".parse().unwrap())
            })
        );
        let h = b"PROXY TCP6 2001:db8::7 2001:db8::1 65535 443\r\n";
        assert_eq!(
            parse(h),
            Ok(Parsed::Header {
                len: h.len(),
                client: Some("[2001:db8::7]:65535".parse().unwrap())
            })
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"),
            Ok(Parsed::Header {
                len: 35,
                client: None
            })
        );
    }

    #[test]
    fn v1_incomplete_until_its_line_ends() {
        let h = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n";
        for n in 0..h.len() - 1 {
            assert_eq!(parse(&h[..n]), Ok(Parsed::Incomplete), "{n} bytes");
        }
    }

    #[test]
    fn v1_malformed_lines_are_refused() {
        for bad in [
            &b"PROXY TCP4 192.0.2.7 198.51.100.1 56324\r\n"[..],
            b"PROXY TCP4 2001:db8::7 198.51.100.1 1 2\r\n",
            b"PROXY TCP6 192.0.2.7 198.51.100.1 1 2\r\n",
            b"PROXY TCP4 192.0.2.7 198.51.100.1 070 2\r\n",
            b"PROXY TCP4 192.0.2.7 198.51.100.1 65536 2\r\n",
            b"PROXY TCP4 192.0.2.7 198.51.100.1 1 2 extra\r\n",
            b"PROXY UDP4 192.0.2.7 198.51.100.1 1 2\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(HeaderError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = [b"PROXY ".as_slice(), &[b'x'; 120]].concat();
        assert!(matches!(parse(&long), Err(HeaderError::Malformed(_))));
    }

    #[test]
    fn v2_proxy_local_and_families() {
        let mut ipv4 = vec![192, 0, 2, 7, 198, 51, 100, 1];
        ipv4.extend_from_slice(&56324u16.to_be_bytes());
        ipv4.extend_from_slice(&443u16.to_be_bytes());
        ipv4.extend_from_slice(&[0x04, 0, 1, 0xaa]); // a TLV, skipped
        let h = v2(1, 0x11, &ipv4);
        assert_eq!(
            parse(&[h.as_slice(), b"\x16\x03"].concat()),
            Ok(Parsed::Header {
                len: h.len(),
                client: Some("192.0.2.7:56324".parse().unwrap())
            })
        );
        let mut ipv6 = "2001:db8::7".parse::<Ipv6Addr>().unwrap().octets().to_vec();
        ipv6.extend_from_slice(&[0; 16]);
        ipv6.extend_from_slice(&[0xff, 0xff, 0x01, 0xbb]);
        assert_eq!(
            parse(&v2(1, 0x21, &ipv6)),
            Ok(Parsed::Header {
                len: 16 + 36,
                client: Some("[2001:db8::7]:65535".parse().unwrap())
            })
        );
        assert_eq!(
            parse(&v2(0, 0x00, &[])),
            Ok(Parsed::Header {
                len: 16,
                client: None
            })
        );
        assert_eq!(
            parse(&v2(1, 0x12, &ipv4)),
            Ok(Parsed::Header {
                len: 16 + ipv4.len(),
                client: None
            })
        );
        for n in 0..h.len() {
            assert_eq!(parse(&h[..n]), Ok(Parsed::Incomplete), "{n} bytes");
        }
    }

    #[test]
    fn v2_malformed_headers_are_refused() {
        let short = v2(1, 0x11, &[192, 0, 2, 7]);
        assert!(matches!(parse(&short), Err(HeaderError::Malformed(_))));
        let mut version3 = v2(1, 0x11, &[0; 12]);
        version3[12] = 0x31;
        assert!(matches!(parse(&version3), Err(HeaderError::Malformed(_))));
        let command2 = v2(2, 0x11, &[0; 12]);
        assert!(matches!(parse(&command2), Err(HeaderError::Malformed(_))));
        let huge = v2(1, 0x11, &[0; V2_MAX]);
        assert!(matches!(parse(&huge[..20]), Err(HeaderError::Malformed(_))));
    }

    #[test]
    fn anything_else_is_missing_a_header() {
        assert_eq!(parse(b"\x16\x03\x01\x02\x00"), Err(HeaderError::Missing));
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(HeaderError::Missing));
        assert_eq!(parse(b"PROXX"), Err(HeaderError::Missing));
    }

    /// The fuzz target's checks (`fuzz/fuzz_targets/proxy_header.rs`) over seeded random
    /// inputs: valid headers cut and flipped at random, and noise behind each signature.
    #[test]
    fn random_inputs_keep_the_parser_s_promises() {
        let mut rng = fastrand::Rng::with_seed(7);
        let seeds: [&[u8]; 3] = [
            b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n",
            b"PROXY TCP6 2001:db8::7 2001:db8::1 65535 443\r\n",
            &v2(1, 0x11, &[192, 0, 2, 7, 198, 51, 100, 1, 0xdc, 4, 1, 0xbb]),
        ];
        for i in 0..20_000 {
            let mut data = seeds[i % 3].to_vec();
            match rng.u8(..4) {
                0 => data.truncate(rng.usize(..=data.len())),
                1 => {
                    let at = rng.usize(..data.len());
                    data[at] ^= 1 << rng.u8(..8);
                }
                2 => data.extend((0..rng.usize(..64)).map(|_| rng.u8(..))),
                _ => data.truncate(rng.usize(..=12)),
            }
            if let Ok(Parsed::Header { len, .. }) = parse(&data) {
                assert!(len <= data.len() && len <= V2_MAX);
                assert_eq!(parse(&data[..len]), parse(&data));
                for n in 0..len {
                    assert_eq!(parse(&data[..n]), Ok(Parsed::Incomplete), "{data:?} at {n}");
                }
            }
        }
    }

    #[tokio::test]
    async fn read_header_keeps_what_follows_it() {
        let mut input: &[u8] = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n\x16\x03\x01hello";
        let (client, rest) = read_header(&mut input).await.unwrap();
        assert_eq!(client, Some("192.0.2.7:56324".parse().unwrap()));
        assert_eq!(rest, b"\x16\x03\x01hello");
        let mut cut: &[u8] = b"PROXY TCP4 192.0.2.7";
        assert!(read_header(&mut cut).await.is_err());
        let mut tls: &[u8] = b"\x16\x03\x01\x02\x00";
        assert!(read_header(&mut tls).await.is_err());
    }
}
