//! A command's output as one offset space over stream-tagged chunks, of which the last
//! `window` bytes are retained (docs/commands.md §4.5).

use std::collections::VecDeque;

use crate::executor::supervisor_protocol::{Chunk, MAX_CHUNK, OutputDigest, OutputStream};

/// The retained output of one command.
#[derive(Debug)]
pub struct OutputRing {
    window: usize,
    chunks: VecDeque<Chunk>,
    retained: usize,
    next_offset: u64,
    digest: OutputDigest,
}

/// What a read from an offset returns.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OutputRead {
    /// The chunks, in offset order, at most the asked bytes.
    pub chunks: Vec<Chunk>,
    /// Offset of the first returned byte (the asked offset unless bytes were dropped).
    pub start_offset: u64,
    /// Offset after the last returned byte.
    pub next_offset: u64,
    /// Bytes between the asked offset and `start_offset` no longer retained.
    pub dropped_bytes: u64,
}

impl OutputRing {
    /// An empty ring keeping the last `window` bytes (at least one chunk's worth is kept
    /// whole, so `window` should be at least [`MAX_CHUNK`]).
    pub fn new(window: usize) -> Self {
        Self {
            window: window.max(1),
            chunks: VecDeque::new(),
            retained: 0,
            next_offset: 0,
            digest: OutputDigest::default(),
        }
    }

    /// Appends bytes of `stream`; adjacent bytes of one stream merge up to [`MAX_CHUNK`].
    pub fn push(&mut self, stream: OutputStream, mut bytes: &[u8]) {
        self.digest.update(stream, bytes);
        while !bytes.is_empty() {
            let merged = match self.chunks.back_mut() {
                Some(last) if last.stream == stream && last.data.len() < MAX_CHUNK => {
                    let room = MAX_CHUNK - last.data.len();
                    let take = room.min(bytes.len());
                    last.data.extend_from_slice(&bytes[..take]);
                    take
                }
                _ => 0,
            };
            let take = if merged > 0 {
                merged
            } else {
                let take = MAX_CHUNK.min(bytes.len());
                self.chunks.push_back(Chunk {
                    stream,
                    offset: self.next_offset,
                    data: bytes[..take].to_vec(),
                });
                take
            };
            self.next_offset += take as u64;
            self.retained += take;
            bytes = &bytes[take..];
        }
        self.evict();
    }

    fn evict(&mut self) {
        while self.retained > self.window {
            let excess = self.retained - self.window;
            let Some(first) = self.chunks.front_mut() else {
                break;
            };
            if first.data.len() <= excess {
                self.retained -= first.data.len();
                self.chunks.pop_front();
            } else {
                first.data.drain(..excess);
                first.offset += excess as u64;
                self.retained -= excess;
            }
        }
    }

    /// Offset of the oldest retained byte.
    pub fn window_start(&self) -> u64 {
        self.next_offset - self.retained as u64
    }

    /// Offset after the newest byte.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Bytes retained.
    pub fn retained(&self) -> usize {
        self.retained
    }

    /// The running digests of every byte ever pushed.
    pub fn digest(&self) -> &OutputDigest {
        &self.digest
    }

    /// Drops every retained byte (the offsets and digests stay).
    pub fn erase(&mut self) {
        self.chunks.clear();
        self.retained = 0;
    }

    /// Up to `max` bytes from `offset`; `None` when `offset` is past the end.
    pub fn read(&self, offset: u64, max: usize) -> Option<OutputRead> {
        if offset > self.next_offset {
            return None;
        }
        let start = offset.max(self.window_start());
        let mut read = OutputRead {
            start_offset: start,
            next_offset: start,
            dropped_bytes: start - offset,
            chunks: Vec::new(),
        };
        let mut budget = max;
        for chunk in &self.chunks {
            let end = chunk.offset + chunk.data.len() as u64;
            if end <= start {
                continue;
            }
            if budget == 0 {
                break;
            }
            let from = (start.max(chunk.offset) - chunk.offset) as usize;
            let take = (chunk.data.len() - from).min(budget);
            read.chunks.push(Chunk {
                stream: chunk.stream,
                offset: chunk.offset + from as u64,
                data: chunk.data[from..from + take].to_vec(),
            });
            budget -= take;
            read.next_offset = chunk.offset + (from + take) as u64;
        }
        Some(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(read: &OutputRead) -> Vec<u8> {
        read.chunks.iter().flat_map(|c| c.data.clone()).collect()
    }

    #[test]
    fn streams_share_one_offset_space_and_adjacent_bytes_merge() {
        let mut ring = OutputRing::new(1 << 20);
        ring.push(OutputStream::Stdout, b"ab");
        ring.push(OutputStream::Stdout, b"c");
        ring.push(OutputStream::Stderr, b"E");
        ring.push(OutputStream::Stdout, b"d");
        let read = ring.read(0, 100).unwrap();
        let shape: Vec<_> = read
            .chunks
            .iter()
            .map(|c| (c.stream, c.offset, c.data.clone()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (OutputStream::Stdout, 0, b"abc".to_vec()),
                (OutputStream::Stderr, 3, b"E".to_vec()),
                (OutputStream::Stdout, 4, b"d".to_vec()),
            ]
        );
        assert_eq!(read.next_offset, 5);
        let middle = ring.read(2, 2).unwrap();
        assert_eq!(bytes_of(&middle), b"cE");
        assert_eq!((middle.start_offset, middle.next_offset), (2, 4));
        assert_eq!(ring.read(5, 10).unwrap().chunks, vec![]);
        assert!(ring.read(6, 10).is_none());
    }

    #[test]
    fn bytes_past_the_window_are_dropped_and_counted() {
        let mut ring = OutputRing::new(4);
        ring.push(OutputStream::Stdout, b"0123");
        ring.push(OutputStream::Stderr, b"456");
        assert_eq!(ring.window_start(), 3);
        assert_eq!(ring.retained(), 4);
        let read = ring.read(1, 100).unwrap();
        assert_eq!(read.dropped_bytes, 2);
        assert_eq!(read.start_offset, 3);
        assert_eq!(bytes_of(&read), b"3456");
        assert_eq!(read.chunks[0].offset, 3);
        assert_eq!(read.chunks[1].offset, 4);
    }

    #[test]
    fn large_writes_split_into_bounded_chunks() {
        let mut ring = OutputRing::new(1 << 20);
        ring.push(OutputStream::Stdout, &vec![b'x'; MAX_CHUNK * 2 + 5]);
        let read = ring.read(0, usize::MAX).unwrap();
        assert_eq!(read.chunks.len(), 3);
        assert!(read.chunks.iter().all(|c| c.data.len() <= MAX_CHUNK));
        assert_eq!(read.next_offset, (MAX_CHUNK * 2 + 5) as u64);
    }
}
