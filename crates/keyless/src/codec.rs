//! The keyless v1 wire format. Pure functions over bytes: no I/O, no panics on any input.
//!
//! Frame: `major=1, minor=0, length u16 (body), id u32`, then items `tag u8, len u16, data`.
//! A tag appears at most once; an unknown tag, a repeated tag or an item running past the
//! body is a format error.

use std::fmt;
use std::net::IpAddr;

pub const HEADER_LEN: usize = 8;
/// Requests and responses are padded to this many bytes in total.
pub const PADDED_LEN: usize = 1024;
pub const MAX_BODY: usize = u16::MAX as usize;

mod tag {
    pub const CERT_DIGEST: u8 = 0x01;
    pub const SNI: u8 = 0x02;
    pub const CLIENT_IP: u8 = 0x03;
    pub const SKI: u8 = 0x04;
    pub const SERVER_IP: u8 = 0x05;
    pub const OPCODE: u8 = 0x11;
    pub const PAYLOAD: u8 = 0x12;
    pub const PADDING: u8 = 0x20;
}

/// Operation codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    RsaDecrypt,
    RsaSignMd5Sha1,
    RsaSignSha1,
    RsaSignSha224,
    RsaSignSha256,
    RsaSignSha384,
    RsaSignSha512,
    RsaDecryptRaw,
    EcdsaSignMd5Sha1,
    EcdsaSignSha1,
    EcdsaSignSha224,
    EcdsaSignSha256,
    EcdsaSignSha384,
    EcdsaSignSha512,
    RsaPssSignSha256,
    RsaPssSignSha384,
    RsaPssSignSha512,
    Response,
    Ping,
    Pong,
    Error,
    /// A code this implementation does not know (answered with "bad opcode").
    Unknown(u8),
}

impl Op {
    pub fn code(self) -> u8 {
        use Op::*;
        match self {
            RsaDecrypt => 0x01,
            RsaSignMd5Sha1 => 0x02,
            RsaSignSha1 => 0x03,
            RsaSignSha224 => 0x04,
            RsaSignSha256 => 0x05,
            RsaSignSha384 => 0x06,
            RsaSignSha512 => 0x07,
            RsaDecryptRaw => 0x08,
            EcdsaSignMd5Sha1 => 0x12,
            EcdsaSignSha1 => 0x13,
            EcdsaSignSha224 => 0x14,
            EcdsaSignSha256 => 0x15,
            EcdsaSignSha384 => 0x16,
            EcdsaSignSha512 => 0x17,
            RsaPssSignSha256 => 0x35,
            RsaPssSignSha384 => 0x36,
            RsaPssSignSha512 => 0x37,
            Response => 0xF0,
            Ping => 0xF1,
            Pong => 0xF2,
            Error => 0xFF,
            Unknown(c) => c,
        }
    }

    pub fn from_code(c: u8) -> Op {
        use Op::*;
        match c {
            0x01 => RsaDecrypt,
            0x02 => RsaSignMd5Sha1,
            0x03 => RsaSignSha1,
            0x04 => RsaSignSha224,
            0x05 => RsaSignSha256,
            0x06 => RsaSignSha384,
            0x07 => RsaSignSha512,
            0x08 => RsaDecryptRaw,
            0x12 => EcdsaSignMd5Sha1,
            0x13 => EcdsaSignSha1,
            0x14 => EcdsaSignSha224,
            0x15 => EcdsaSignSha256,
            0x16 => EcdsaSignSha384,
            0x17 => EcdsaSignSha512,
            0x35 => RsaPssSignSha256,
            0x36 => RsaPssSignSha384,
            0x37 => RsaPssSignSha512,
            0xF0 => Response,
            0xF1 => Ping,
            0xF2 => Pong,
            0xFF => Error,
            c => Unknown(c),
        }
    }

    /// Opcodes only a server sends.
    pub fn is_response(self) -> bool {
        matches!(self, Op::Response | Op::Pong | Op::Error)
    }
}

/// Error codes carried by an [`Op::Error`] response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    CryptoFailed = 0x01,
    KeyNotFound = 0x02,
    Read = 0x03,
    VersionMismatch = 0x04,
    BadOpcode = 0x05,
    UnexpectedOpcode = 0x06,
    Format = 0x07,
    Internal = 0x08,
    CertNotFound = 0x09,
}

