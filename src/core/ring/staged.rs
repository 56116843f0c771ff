//! [`stage_record`]: a short record's header and payload side by side in one stack buffer, so
//! the sink gets the whole record in one write (one call into the copy kernel, whole
//! write-combining lines) without zeroing a buffer per record.
#![allow(unsafe_code)] // two copies into uninitialised bytes and the view of them as initialised

use std::mem::MaybeUninit;

use super::layout::HEADER_LEN;

/// Records at most this long (header included) are staged; longer ones are written in two
/// pieces (header, payload), for which one more call into the copy kernel costs little.
pub(super) const SMALL_RECORD: usize = 256;

/// A stack buffer for [`stage_record`], left uninitialised (no stores until it is staged).
pub(super) type StageBuf = [MaybeUninit<u8>; SMALL_RECORD];

/// A fresh, uninitialised [`StageBuf`].
#[inline(always)]
pub(super) fn stage_buf() -> StageBuf {
    [MaybeUninit::uninit(); SMALL_RECORD]
}

/// Copies `header` and then `payload` to the start of `buf` and returns those bytes, or `None`
/// (nothing copied) when they are longer than [`SMALL_RECORD`].
#[inline]
pub(super) fn stage_record<'b>(
    buf: &'b mut StageBuf,
    header: &[u8; HEADER_LEN as usize],
    payload: &[u8],
) -> Option<&'b [u8]> {
    let len = header.len() + payload.len();
    if len > SMALL_RECORD {
        return None;
    }
    let dst = buf.as_mut_ptr().cast::<u8>();
    // SAFETY: `buf` has room for `len` bytes (checked above) and is borrowed exclusively, so it
    // overlaps neither source; `MaybeUninit<u8>` has the layout of `u8`. Afterwards
    // `buf[..len]` is initialised (the header, then the payload), which makes it a valid `&[u8]`;
    // the returned borrow keeps `buf` from being written while it lives.
    unsafe {
        std::ptr::copy_nonoverlapping(header.as_ptr(), dst, header.len());
        std::ptr::copy_nonoverlapping(payload.as_ptr(), dst.add(header.len()), payload.len());
        Some(std::slice::from_raw_parts(dst, len))
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn stages_header_then_payload_up_to_the_limit() {
        let header = [0xA5u8; 16];
        let mut buf = stage_buf();
        let payload: Vec<u8> = (0..240u8).collect();
        let staged = stage_record(&mut buf, &header, &payload).unwrap();
        assert_eq!(staged.len(), SMALL_RECORD);
        assert_eq!(&staged[..16], &header);
        assert_eq!(&staged[16..], &payload[..]);
        let mut buf = stage_buf();
        assert_eq!(stage_record(&mut buf, &header, &[]).unwrap(), &header);
        assert!(stage_record(&mut buf, &header, &[0; 241]).is_none());
    }
}
