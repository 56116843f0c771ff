//! Promises the type system keeps: kernel handles cannot outlive their module, reservations cannot
//! outlive their ring, safe writes need exclusive access.

#[test]
fn lifetimes_and_exclusivity_are_enforced_at_compile_time() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
