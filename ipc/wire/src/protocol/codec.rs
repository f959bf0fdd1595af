//! Encoding and decoding of [`Message`]s: the header, the fixed little-endian bodies of the hot
//! messages and the JSON bodies of the rare ones.

#![forbid(unsafe_code)]

use super::*;

pub(super) const READY_BODY: usize = 4 + 8 + 8 + 8 + 4;
pub(super) const RELEASE_BODY: usize = 4 + 8;
/// Bytes of a [`Stats`] body: three u64.
pub(crate) const STATS_BODY: usize = 3 * 8;

impl Message {
    /// The type number this message's header carries.
    pub fn kind(&self) -> MessageType {
        match self {
            Message::Attach(_) => MessageType::Attach,
            Message::Attached(_) => MessageType::Attached,
            Message::Ready(_) => MessageType::Ready,
            Message::Release(_) => MessageType::Release,
            Message::Detach => MessageType::Detach,
            Message::EndOfData => MessageType::EndOfData,
            Message::Error(_) => MessageType::Error,
            Message::Status => MessageType::Status,
            Message::StatusReply(_) => MessageType::StatusReply,
            Message::Stats(_) => MessageType::Stats,
            Message::BadSamples(_) => MessageType::BadSamples,
        }
    }

    /// An error message; the text is cut to [`MAX_ERROR_TEXT`] bytes.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Message {
        let mut message = message.into();
        if message.len() > MAX_ERROR_TEXT {
            let mut cut = MAX_ERROR_TEXT;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        Message::Error(ErrorMessage { code, message })
    }

