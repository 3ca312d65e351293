//! The base layer: helpers every other layer may use, which use nothing of
//! the crate themselves (a test checks it).
//!
//! - [`rounding`]: how figures and durations are printed.
//! - [`recurring`]: warnings about lasting conditions, said once, recalled
//!   now and then, their end said.
//! - [`raw_keys`]: tables whose keys are shared out among owners (a
//!   plugin's table and its capabilities).
//! - `test_guests` (tests only): where the test guest components are.

pub mod raw_keys;
pub mod recurring;
pub mod rounding;
#[cfg(test)]
pub(crate) mod test_guests;