impl ErrorCode {
    pub fn from_byte(b: u8) -> Option<Self> {
        use ErrorCode::*;
        Some(match b {
            0x01 => CryptoFailed,
            0x02 => KeyNotFound,
            0x03 => Read,
            0x04 => VersionMismatch,
            0x05 => BadOpcode,
            0x06 => UnexpectedOpcode,
            0x07 => Format,
            0x08 => Internal,
            0x09 => CertNotFound,
            _ => return None,
        })
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorCode::CryptoFailed => "crypto failure",
            ErrorCode::KeyNotFound => "key not found",
            ErrorCode::Read => "read error",
            ErrorCode::VersionMismatch => "version mismatch",
            ErrorCode::BadOpcode => "bad opcode",
            ErrorCode::UnexpectedOpcode => "unexpected opcode",
            ErrorCode::Format => "format error",
            ErrorCode::Internal => "internal error",
            ErrorCode::CertNotFound => "certificate not found",
        };
        f.write_str(s)
    }
}

/// One message, request or response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    pub id: u32,
    pub opcode: Option<Op>,
    pub ski: Option<[u8; 20]>,
    pub cert_digest: Option<[u8; 32]>,
    pub sni: Option<Vec<u8>>,
    pub client_ip: Option<IpAddr>,
    pub server_ip: Option<IpAddr>,
    pub payload: Option<Vec<u8>>,
}

impl Message {
    pub fn request(id: u32, opcode: Op, ski: [u8; 20], payload: Vec<u8>) -> Self {
        Message {
            id,
            opcode: Some(opcode),
            ski: Some(ski),
            payload: Some(payload),
            ..Default::default()
        }
    }

    pub fn ping(id: u32, payload: Vec<u8>) -> Self {
        Message {
            id,
            opcode: Some(Op::Ping),
            payload: Some(payload),
            ..Default::default()
        }
    }

    pub fn response(id: u32, payload: Vec<u8>) -> Self {
        Message {
            id,
            opcode: Some(Op::Response),
            payload: Some(payload),
            ..Default::default()
        }
    }

    pub fn error(id: u32, code: ErrorCode) -> Self {
        Message {
            id,
            opcode: Some(Op::Error),
            payload: Some(vec![code as u8]),
            ..Default::default()
        }
    }
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("unsupported protocol version {major}.{minor}")]
    Version { major: u8, minor: u8, id: u32 },
    #[error("format error: {reason}")]
    Format { reason: &'static str, id: u32 },
    #[error("message too large to encode")]
    TooLarge,
}

impl FrameError {
    /// The id of the offending frame (to answer it with an error).
    pub fn id(&self) -> Option<u32> {
        match self {
            FrameError::Version { id, .. } | FrameError::Format { id, .. } => Some(*id),
            FrameError::TooLarge => None,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            FrameError::Version { .. } => ErrorCode::VersionMismatch,
            _ => ErrorCode::Format,
        }
    }
}

