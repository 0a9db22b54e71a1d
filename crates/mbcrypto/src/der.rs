//! Just enough DER to read private keys: PKCS#8 PrivateKeyInfo, PKCS#1 RSAPrivateKey and
//! SEC1 ECPrivateKey. Never logs or formats what it reads.

/// One TLV at the start of `der`: (tag, contents, rest).
pub fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, b| (a << 8) | *b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// An INTEGER's magnitude without leading zero bytes (negative integers are refused).
fn unsigned(contents: &[u8]) -> Option<&[u8]> {
    if contents.first().is_some_and(|b| b & 0x80 != 0) {
        return None;
    }
    let start = contents
        .iter()
        .position(|&b| b != 0)
        .unwrap_or(contents.len());
    Some(&contents[start..])
}

/// The RSAPrivateKey fields: n, e, d, p, q, dp, dq, qinv (big-endian magnitudes).
pub struct RsaFields<'a> {
    pub n: &'a [u8],
    pub e: &'a [u8],
    pub p: &'a [u8],
    pub q: &'a [u8],
    pub dp: &'a [u8],
    pub dq: &'a [u8],
    pub qinv: &'a [u8],
}

/// Reads a PKCS#1 RSAPrivateKey, or one wrapped in PKCS#8; the flag says it was PKCS#8.
pub fn rsa_private_key(der: &[u8]) -> Option<(RsaFields<'_>, bool)> {
    let (tag, seq, _) = tlv(der)?;
    if tag != 0x30 {
        return None;
    }
    // PKCS#8: version INTEGER, AlgorithmIdentifier SEQUENCE, privateKey OCTET STRING.
    let (t0, _, rest) = tlv(seq)?;
    let (t1, _, rest1) = tlv(rest)?;
    if t0 == 0x02 && t1 == 0x30 {
        let (t2, inner, _) = tlv(rest1)?;
        if t2 != 0x04 {
            return None;
        }
        return rsa_private_key(inner).map(|(f, _)| (f, true));
    }
    let mut ints = Vec::with_capacity(9);
    let mut cur = seq;
    while ints.len() < 9 {
        let (t, c, rest) = tlv(cur)?;
        if t != 0x02 {
            return None;
        }
        ints.push(unsigned(c)?);
        cur = rest;
    }
    Some((
        RsaFields {
            n: ints[1],
            e: ints[2],
            p: ints[4],
            q: ints[5],
            dp: ints[6],
            dq: ints[7],
            qinv: ints[8],
        },
        false,
    ))
}

/// The private scalar of a SEC1 ECPrivateKey, or one wrapped in PKCS#8.
#[allow(dead_code)] // used by the P-256 module
pub(crate) fn ec_private_scalar(der: &[u8]) -> Option<&[u8]> {
    let (tag, seq, _) = tlv(der)?;
    if tag != 0x30 {
        return None;
    }
    let (t0, _, rest) = tlv(seq)?;
    let (t1, c1, rest1) = tlv(rest)?;
    if t0 != 0x02 {
        return None;
    }
    match t1 {
        0x04 => Some(c1), // SEC1: version, privateKey OCTET STRING
        0x30 => {
            let (t2, inner, _) = tlv(rest1)?; // PKCS#8: privateKey OCTET STRING
            if t2 != 0x04 {
                return None;
            }
            ec_private_scalar(inner)
        }
        _ => None,
    }
}