    /// Appends the encoded message to `out` (cleared first).
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.kind() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        match self {
            Message::Attach(a) => a.write_json(out).map_err(EncodeError::Json)?,
            Message::Attached(a) => {
                serde_json::to_writer(&mut *out, a).map_err(EncodeError::Json)?
            }
            Message::Ready(r) => {
                out.extend_from_slice(&r.slot.to_le_bytes());
                out.extend_from_slice(&r.generation.to_le_bytes());
                out.extend_from_slice(&r.epoch.to_le_bytes());
                out.extend_from_slice(&r.step.to_le_bytes());
                out.extend_from_slice(&r.n.to_le_bytes());
            }
            Message::Release(r) => {
                out.extend_from_slice(&r.slot.to_le_bytes());
                out.extend_from_slice(&r.generation.to_le_bytes());
            }
            Message::StatusReply(s) => {
                serde_json::to_writer(&mut *out, s).map_err(EncodeError::Json)?
            }
            Message::BadSamples(b) => {
                serde_json::to_writer(&mut *out, b).map_err(EncodeError::Json)?
            }
            Message::Stats(st) => {
                out.extend_from_slice(&st.wait_ns.to_le_bytes());
                out.extend_from_slice(&st.compute_ns.to_le_bytes());
                out.extend_from_slice(&st.batches.to_le_bytes());
            }
            Message::Detach | Message::EndOfData | Message::Status => {}
            Message::Error(e) => {
                out.extend_from_slice(&(e.code as u16).to_le_bytes());
                out.extend_from_slice(e.message.as_bytes());
            }
        }
        if out.len() > MAX_MESSAGE_BYTES {
            return Err(EncodeError::TooLong(out.len()));
        }
        Ok(())
    }

    /// The encoded message, header included, in a new buffer.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Checks a datagram's header; returns its message type and body.
    fn decode_header(bytes: &[u8]) -> Result<(MessageType, &[u8]), DecodeError> {
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(DecodeError::TooLong(bytes.len()));
        }
        let Some((header, body)) = bytes.split_first_chunk::<HEADER_BYTES>() else {
            return Err(DecodeError::Short(bytes.len()));
        };
        let magic = [header[0], header[1]];
        if magic != MAGIC {
            return Err(DecodeError::Magic(magic));
        }
        let version = u16::from_le_bytes([header[2], header[3]]);
        if version != PROTOCOL_VERSION {
            return Err(DecodeError::Version {
                got: version,
                peer_version: super::version::peer_version(body),
            });
        }
        let ty = u16::from_le_bytes([header[4], header[5]]);
        let kind = MessageType::from_u16(ty).ok_or(DecodeError::UnknownType(ty))?;
        let reserved = u16::from_le_bytes([header[6], header[7]]);
        if reserved != 0 {
            return Err(DecodeError::Reserved(reserved));
        }
        Ok((kind, body))
    }

    /// Decodes one whole datagram. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        let (kind, body) = Message::decode_header(bytes)?;
        let want = |want: usize| {
            if body.len() == want {
                Ok(())
            } else {
                Err(DecodeError::BodyLength {
                    kind,
                    got: body.len(),
                    want,
                })
            }
        };
        let json_err = |e: serde_json::Error| DecodeError::Json {
            kind,
            reason: e.to_string(),
        };
        let mut r = Reader(body);
        Ok(match kind {
            MessageType::Attach => Message::Attach(Box::new(Attach::read_json(body)?)),
            MessageType::Attached => {
                Message::Attached(serde_json::from_slice(body).map_err(json_err)?)
            }
            MessageType::Ready => {
                want(READY_BODY)?;
                Message::Ready(Ready {
                    slot: r.u32(),
                    generation: r.u64(),
                    epoch: r.u64(),
                    step: r.u64(),
                    n: r.u32(),
                })
            }
            MessageType::Release => {
                want(RELEASE_BODY)?;
                Message::Release(Release {
                    slot: r.u32(),
                    generation: r.u64(),
                })
            }
            MessageType::Detach => {
                want(0)?;
                Message::Detach
            }
            MessageType::EndOfData => {
                want(0)?;
                Message::EndOfData
            }
            MessageType::Status => {
                want(0)?;
                Message::Status
            }
            MessageType::StatusReply => {
                Message::StatusReply(Box::new(serde_json::from_slice(body).map_err(json_err)?))
            }
            MessageType::Stats => {
                want(STATS_BODY)?;
                Message::Stats(Stats {
                    wait_ns: r.u64(),
                    compute_ns: r.u64(),
                    batches: r.u64(),
                })
            }
            MessageType::BadSamples => {
                Message::BadSamples(serde_json::from_slice(body).map_err(json_err)?)
            }
            MessageType::Error => Message::Error(decode_error(body)?),
        })
    }
}

impl ErrorMessage {
    /// Encodes this ERROR with `protocol` in its header instead of this build's version:
    /// ERROR's layout is the same in every protocol version, so a peer speaking `protocol`
    /// reads it (the answer to a peer of another version).
    pub fn encode_in_protocol(&self, protocol: u16) -> Result<Vec<u8>, EncodeError> {
        let mut bytes = Message::error(self.code, self.message.clone()).encode()?;
        bytes[2..4].copy_from_slice(&protocol.to_le_bytes());
        Ok(bytes)
    }
}

/// The body of an ERROR: a `u16` code, then UTF-8 text.
fn decode_error(body: &[u8]) -> Result<ErrorMessage, DecodeError> {
    let Some((code, text)) = body.split_first_chunk::<2>() else {
        return Err(DecodeError::BodyLength {
            kind: MessageType::Error,
            got: body.len(),
            want: 2,
        });
    };
    let code = u16::from_le_bytes(*code);
    let code = ErrorCode::from_u16(code).ok_or(DecodeError::UnknownErrorCode(code))?;
    let message = std::str::from_utf8(text)
        .map_err(|_| DecodeError::ErrorText)?
        .to_owned();
    Ok(ErrorMessage { code, message })
}

/// Reads fixed-size little-endian fields from a body whose length was checked beforehand;
/// reading past the end yields zeros rather than panicking.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        match self.0.split_first_chunk::<N>() {
            Some((head, rest)) => {
                self.0 = rest;
                *head
            }
            None => [0; N],
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}
