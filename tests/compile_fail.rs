//! Promises the type system keeps: kernel handles cannot outlive their module, reservations cannot
//! outlive their ring, safe writes need exclusive access; the traits whose implementations safe
//! code trusts (`Mapping`, `ChunkSource`, `ChunkMemory`) need an `unsafe impl`; a context guard
//! stays on its thread; a pinned buffer's bytes are never a safe `&[u8]`; a ring's sink is
//! `unsafe` to call.

#[test]
fn lifetimes_and_exclusivity_are_enforced_at_compile_time() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
