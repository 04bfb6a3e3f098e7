//! [`Buf`]: a slice of plain values that either owns its memory or borrows it from a shared,
//! read-only file mapping, behind the same accessors. [`crate::KeyStore`] and
//! [`crate::graph::Csr`] hold their arrays in it, so an index opened from a file searches the
//! mapped pages directly (no copy), and one mapping serves every structure cut from it.

use bytemuck::Pod;
use memmap2::Mmap;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

/// A read-only byte region shared by the structures cut from it: a file mapping, or an
/// anonymous mapping holding a copy of caller bytes ([`crate::io::load_bytes`]). Page-aligned, so
/// every 64-byte-aligned offset inside it is aligned for any element type we store.
#[derive(Debug)]
pub struct Backing {
    map: Mmap,
}

impl Backing {
    pub(crate) fn new(map: Mmap) -> Self {
        Backing { map }
    }

    /// All bytes of the region.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// `T` values stored in a shared mapping: `len` values from byte `start` of `backing`.
/// Constructed only through [`Buf::mapped`], which checks range and alignment.
#[derive(Clone, Debug)]
pub struct Mapped<T> {
    backing: Arc<Backing>,
    bytes: Range<usize>,
    _t: PhantomData<T>,
}

/// An owned `Vec<T>` or a [`Mapped`] slice, read through [`Buf::as_slice`].
#[derive(Clone, Debug)]
pub enum Buf<T> {
    Owned(Vec<T>),
    Mapped(Mapped<T>),
}

impl<T> Default for Buf<T> {
    fn default() -> Self {
        Buf::Owned(Vec::new())
    }
}

impl<T: Pod> Buf<T> {
    /// `len` values of `T` at byte `start` of `backing`. Returns `None` when the range leaves
    /// the region, overflows, or is not aligned for `T`.
    pub fn mapped(backing: Arc<Backing>, start: usize, len: usize) -> Option<Self> {
        let end = len
            .checked_mul(std::mem::size_of::<T>())
            .and_then(|b| b.checked_add(start))?;
        let bytes = backing.bytes().get(start..end)?;
        bytemuck::try_cast_slice::<u8, T>(bytes).ok()?;
        Some(Buf::Mapped(Mapped {
            backing,
            bytes: start..end,
            _t: PhantomData,
        }))
    }

    /// The values.
    #[inline]
    pub fn as_slice(&self) -> &[T] {
        match self {
            Buf::Owned(v) => v,
            // The range and alignment were checked in `Buf::mapped` and the mapping never
            // changes, so this cast cannot fail; an empty slice is the unreachable fallback.
            Buf::Mapped(m) => {
                bytemuck::try_cast_slice(&m.backing.bytes()[m.bytes.clone()]).unwrap_or(&[])
            }
        }
    }

    /// The values as an owned vector, copying mapped values first (the mapping is read-only).
    pub fn to_mut(&mut self) -> &mut Vec<T> {
        if let Buf::Mapped(m) = self {
            let owned = bytemuck::try_cast_slice::<u8, T>(&m.backing.bytes()[m.bytes.clone()])
                .map(<[T]>::to_vec)
                .unwrap_or_default();
            *self = Buf::Owned(owned);
        }
        match self {
            Buf::Owned(v) => v,
            Buf::Mapped(_) => unreachable!("converted to owned above"),
        }
    }

    /// True when the values live in a file mapping.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Buf::Mapped(_))
    }
}
