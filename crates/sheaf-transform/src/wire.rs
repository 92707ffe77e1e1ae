//! What a service and its runner say to each other over the runner's stdin and stdout.
//!
//! Every message is one frame: a little-endian `u32` length, then that many bytes. A request
//! holds the program's source, the event's five fields and the run's limits; a reply is one tag
//! byte and what the tag needs. Strings and byte strings are themselves a `u32` length and the
//! bytes, so the event's data travels as it was published, never re-encoded.

use std::io::{self, Read};
use std::time::Duration;

use crate::{CompileError, Event, Limits, Output};

/// The largest frame either side reads: a program (16 KiB), an event and a body are far
/// smaller; anything larger means the other side is not speaking this protocol.
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// One run asked of a runner. It borrows everything: the pool encodes it straight from the
/// caller's event, and the runner decodes it in place in the frame it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request<'a> {
    pub source: &'a str,
    pub event: Event<'a>,
    pub limits: Limits,
}

/// What the runner made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Ran(Output),
    /// The program does not compile.
    Compile(CompileError),
    /// The run failed (a [`crate::RunError`], in words).
    Failed(String),
}

const SEND: u8 = 0;
const DROP: u8 = 1;
const COMPILE: u8 = 2;
const FAILED: u8 = 3;

impl<'a> Request<'a> {
    pub fn encode(&self) -> Vec<u8> {
        let event = &self.event;
        let strings = [
            self.source.as_bytes(),
            event.id.as_bytes(),
            event.topic.as_bytes(),
            event.data,
            event.tenant_id.as_bytes(),
        ];
        let length = strings.iter().map(|s| 4 + s.len()).sum::<usize>() + 16;
        let mut out = Frame::with_capacity(length);
        for string in strings {
            out.bytes(string);
        }
        out.u64(self.limits.max_body_bytes as u64);
        out.u64(u64::try_from(self.limits.max_time.as_micros()).unwrap_or(u64::MAX));
        out.finish()
    }

    pub fn decode(frame: &'a [u8]) -> io::Result<Self> {
        let mut at = Cursor(frame);
        let request = Request {
            source: at.str()?,
            event: Event {
                id: at.str()?,
                topic: at.str()?,
                data: at.bytes()?,
                tenant_id: at.str()?,
            },
            limits: Limits {
                max_body_bytes: usize::try_from(at.u64()?).unwrap_or(usize::MAX),
                max_time: Duration::from_micros(at.u64()?),
            },
        };
        at.end()?;
        Ok(request)
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Frame::new();
        match self {
            Reply::Ran(Output::Send { body, headers }) => {
                out.u8(SEND);
                out.bytes(body);
                out.u64(headers.len() as u64);
                for (name, value) in headers {
                    out.bytes(name.as_bytes());
                    out.bytes(value.as_bytes());
                }
            }
            Reply::Ran(Output::Drop) => out.u8(DROP),
            Reply::Compile(e) => {
                out.u8(COMPILE);
                out.bytes(e.message.as_bytes());
                out.u64(e.line as u64);
                out.u64(e.column as u64);
            }
            Reply::Failed(message) => {
                out.u8(FAILED);
                out.bytes(message.as_bytes());
            }
        }
        out.finish()
    }

    pub fn decode(frame: &[u8]) -> io::Result<Self> {
        let mut at = Cursor(frame);
        let reply = match at.u8()? {
            SEND => {
                let body = at.bytes()?.to_vec();
                let count = at.u64()?;
                let mut headers = Vec::new();
                for _ in 0..count {
                    headers.push((at.string()?, at.string()?));
                }
                Reply::Ran(Output::Send { body, headers })
            }
            DROP => Reply::Ran(Output::Drop),
            COMPILE => Reply::Compile(CompileError {
                message: at.string()?,
                line: usize::try_from(at.u64()?).unwrap_or(0),
                column: usize::try_from(at.u64()?).unwrap_or(0),
            }),
            FAILED => Reply::Failed(at.string()?),
            other => return Err(malformed(format!("unknown reply tag {other}"))),
        };
        at.end()?;
        Ok(reply)
    }
}