fn put_item(out: &mut Vec<u8>, tag: u8, data: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// Encodes `msg`; with `pad`, a padding item brings the frame to [`PADDED_LEN`] bytes when it
/// is shorter. Items are written in tag order.
pub fn encode(msg: &Message, pad: bool) -> Result<Vec<u8>, FrameError> {
    let mut body = Vec::with_capacity(PADDED_LEN);
    if let Some(d) = &msg.cert_digest {
        put_item(&mut body, tag::CERT_DIGEST, d);
    }
    if let Some(s) = &msg.sni {
        put_item(&mut body, tag::SNI, s);
    }
    if let Some(ip) = &msg.client_ip {
        put_item(&mut body, tag::CLIENT_IP, &ip_bytes(ip));
    }
    if let Some(ski) = &msg.ski {
        put_item(&mut body, tag::SKI, ski);
    }
    if let Some(ip) = &msg.server_ip {
        put_item(&mut body, tag::SERVER_IP, &ip_bytes(ip));
    }
    if let Some(op) = msg.opcode {
        put_item(&mut body, tag::OPCODE, &[op.code()]);
    }
    if let Some(p) = &msg.payload {
        if p.len() > MAX_BODY - 3 {
            return Err(FrameError::TooLarge);
        }
        put_item(&mut body, tag::PAYLOAD, p);
    }
    if pad && HEADER_LEN + body.len() + 3 <= PADDED_LEN {
        let filler = PADDED_LEN - HEADER_LEN - body.len() - 3;
        body.push(tag::PADDING);
        body.extend_from_slice(&(filler as u16).to_be_bytes());
        body.resize(body.len() + filler, 0);
    }
    if body.len() > MAX_BODY {
        return Err(FrameError::TooLarge);
    }
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(&msg.id.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// The total length of the frame at the start of `buf`, once its header is complete.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= HEADER_LEN).then(|| HEADER_LEN + u16::from_be_bytes([buf[2], buf[3]]) as usize)
}

/// Decodes one frame from the start of `buf`. `Ok(None)`: more bytes are needed.
/// `Ok(Some((msg, used)))`: a message and how many bytes it took.
pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>, FrameError> {
    let Some(total) = frame_len(buf) else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    let id = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if buf[0] != 1 {
        return Err(FrameError::Version {
            major: buf[0],
            minor: buf[1],
            id,
        });
    }
    let fmt = |reason| FrameError::Format { reason, id };
    let mut msg = Message {
        id,
        ..Default::default()
    };
    let mut seen = [false; 256];
    let mut body = &buf[HEADER_LEN..total];
    while !body.is_empty() {
        if body.len() < 3 {
            return Err(fmt("truncated item header"));
        }
        let t = body[0];
        let len = u16::from_be_bytes([body[1], body[2]]) as usize;
        let data = body.get(3..3 + len).ok_or(fmt("item runs past the body"))?;
        body = &body[3 + len..];
        if std::mem::replace(&mut seen[t as usize], true) {
            return Err(fmt("repeated tag"));
        }
        let ip = |d: &[u8]| -> Result<IpAddr, FrameError> {
            match d.len() {
                4 => Ok(IpAddr::from(<[u8; 4]>::try_from(d).expect("len 4"))),
                16 => Ok(IpAddr::from(<[u8; 16]>::try_from(d).expect("len 16"))),
                _ => Err(fmt("IP address must be 4 or 16 bytes")),
            }
        };
        match t {
            tag::CERT_DIGEST => {
                msg.cert_digest = Some(
                    data.try_into()
                        .map_err(|_| fmt("certificate digest must be 32 bytes"))?,
                )
            }
            tag::SNI => msg.sni = Some(data.to_vec()),
            tag::CLIENT_IP => msg.client_ip = Some(ip(data)?),
            tag::SKI => msg.ski = Some(data.try_into().map_err(|_| fmt("SKI must be 20 bytes"))?),
            tag::SERVER_IP => msg.server_ip = Some(ip(data)?),
            tag::OPCODE => match data {
                [c] => msg.opcode = Some(Op::from_code(*c)),
                _ => return Err(fmt("opcode must be 1 byte")),
            },
            tag::PAYLOAD => msg.payload = Some(data.to_vec()),
            tag::PADDING => {}
            _ => return Err(fmt("unknown tag")),
        }
    }
    Ok(Some((msg, total)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SKI: [u8; 20] = [0xAB; 20];

    /// Byte-exact encoding of a request with each signing opcode, padded to 1,024 bytes.
    #[test]
    fn every_opcode_encodes_byte_exact_with_padding() {
        let ops = [
            (Op::RsaDecrypt, 0x01u8),
            (Op::RsaSignMd5Sha1, 0x02),
            (Op::RsaSignSha1, 0x03),
            (Op::RsaSignSha224, 0x04),
            (Op::RsaSignSha256, 0x05),
            (Op::RsaSignSha384, 0x06),
            (Op::RsaSignSha512, 0x07),
            (Op::RsaDecryptRaw, 0x08),
            (Op::EcdsaSignMd5Sha1, 0x12),
            (Op::EcdsaSignSha1, 0x13),
            (Op::EcdsaSignSha224, 0x14),
            (Op::EcdsaSignSha256, 0x15),
            (Op::EcdsaSignSha384, 0x16),
            (Op::EcdsaSignSha512, 0x17),
            (Op::RsaPssSignSha256, 0x35),
            (Op::RsaPssSignSha384, 0x36),
            (Op::RsaPssSignSha512, 0x37),
            (Op::Ping, 0xF1),
        ];
        for (op, code) in ops {
            let payload = vec![0x5A; 32];
            let msg = Message::request(0x01020304, op, SKI, payload.clone());
            let bytes = encode(&msg, true).unwrap();
            let mut want = vec![0x01, 0x00, 0x03, 0xF8, 0x01, 0x02, 0x03, 0x04];
            want.extend_from_slice(&[0x04, 0x00, 0x14]);
            want.extend_from_slice(&SKI);
            want.extend_from_slice(&[0x11, 0x00, 0x01, code]);
            want.extend_from_slice(&[0x12, 0x00, 0x20]);
            want.extend_from_slice(&payload);
            // 8 + 23 + 4 + 35 = 70 bytes so far; padding item 3 + 951 bytes.
            want.extend_from_slice(&[0x20, 0x03, 0xB7]);
            want.resize(PADDED_LEN, 0);
            assert_eq!(bytes, want, "{op:?}");
            assert_eq!(bytes.len(), 1024);
            let (back, used) = decode(&bytes).unwrap().unwrap();
            assert_eq!(used, 1024);
            assert_eq!(back, msg);
        }
    }

    #[test]
    fn responses_encode_byte_exact() {
        let ok = encode(&Message::response(7, vec![1, 2, 3]), false).unwrap();
        assert_eq!(
            ok,
            [1, 0, 0, 10, 0, 0, 0, 7, 0x11, 0, 1, 0xF0, 0x12, 0, 3, 1, 2, 3]
        );
        let err = encode(&Message::error(7, ErrorCode::KeyNotFound), false).unwrap();
        assert_eq!(
            err,
            [1, 0, 0, 8, 0, 0, 0, 7, 0x11, 0, 1, 0xFF, 0x12, 0, 1, 0x02]
        );
        let pong = encode(
            &Message {
                opcode: Some(Op::Pong),
                ..Message::ping(9, vec![0xEE])
            },
            true,
        )
        .unwrap();
        assert_eq!(pong.len(), 1024);
        assert_eq!(
            &pong[..16],
            &[1, 0, 0x03, 0xF8, 0, 0, 0, 9, 0x11, 0, 1, 0xF2, 0x12, 0, 1, 0xEE]
        );
    }

    #[test]
    fn optional_items_round_trip() {
        let msg = Message {
            id: 42,
            opcode: Some(Op::EcdsaSignSha256),
            ski: Some(SKI),
            cert_digest: Some([3; 32]),
            sni: Some(b"example.com".to_vec()),
            client_ip: Some("192.0.2.1".parse().unwrap()),
            server_ip: Some("2001:db8::1".parse().unwrap()),
            payload: Some(vec![9; 48]),
        };
        let bytes = encode(&msg, false).unwrap();
        assert_eq!(decode(&bytes).unwrap().unwrap(), (msg, bytes.len()));
    }

    #[test]
    fn partial_frames_need_more_bytes() {
        let bytes = encode(&Message::ping(1, vec![1, 2]), true).unwrap();
        for cut in [0, 3, 7, 8, 500, 1023] {
            assert_eq!(decode(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn malformed_frames_are_format_errors_with_their_id() {
        let good = encode(
            &Message::request(5, Op::RsaSignSha256, SKI, vec![1; 32]),
            false,
        )
        .unwrap();
        // Unknown tag.
        let mut bad = good.clone();
        bad[8] = 0x7E;
        assert!(matches!(
            decode(&bad),
            Err(FrameError::Format {
                reason: "unknown tag",
                id: 5
            })
        ));
        // Repeated tag: two opcode items.
        let mut body = vec![0x11, 0, 1, 0x05, 0x11, 0, 1, 0x05];
        let mut rep = vec![1, 0, 0, body.len() as u8, 0, 0, 0, 6];
        rep.append(&mut body);
        assert!(matches!(
            decode(&rep),
            Err(FrameError::Format {
                reason: "repeated tag",
                id: 6
            })
        ));
        // Item running past the body.
        let past = [1, 0, 0, 4, 0, 0, 0, 7, 0x12, 0, 9, 0];
        assert!(matches!(
            decode(&past),
            Err(FrameError::Format {
                reason: "item runs past the body",
                ..
            })
        ));
        // Wrong major version.
        let mut v2 = good;
        v2[0] = 2;
        let e = decode(&v2).unwrap_err();
        assert_eq!(e.code(), ErrorCode::VersionMismatch);
        assert_eq!(e.id(), Some(5));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x = 0x2545F4914F6CDD1Du64;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 80) as usize;
            let mut b: Vec<u8> = (0..len).map(|i| (x >> (i % 56)) as u8).collect();
            if b.len() >= 4 {
                b[0] = 1;
                b[2] = 0;
                b[3] = (len.saturating_sub(8)) as u8;
            }
            let _ = decode(&b);
        }
    }
}
