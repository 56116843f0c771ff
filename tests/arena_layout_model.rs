//! Property tests of the arena's offset arithmetic against a byte-by-byte model.

use proptest::prelude::*;
use vkgdr::arena::ArenaLayout;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn split_covers_the_range_exactly_and_never_crosses_a_chunk(
        chunk in 1u64..5000,
        offset in 0u64..1_000_000,
        len in 0u64..100_000,
    ) {
        let layout = ArenaLayout::new(chunk).unwrap();
        let pieces: Vec<_> = layout.split(offset, len).collect();
        // Pieces are contiguous, in order, and add up to the range.
        let mut pos = offset;
        for &(c, within, piece) in &pieces {
            prop_assert!(piece > 0);
            prop_assert!(within + piece <= chunk, "piece crosses a chunk end");
            prop_assert_eq!(c as u64 * chunk + within, pos);
            prop_assert_eq!(layout.locate(pos), (c, within));
            pos += piece;
        }
        prop_assert_eq!(pos, offset + len);
        // Every piece but the last ends exactly at a chunk boundary (minimal splitting).
        for &(_, within, piece) in pieces.iter().rev().skip(1) {
            prop_assert_eq!(within + piece, chunk);
        }
    }

    #[test]
    fn locate_inverts_chunk_arithmetic(chunk in 1u64..1 << 40, offset in 0u64..1 << 60) {
        let (c, within) = ArenaLayout::new(chunk).unwrap().locate(offset);
        prop_assert!(within < chunk);
        prop_assert_eq!(c as u64 * chunk + within, offset);
    }
}
