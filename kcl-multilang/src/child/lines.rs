//! A child's stdout and stderr, line by line: a line over 1 MiB or not UTF-8 is skipped (and
//! said so), not the end of the pipe.

use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, FramedRead, LinesCodec, LinesCodecError};

use super::{MAX_LINE, SHOWN};

/// One line of a child's stdout or stderr.
#[derive(Debug)]
pub(super) enum Line {
    Text(String),
    /// Over [`MAX_LINE`]: skipped, up to its end.
    TooLong,
    /// Not UTF-8: skipped.
    NotUtf8,
}

/// [`LinesCodec`] with a line it refuses skipped rather than the end of the stream (a
/// `FramedRead` ends at its decoder's first error).
#[derive(Debug)]
pub(super) struct ChildLines(LinesCodec);

impl ChildLines {
    pub(super) fn reader<R: tokio::io::AsyncRead>(pipe: R) -> FramedRead<R, Self> {
        FramedRead::new(pipe, Self(LinesCodec::new_with_max_length(MAX_LINE)))
    }
}

impl Decoder for ChildLines {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        skip_refused(self.0.decode(buf))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        skip_refused(self.0.decode_eof(buf))
    }
}

pub(super) fn skip_refused(
    decoded: Result<Option<String>, LinesCodecError>,
) -> std::io::Result<Option<Line>> {
    match decoded {
        Ok(line) => Ok(line.map(Line::Text)),
        // The codec discards the rest of the line on its next calls.
        Err(LinesCodecError::MaxLineLengthExceeded) => Ok(Some(Line::TooLong)),
        // The codec's only error of its own, raised after it took the line out.
        Err(LinesCodecError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
            Ok(Some(Line::NotUtf8))
        }
        Err(LinesCodecError::Io(e)) => Err(e),
    }
}

/// A line cut to what a log line should show.
pub(super) fn shown(line: &str) -> &str {
    match line.char_indices().nth(SHOWN) {
        Some((at, _)) => &line[..at],
        None => line,
    }
}
