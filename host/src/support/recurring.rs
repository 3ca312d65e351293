//! Warnings about conditions that last: said in full once, then recalled at
//! a low rate, and their end said once.
//!
//! A lease record that cannot be read, a store that refuses every request:
//! the elector and the subscription meet these at every retry, several
//! times a second, for as long as nobody fixes them. Logging each one buries
//! everything else. [`Recurring`] tells its caller which occurrences to log.
//! It does no logging itself, so each call site keeps its own message and
//! fields.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use baton::support::recurring::{Note, Recurring};
//!
//! let mut unreadable = Recurring::new(Duration::from_secs(60));
//! let t0 = Instant::now();
//! assert_eq!(unreadable.note("bad record", t0), Note::First);
//! assert_eq!(unreadable.note("bad record", t0 + Duration::from_secs(1)), Note::Quiet);
//! assert_eq!(
//!     unreadable.note("bad record", t0 + Duration::from_secs(61)),
//!     Note::Reminder { repeats: 2, since: Duration::from_secs(61) }
//! );
//! // Something else is new, and said in full.
//! assert_eq!(unreadable.note("another fault", t0 + Duration::from_secs(62)), Note::First);
//! assert_eq!(unreadable.clear(t0 + Duration::from_secs(70)), Some(Duration::from_secs(8)));
//! assert_eq!(unreadable.clear(t0 + Duration::from_secs(71)), None);
//! ```

use std::time::{Duration, Instant};

/// How often a lasting condition is recalled: often enough that someone
/// reading the recent log sees it, rarely enough not to bury anything else.
pub const REMINDER_PERIOD: Duration = Duration::from_secs(60);

/// One lasting condition, known by its text (an error's message, which
/// names the lease and the file).
#[derive(Debug)]
pub struct Recurring {
    period: Duration,
    current: Option<Current>,
}

#[derive(Debug)]
struct Current {
    key: String,
    since: Instant,
    last_said: Instant,
    /// Occurrences not yet said.
    unsaid: u64,
}

/// What to do with one occurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Note {
    /// New: say it in full.
    First,
    /// Still there: recall it, with how many times it recurred since it
    /// was last said and how long it has lasted.
    Reminder {
        /// Occurrences since it was last said, this one included.
        repeats: u64,
        /// How long it has lasted.
        since: Duration,
    },
    /// Said recently: log it at debug level at most.
    Quiet,
}

impl Recurring {
    /// A condition recalled at most once per `period`.
    pub fn new(period: Duration) -> Recurring {
        Recurring {
            period,
            current: None,
        }
    }

    /// Notes one occurrence of the condition `key` at `now`.
    pub fn note(&mut self, key: &str, now: Instant) -> Note {
        match &mut self.current {
            Some(c) if c.key == key => {
                c.unsaid += 1;
                if now.saturating_duration_since(c.last_said) < self.period {
                    return Note::Quiet;
                }
                let note = Note::Reminder {
                    repeats: c.unsaid,
                    since: now.saturating_duration_since(c.since),
                };
                c.last_said = now;
                c.unsaid = 0;
                note
            }
            _ => {
                self.current = Some(Current {
                    key: key.to_owned(),
                    since: now,
                    last_said: now,
                    unsaid: 0,
                });
                Note::First
            }
        }
    }

    /// Ends the condition; returns how long it lasted, if there was one
    /// (then say that it is over).
    pub fn clear(&mut self, now: Instant) -> Option<Duration> {
        self.current
            .take()
            .map(|c| now.saturating_duration_since(c.since))
    }
}

impl Default for Recurring {
    fn default() -> Recurring {
        Recurring::new(REMINDER_PERIOD)
    }
}
