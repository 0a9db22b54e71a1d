//! Messages between the engine and its worker process over a stream socket, one socket per CUDA
//! stream: the engine sends [`Run`] (the batch is in the shared region), the worker answers
//! with a [`Reply`]. At start the worker sends one `Ready` (or `Failed`) on every socket.
//! Little-endian words; a reply's text is at most [`MAX_TEXT`] bytes.

use std::io::{Read, Write};

/// Longest reply text read (a device error's message).
pub(crate) const MAX_TEXT: usize = 4096;

/// A batch to run: its shape (the data is in the shared region).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub half: u32,
    pub keys: u32,
    pub items: u32,
}

impl Run {
    pub fn write(self, w: &mut impl Write) -> std::io::Result<()> {
        let mut b = [0u8; 12];
        for (i, v) in [self.half, self.keys, self.items].into_iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        w.write_all(&b)
    }

    /// `None` at end of stream (the engine closed the socket).
    pub fn read(r: &mut impl Read) -> std::io::Result<Option<Run>> {
        let mut b = [0u8; 12];
        match r.read_exact(&mut b) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let w = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        Ok(Some(Run {
            half: w(0),
            keys: w(1),
            items: w(2),
        }))
    }
}

/// The worker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Started: the device's description.
    Ready(String),
    /// Could not start (no device, no kernel): why. The worker exits after.
    Failed(String),
    /// The batch ran; the outputs are in the shared region.
    Done,
    /// The batch failed on the device: why. The worker exits after (a CUDA context that
    /// faulted stays faulted).
    Error(String),
}

impl Reply {
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        let (tag, text): (u32, &str) = match self {
            Reply::Ready(t) => (1, t),
            Reply::Failed(t) => (2, t),
            Reply::Done => (3, ""),
            Reply::Error(t) => (4, t),
        };
        let text = &text.as_bytes()[..text.len().min(MAX_TEXT)];
        let mut b = Vec::with_capacity(8 + text.len());
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&(text.len() as u32).to_le_bytes());
        b.extend_from_slice(text);
        w.write_all(&b)
    }

    pub fn read(r: &mut impl Read) -> std::io::Result<Reply> {
        let mut h = [0u8; 8];
        r.read_exact(&mut h)?;
        let tag = u32::from_le_bytes(h[..4].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(h[4..].try_into().expect("4 bytes")) as usize;
        if len > MAX_TEXT {
            return Err(std::io::Error::other(format!(
                "reply text of {len} bytes (at most {MAX_TEXT})"
            )));
        }
        let mut text = vec![0u8; len];
        r.read_exact(&mut text)?;
        let text = String::from_utf8_lossy(&text).into_owned();
        Ok(match tag {
            1 => Reply::Ready(text),
            2 => Reply::Failed(text),
            3 => Reply::Done,
            4 => Reply::Error(text),
            t => return Err(std::io::Error::other(format!("unknown reply tag {t}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_ones_are_refused() {
        let mut buf = Vec::new();
        let run = Run {
            half: 32,
            keys: 2,
            items: 4096,
        };
        run.write(&mut buf).unwrap();
        assert_eq!(Run::read(&mut &buf[..]).unwrap(), Some(run));
        assert_eq!(Run::read(&mut &[][..]).unwrap(), None, "end of stream");
        for reply in [
            Reply::Ready("H100".into()),
            Reply::Failed("no device".into()),
            Reply::Done,
            Reply::Error("illegal address".into()),
        ] {
            let mut buf = Vec::new();
            reply.write(&mut buf).unwrap();
            assert_eq!(Reply::read(&mut &buf[..]).unwrap(), reply);
        }
        let mut bad = 9u32.to_le_bytes().to_vec();
        bad.extend_from_slice(&0u32.to_le_bytes());
        assert!(Reply::read(&mut &bad[..]).is_err());
        let mut long = 4u32.to_le_bytes().to_vec();
        long.extend_from_slice(&(MAX_TEXT as u32 + 1).to_le_bytes());
        assert!(Reply::read(&mut &long[..]).is_err());
    }
}
