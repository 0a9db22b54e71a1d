//! The one thing the balancer reads from a QUIC datagram: its destination connection ID
//! (RFC 9000 §17, the invariants of RFC 8999 §5, so any QUIC version parses).

/// Where a datagram's destination connection ID is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dcid<'a> {
    /// A long header (Initial, 0-RTT, Handshake, Retry or another version's): its ID, whole.
    Long(&'a [u8]),
    /// A short header: the ID's length is not in the packet, so this is every byte after the
    /// first, up to the longest ID (20 bytes); the reader knows the length from elsewhere.
    Short(&'a [u8]),
}

/// The longest connection ID QUIC version 1 allows.
const MAX_CID: usize = 20;

/// The datagram's destination connection ID, or `None` when the datagram cannot be QUIC:
/// empty, a long header cut short or with an ID above 20 bytes (versions past 1 may allow
/// longer IDs; no gateway issues them), or a short header with no ID byte.
pub(crate) fn dcid(datagram: &[u8]) -> Option<Dcid<'_>> {
    let (&first, rest) = datagram.split_first()?;
    if first & 0x80 != 0 {
        // Long header: version (4 bytes), DCID length (1 byte), DCID.
        let len = *rest.get(4)? as usize;
        if len > MAX_CID {
            return None;
        }
        return rest.get(5..5 + len).map(Dcid::Long);
    }
    if rest.is_empty() {
        return None;
    }
    Some(Dcid::Short(&rest[..rest.len().min(MAX_CID)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_and_short_headers() {
        let mut initial = vec![0xc3, 0, 0, 0, 1, 8];
        initial.extend(1..=8u8);
        initial.extend([4, 9, 9, 9, 9]);
        initial.resize(1200, 0);
        assert_eq!(dcid(&initial), Some(Dcid::Long(&[1, 2, 3, 4, 5, 6, 7, 8])));
        // A zero-length ID is a valid long header.
        assert_eq!(dcid(&[0xc0, 0, 0, 0, 1, 0, 0]), Some(Dcid::Long(&[])));
        let mut short = vec![0x41];
        short.extend(0..40u8);
        assert_eq!(dcid(&short), Some(Dcid::Short(&short[1..21])));
        assert_eq!(dcid(&[0x41, 7]), Some(Dcid::Short(&[7])));
    }

    #[test]
    fn malformed_datagrams_have_no_id() {
        assert_eq!(dcid(&[]), None);
        assert_eq!(dcid(&[0x40]), None);
        assert_eq!(dcid(&[0xc0, 0, 0, 0]), None);
        assert_eq!(dcid(&[0xc0, 0, 0, 0, 1, 8, 1, 2]), None);
        assert_eq!(dcid(&[0xc0, 0, 0, 0, 1, 21]), None);
    }
}
