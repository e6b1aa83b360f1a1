//! The allocation cap of a fuzz run: a global allocator that forwards to the system's and,
//! while a case runs (`arm`), refuses any single request above `CAP_BYTES`. A refused request
//! aborts the process (Rust's allocation-failure handler) after this module writes which case
//! asked for how much, so a blow-up is a reported crash, never a machine brought down.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The largest single allocation a fuzz case may ask for.
pub const CAP_BYTES: usize = 1 << 30;

static ARMED: AtomicBool = AtomicBool::new(false);
static CASE: AtomicU64 = AtomicU64::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

pub struct CappedAlloc;

/// Starts watching case `case`: requests above the cap are refused until `disarm`.
pub fn arm(case: u64) {
    CASE.store(case, Ordering::Relaxed);
    LARGEST.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::SeqCst);
}

/// Stops watching; returns the largest single request the case made.
pub fn disarm() -> usize {
    ARMED.store(false, Ordering::SeqCst);
    LARGEST.load(Ordering::Relaxed)
}

/// Writes the refusal without allocating: digits into a stack buffer.
fn report(size: usize) {
    let mut buf = [0u8; 96];
    let mut at = 0;
    for part in [
        b"fuzz: case ".as_slice(),
        digits(CASE.load(Ordering::Relaxed) as usize, &mut [0u8; 20]),
        b" asked for ",
        digits(size, &mut [0u8; 20]),
        b" bytes in one allocation (cap 1 GiB)\n",
    ] {
        let n = part.len().min(buf.len() - at);
        buf[at..at + n].copy_from_slice(&part[..n]);
        at += n;
    }
    let _ = std::io::stderr().write_all(&buf[..at]);
}

fn digits(mut v: usize, out: &mut [u8; 20]) -> &[u8] {
    let mut i = out.len();
    loop {
        i -= 1;
        out[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    // Extend the borrow: the caller's buffer lives for the statement that uses it.
    let start = i;
    &out[start..]
}

fn watch(size: usize) -> bool {
    if !ARMED.load(Ordering::Relaxed) {
        return true;
    }
    LARGEST.fetch_max(size, Ordering::Relaxed);
    if size > CAP_BYTES {
        ARMED.store(false, Ordering::SeqCst);
        report(size);
        return false;
    }
    true
}

// SAFETY: every method forwards to `System` with the caller's layout (upholding
// `GlobalAlloc`'s contract) or returns null, which the contract allows for a refused request.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !watch(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s preconditions.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !watch(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !watch(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged; `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
