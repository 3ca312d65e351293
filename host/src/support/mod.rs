//! The base layer: helpers every other layer may use, which use nothing of
//! the crate themselves (a test checks it).
//!
//! - [`rounding`]: how figures and durations are printed.
//! - [`recurring`]: warnings about lasting conditions, said once, recalled
//!   now and then, their end said.
//! - `test_guests` (tests only): where the test guest components are.

pub mod recurring;
pub mod rounding;
#[cfg(test)]
pub(crate) mod test_guests;
