//! The term a Store's instance runs in, set once, when the instance starts
//! in a term.
//!
//! A Store is usually made for its term. An instance *prepared* ahead (see
//! [`Prepared`](super::plugin::Prepared)) is made while this host follows,
//! before any term exists; until its term is set, its [`StoreTerm`] reads as
//! a term that was over before it began (number 0, force-stop time in the
//! past), so the host-call fence and the epoch check trap anything it tries
//! while being prepared, and the host falls back to a fresh instance.
//!
//! Invariant: once set, the term never changes; every part of the Store
//! (its output, connections, HTTP hooks, buckets, fence) reads the same
//! one.
//!
//! ```
//! use std::time::Duration;
//! use baton::election::{Term, TermClock};
//! use baton::runtime::StoreTerm;
//!
//! let before = StoreTerm::unset("demo");
//! assert!(before.must_stop() && before.number() == 0);
//! let clock = TermClock::system();
//! let term = Term::begin("demo", 7, Duration::ZERO, clock.clone(), clock.now() + Duration::from_secs(60));
//! before.set(term).unwrap();
//! assert!(!before.must_stop() && before.number() == 7);
//! ```

use std::ops::Deref;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::election::{Moment, Term, TermClock};

/// The term of one Store (cheap to clone: shared); see the
/// [module documentation](self). Reads as the [`Term`] it holds.
#[derive(Clone, Debug)]
pub struct StoreTerm(Arc<Slot>);

#[derive(Debug)]
struct Slot {
    term: OnceLock<Arc<Term>>,
    /// What it reads as until then: a term of the same lease, over from
    /// the clock's origin, with no grace (for a Store made for its term,
    /// that term).
    unset: Arc<Term>,
}

/// The term was already set.
#[derive(Debug, thiserror::Error)]
#[error("the instance's term is already set")]
pub struct AlreadySet;

impl StoreTerm {
    /// The term of a Store made for `term`.
    pub fn of(term: Arc<Term>) -> StoreTerm {
        StoreTerm(Arc::new(Slot {
            term: OnceLock::from(term.clone()),
            // Never read: the term is set.
            unset: term,
        }))
    }

    /// The term of a Store of `lease` prepared before its term: over until
    /// [`set`](Self::set).
    pub fn unset(lease: &str) -> StoreTerm {
        let over = Term::begin(
            lease,
            0,
            Duration::ZERO,
            TermClock::system(),
            Moment::from_nanos(0),
        );
        StoreTerm(Arc::new(Slot {
            term: OnceLock::new(),
            unset: over,
        }))
    }

    /// Sets the term the instance starts in; once only.
    pub fn set(&self, term: Arc<Term>) -> Result<(), AlreadySet> {
        self.0.term.set(term).map_err(|_| AlreadySet)
    }

    /// Whether the term is set.
    pub fn is_set(&self) -> bool {
        self.0.term.get().is_some()
    }
}

impl Deref for StoreTerm {
    type Target = Arc<Term>;

    #[inline]
    fn deref(&self) -> &Arc<Term> {
        self.0.term.get().unwrap_or(&self.0.unset)
    }
}