/// Reads one frame; `None` at a clean end of input (the other side closed its end).
pub(crate) fn read_frame(input: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut length = [0u8; 4];
    match input.read_exact(&mut length) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let length = frame_length(length)?;
    let mut frame = vec![0; length];
    input.read_exact(&mut frame)?;
    Ok(Some(frame))
}

/// The length a frame's first four bytes announce, refused past [`MAX_FRAME`].
pub(crate) fn frame_length(prefix: [u8; 4]) -> io::Result<usize> {
    let length = u32::from_le_bytes(prefix) as usize;
    if length > MAX_FRAME {
        return Err(malformed(format!(
            "a frame of {length} bytes, more than {MAX_FRAME}"
        )));
    }
    Ok(length)
}

fn malformed(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// A frame being written: its length is filled in by `finish`.
struct Frame(Vec<u8>);

impl Frame {
    fn new() -> Self {
        Frame::with_capacity(0)
    }
    /// A frame with room for `length` bytes after its prefix.
    fn with_capacity(length: usize) -> Self {
        let mut bytes = Vec::with_capacity(4 + length);
        bytes.extend_from_slice(&[0; 4]);
        Frame(bytes)
    }
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        // Every field is far below 4 GiB: the frame as a whole is bounded by MAX_FRAME.
        self.0
            .extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_le_bytes());
        self.0.extend_from_slice(v);
    }
    fn finish(mut self) -> Vec<u8> {
        let length = u32::try_from(self.0.len() - 4).unwrap_or(u32::MAX);
        self.0[..4].copy_from_slice(&length.to_le_bytes());
        self.0
    }
}

/// A frame being read.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(malformed("a frame ends early".to_owned()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> io::Result<u64> {
        let bytes = self.take(8)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("eight bytes")))
    }
    fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let length = self.take(4)?;
        let length = u32::from_le_bytes(length.try_into().expect("four bytes")) as usize;
        self.take(length)
    }
    fn str(&mut self) -> io::Result<&'a str> {
        std::str::from_utf8(self.bytes()?)
            .map_err(|_| malformed("a string that is not UTF-8".to_owned()))
    }
    fn string(&mut self) -> io::Result<String> {
        self.str().map(str::to_owned)
    }
    fn end(&self) -> io::Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(malformed(format!("{} bytes after a message", self.0.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_survive_the_trip() {
        let request = Request {
            source: ".data",
            event: Event {
                id: "evt_1",
                topic: "order.paid",
                data: br#"{"a": "\u00e9"}"#,
                tenant_id: "acme",
            },
            limits: Limits::default(),
        };
        let frame = request.encode();
        let mut input = &frame[..];
        let read = read_frame(&mut input).unwrap().unwrap();
        assert_eq!(Request::decode(&read).unwrap(), request);
        assert_eq!(read_frame(&mut input).unwrap(), None, "a clean end");

        for reply in [
            Reply::Ran(Output::Send {
                body: b"{}".to_vec(),
                headers: vec![("x-a".to_owned(), "1".to_owned())],
            }),
            Reply::Ran(Output::Drop),
            Reply::Compile(CompileError {
                message: "expected term".to_owned(),
                line: 2,
                column: 7,
            }),
            Reply::Failed("no".to_owned()),
        ] {
            let frame = reply.encode();
            let read = read_frame(&mut &frame[..]).unwrap().unwrap();
            assert_eq!(Reply::decode(&read).unwrap(), reply);
        }
    }

    #[test]
    fn what_is_not_a_frame_is_refused() {
        let huge = u32::try_from(MAX_FRAME + 1).unwrap().to_le_bytes();
        assert!(read_frame(&mut &huge[..]).is_err(), "too long");
        let mut frame = Reply::Ran(Output::Drop).encode();
        frame.push(0);
        frame[0] += 1;
        let read = read_frame(&mut &frame[..]).unwrap().unwrap();
        assert!(Reply::decode(&read).is_err(), "trailing bytes");
        assert!(Reply::decode(&[9]).is_err(), "unknown tag");
        assert!(Request::decode(&[1, 0]).is_err(), "cut short");
    }
}
