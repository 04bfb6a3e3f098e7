//! Positions, rest ids and the split of a decode step's positions into sinks, rest and window.
//! The conversion between a position and a rest id is written here once ([`Split::pos`],
//! [`Split::rest_upto`]).

use std::ops::Range;

/// A token position: a row of one KV head's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos(pub usize);

/// A key's id under a selector: its position − `sink` (ids `0..` cover the rest in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RestId(pub u32);

/// How positions `0..n` split at one step: the sinks `0..sink`, the rest `sink..end` (what
/// selectors choose from) and the recent window `end..n`. Sinks and window form the static set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// End of the sinks: the policy's `sink`, or `n` when fewer positions exist.
    pub sink: usize,
    /// End of the rest (start of the window).
    pub end: usize,
    /// Positions in the cache.
    pub n: usize,
}

impl Split {
    /// The split of `n` positions under `sink` sinks and a window of `window` positions (the
    /// window shrinks first when they do not fit: the rest is then empty).
    pub fn at(n: usize, sink: usize, window: usize) -> Self {
        let sink = sink.min(n);
        Split {
            sink,
            end: n.saturating_sub(window).max(sink),
            n,
        }
    }

    /// The rest's positions.
    pub fn rest(&self) -> Range<usize> {
        self.sink..self.end
    }

    /// Keys in the rest.
    pub fn rest_len(&self) -> usize {
        self.end - self.sink
    }

    /// The window's positions.
    pub fn window(&self) -> Range<usize> {
        self.end..self.n
    }

    /// The static positions, sinks then window.
    pub fn statics(&self) -> impl Iterator<Item = usize> + Clone {
        (0..self.sink).chain(self.window())
    }

    /// Keys in the static set.
    pub fn static_len(&self) -> usize {
        self.sink + self.n - self.end
    }

    /// The position of rest id `id`.
    pub fn pos(&self, id: RestId) -> Pos {
        Pos(self.sink + id.0 as usize)
    }

    /// Rest keys a query at position `p` sees (causally): ids `0..rest_upto(p)`.
    pub fn rest_upto(&self, p: Pos) -> usize {
        (p.0 + 1).saturating_sub(self.sink).min(self.rest_len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_converts() {
        let s = Split::at(1000, 128, 512);
        assert_eq!((s.sink, s.end, s.n), (128, 488, 1000));
        assert_eq!(s.rest_len(), 360);
        assert_eq!(s.static_len(), 640);
        assert_eq!(s.statics().count(), 640);
        assert_eq!(s.pos(RestId(0)), Pos(128));
        assert_eq!(s.pos(RestId(359)), Pos(487));
        assert_eq!(s.rest_upto(Pos(127)), 0);
        assert_eq!(s.rest_upto(Pos(128)), 1);
        assert_eq!(s.rest_upto(Pos(999)), 360);
        // Too few positions: the sinks take what exists, the rest is empty.
        let short = Split::at(100, 128, 512);
        assert_eq!((short.sink, short.end), (100, 100));
        let no_rest = Split::at(600, 128, 512);
        assert_eq!((no_rest.sink, no_rest.end), (128, 128));
        assert!(no_rest.rest().is_empty());
    }
}
