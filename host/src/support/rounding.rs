//! The rounding of every figure people read: log fields (`after_ms=1.3`),
//! durations in messages (`1.23s`, `850ms`) and `baton status`'s seconds.
//! One place, so that a figure reads the same wherever it is printed.

use std::time::Duration;

/// A duration in milliseconds, rounded to a tenth: the value of every
/// `_ms` log field (`after_ms=1.3`, not `1.3040770000000002`). A number,
/// so JSON logs keep a number.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(baton::support::rounding::ms(Duration::from_nanos(1_304_077)), 1.3);
/// assert_eq!(baton::support::rounding::ms(Duration::from_micros(1_690_133)), 1690.1);
/// ```
pub fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// A duration in seconds, rounded to a hundredth: the seconds figures of
/// `baton status`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(baton::support::rounding::secs(Duration::from_millis(3_717)), 3.72);
/// ```
pub fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 100.0).round() / 100.0
}

/// A duration written for people: under a second in milliseconds with at
/// most one decimal (`850ms`, `12.3ms`), from a second on in seconds with
/// at most two (`1s`, `1.5s`, `2.34s`). The same for `{}` and `{:?}`, so
/// a log field keeps its name and reads the same whether it is recorded
/// with `%` or `?`; also used in error messages that name a duration.
///
/// ```
/// use std::time::Duration;
/// use baton::support::rounding::human;
/// assert_eq!(human(Duration::from_nanos(1_234_567_891)).to_string(), "1.23s");
/// assert_eq!(human(Duration::from_micros(12_345)).to_string(), "12.3ms");
/// assert_eq!(human(Duration::from_millis(500)).to_string(), "500ms");
/// assert_eq!(human(Duration::from_micros(999_960)).to_string(), "1s");
/// assert_eq!(human(Duration::ZERO).to_string(), "0ms");
/// ```
pub fn human(d: Duration) -> Human {
    Human(d)
}

/// See [`human`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Human(pub Duration);

impl std::fmt::Display for Human {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tenths_of_ms = (self.0.as_secs_f64() * 1e4).round();
        if tenths_of_ms < 10_000.0 {
            return write!(f, "{}ms", tenths_of_ms / 10.0);
        }
        write!(f, "{}s", secs(self.0))
    }
}

impl std::fmt::Debug for Human {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_rounded_for_people() {
        assert_eq!(ms(Duration::from_nanos(1_304_077)), 1.3);
        assert_eq!(ms(Duration::from_nanos(1_015_229)).to_string(), "1");
        assert_eq!(format!("{:?}", ms(Duration::from_nanos(1_690_133))), "1.7");
        assert_eq!(secs(Duration::from_millis(3_717)), 3.72);
        assert_eq!(secs(Duration::from_millis(3_700)).to_string(), "3.7");
        for (d, text) in [
            (Duration::ZERO, "0ms"),
            (Duration::from_nanos(40_000), "0ms"),
            (Duration::from_nanos(1_015_229), "1ms"),
            (Duration::from_micros(12_345), "12.3ms"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_micros(999_940), "999.9ms"),
            (Duration::from_micros(999_960), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_nanos(1_234_567_891), "1.23s"),
            (Duration::from_secs(300), "300s"),
        ] {
            assert_eq!(human(d).to_string(), text, "{d:?}");
            assert_eq!(format!("{:?}", human(d)), text, "{d:?}");
        }
    }
}
