//! The process's allocator (mimalloc in the static musl image, the system allocator elsewhere),
//! wrapped to count the bytes each thread holds, and the [`Meter`] that reads that count.
//!
//! Counting is two thread-local cells per allocation (no atomics, no locks): a thread's live bytes
//! and the highest they reached since the innermost meter started. A meter gives the code on its
//! thread a limit; [`over_limit`] is what a decode asks at each value (`metered.rs`). The allocator
//! itself never refuses: an allocation that fails is the process's end, so the refusal is the
//! decoder's, one value after the limit is passed.
//!
//! The one file of the crate with `unsafe`: a global allocator is an `unsafe` trait.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::marker::PhantomData;

#[cfg(target_env = "musl")]
type Inner = mimalloc::MiMalloc;
#[cfg(not(target_env = "musl"))]
type Inner = std::alloc::System;

// musl's allocator costs several times glibc's on the many small allocations of decoding a review,
// so the static image uses mimalloc (its arena commit default is set in .cargo/config.toml); glibc
// builds (tests, development) keep the system allocator. Either is counted.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: Counting<Inner> = Counting(mimalloc::MiMalloc);
#[cfg(not(target_env = "musl"))]
#[global_allocator]
static ALLOCATOR: Counting<Inner> = Counting(std::alloc::System);

thread_local! {
    /// Bytes allocated by this thread and not freed by it (negative when it frees what another
    /// thread allocated).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The highest `LIVE` since the innermost meter started.
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// `LIVE` past which the innermost meter's code is over its limit.
    static LIMIT: Cell<isize> = const { Cell::new(isize::MAX) };
}

/// An allocator that counts what each thread holds.
pub struct Counting<A>(A);

#[inline]
fn grew(bytes: usize) {
    let live = LIVE.get().wrapping_add(bytes as isize);
    LIVE.set(live);
    if live > PEAK.get() {
        PEAK.set(live);
    }
}

#[inline]
fn shrank(bytes: usize) {
    LIVE.set(LIVE.get().wrapping_sub(bytes as isize));
}

// SAFETY: every call is handed to the inner allocator unchanged; the wrapper only adds to or takes
// from thread-local counters (const-initialised cells without destructors, so reading them never
// allocates and works until the thread's very end).
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on as it is.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as `alloc`.
        unsafe { self.0.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // A moved block briefly holds both sizes; the count takes the difference.
            match new_size.checked_sub(layout.size()) {
                Some(more) => grew(more),
                None => shrank(layout.size() - new_size),
            }
        }
        p
    }
}

/// Counts what the code on this thread allocates from its start until it is dropped, with a limit
/// that [`over_limit`] reports passed. Meters nest: an inner one's limit is never beyond its outer's,
/// and the outer's peak includes the inner's. Not `Send`: it reads the thread it was started on.
#[must_use]
pub struct Meter {
    start: isize,
    outer_peak: isize,
    outer_limit: isize,
    limit: usize,
    _thread: PhantomData<*const ()>,
}

/// A meter's limit was passed: what it was, and the peak reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("it took more than {limit} bytes (reached {peak})")]
pub struct OverLimit {
    pub limit: usize,
    pub peak: usize,
}

impl Meter {
    /// Starts counting on this thread, allowing `limit` bytes more than it holds now.
    pub fn start(limit: usize) -> Self {
        let live = LIVE.get();
        let outer_peak = PEAK.replace(live);
        let own = live.saturating_add(isize::try_from(limit).unwrap_or(isize::MAX));
        let outer_limit = LIMIT.replace(own.min(LIMIT.get()));
        Self {
            start: live,
            outer_peak,
            outer_limit,
            limit,
            _thread: PhantomData,
        }
    }

    /// The most this thread held above the start, so far.
    pub fn peak(&self) -> usize {
        usize::try_from(PEAK.get().saturating_sub(self.start)).unwrap_or(0)
    }

    /// `Err` once the peak has passed the limit.
    pub fn check(&self) -> Result<(), OverLimit> {
        let peak = self.peak();
        if peak > self.limit || over_limit() {
            Err(OverLimit {
                limit: self.limit,
                peak,
            })
        } else {
            Ok(())
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        PEAK.set(PEAK.get().max(self.outer_peak));
        LIMIT.set(self.outer_limit);
    }
}

/// Counts `bytes` that work done for this thread's code took on another thread (the blocking pool,
/// `admission/offload.rs`) as if this thread had held them on top of what it holds now.
pub fn charge(bytes: usize) {
    let at = LIVE
        .get()
        .saturating_add(isize::try_from(bytes).unwrap_or(isize::MAX));
    if at > PEAK.get() {
        PEAK.set(at);
    }
}

/// Whether the code on this thread has passed the limit of its innermost meter (always `false`
/// without one).
#[inline]
pub fn over_limit() -> bool {
    PEAK.get() > LIMIT.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meter_sees_what_its_thread_allocates_and_frees() {
        let meter = Meter::start(1 << 20);
        let block = vec![0u8; 100_000];
        assert!(meter.peak() >= 100_000, "{}", meter.peak());
        drop(block);
        let after = meter.peak();
        assert!(after >= 100_000, "the peak stays: {after}");
        assert!(meter.check().is_ok());
        let big = vec![1u8; 2 << 20];
        assert!(over_limit());
        assert_eq!(
            meter.check(),
            Err(OverLimit {
                limit: 1 << 20,
                peak: meter.peak()
            })
        );
        drop((big, meter));
        assert!(!over_limit(), "the limit ends with its meter");
    }

    #[test]
    fn another_threads_allocations_are_not_counted() {
        let meter = Meter::start(1 << 20);
        std::thread::spawn(|| vec![0u8; 4 << 20].len())
            .join()
            .unwrap();
        assert!(meter.check().is_ok(), "peak {}", meter.peak());
    }

    #[test]
    fn an_inner_meter_keeps_within_its_outer_limit_and_adds_to_its_peak() {
        let outer = Meter::start(1 << 20);
        {
            let inner = Meter::start(64 << 20);
            let block = vec![0u8; 2 << 20];
            assert!(inner.peak() >= 2 << 20);
            assert!(over_limit(), "the outer limit holds inside the inner meter");
            assert!(inner.check().is_err());
            drop(block);
        }
        assert!(outer.peak() >= 2 << 20);
        assert!(outer.check().is_err());
    }

    #[test]
    fn work_on_another_thread_can_be_charged() {
        let meter = Meter::start(1 << 20);
        let peak = std::thread::spawn(|| {
            let there = Meter::start(usize::MAX);
            let block = vec![0u8; 2 << 20];
            drop(block);
            there.peak()
        })
        .join()
        .unwrap();
        charge(peak);
        assert!(meter.peak() >= 2 << 20);
        assert!(meter.check().is_err());
    }

    #[test]
    fn growing_in_place_counts_the_difference() {
        let meter = Meter::start(usize::MAX);
        let mut v: Vec<u8> = Vec::with_capacity(1000);
        v.reserve_exact(1_000_000);
        let peak = meter.peak();
        assert!((1_000_000..1_100_000).contains(&peak), "{peak}");
        drop(v);
    }
}
