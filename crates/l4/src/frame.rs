//! The IPv4 and UDP headers put back around a received payload, as the client sent it: the
//! client the source, the VIP the destination. The gateway, which owns the VIP, takes the
//! datagram as if it came straight from the client.

use std::net::SocketAddrV4;

/// Bytes of IPv4 (no options) and UDP headers in front of the payload.
pub(crate) const HEADERS: usize = 20 + 8;

/// Writes the headers into `packet[..HEADERS]` for the payload in `packet[HEADERS..]`.
/// `packet` is the whole IP packet; its length must fit the 16-bit length fields.
pub(crate) fn write_headers(packet: &mut [u8], src: SocketAddrV4, dst: SocketAddrV4) {
    let total = packet.len();
    debug_assert!((HEADERS..=usize::from(u16::MAX)).contains(&total));
    let udp_len = (total - 20) as u16;
    let (ip, rest) = packet.split_at_mut(20);
    ip[0] = 0x45; // version 4, 5 words
    ip[1] = 0; // DSCP/ECN
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&[0, 0]); // identification: unused with DF
    ip[6..8].copy_from_slice(&[0x40, 0]); // don't fragment
    ip[8] = 64; // TTL
    ip[9] = 17; // UDP
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&src.ip().octets());
    ip[16..20].copy_from_slice(&dst.ip().octets());
    let ip_sum = !fold(sum(ip, 0));
    ip[10..12].copy_from_slice(&ip_sum.to_be_bytes());

    let (udp, payload) = rest.split_at_mut(8);
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    // The pseudo-header (RFC 768): addresses, protocol, UDP length.
    let mut acc = sum(&ip[12..20], 0);
    acc += 17 + u64::from(udp_len);
    acc = sum(udp, acc);
    acc = sum(payload, acc);
    let mut udp_sum = !fold(acc);
    if udp_sum == 0 {
        udp_sum = 0xffff; // zero means "no checksum"
    }
    udp[6..8].copy_from_slice(&udp_sum.to_be_bytes());
}

/// The ones'-complement sum of `bytes` as big-endian 16-bit words, added to `acc` (not yet
/// folded). Reads eight bytes at a time: the sum of 32-bit words folds to the same result.
fn sum(bytes: &[u8], mut acc: u64) -> u64 {
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_be_bytes(c.try_into().expect("8 bytes"));
        acc += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut rest = chunks.remainder().chunks_exact(2);
    for c in &mut rest {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = rest.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071's reference: one 16-bit word at a time.
    fn reference(bytes: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        for c in bytes.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from(c[0]) << 8
            };
            acc += u32::from(w);
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    #[test]
    fn checksums_verify_as_a_receiver_checks_them() {
        for len in [0usize, 1, 2, 7, 8, 9, 1199, 1200, 1452] {
            let src: SocketAddrV4 = "10.77.0.10:40000".parse().unwrap();
            let dst: SocketAddrV4 = "10.77.1.1:443".parse().unwrap();
            let mut p = vec![0u8; HEADERS + len];
            for b in &mut p[HEADERS..] {
                *b = fastrand::u8(..);
            }
            write_headers(&mut p, src, dst);
            // A receiver sums the header with its checksum in place: all ones.
            assert_eq!(reference(&p[..20]), 0xffff, "IP header, payload {len}");
            let mut pseudo = p[12..20].to_vec();
            pseudo.extend([0, 17]);
            pseudo.extend(((p.len() - 20) as u16).to_be_bytes());
            pseudo.extend(&p[20..]);
            assert_eq!(reference(&pseudo), 0xffff, "UDP checksum, payload {len}");
            assert_eq!(&p[12..16], &[10, 77, 0, 10]);
            assert_eq!(&p[16..20], &[10, 77, 1, 1]);
            assert_eq!(u16::from_be_bytes([p[20], p[21]]), 40000);
            assert_eq!(u16::from_be_bytes([p[22], p[23]]), 443);
            assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len());
        }
    }
}
