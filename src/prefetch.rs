//! Cache hints: bring a line in before the code that reads it runs. Used where a loop
//! knows the next objects it will touch and they are likely cold (the scheduler's turns
//! with a thousand campaigns; docs/BENCHMARKS.md).

/// Bytes in a cache line on the x86_64 CPUs this runs on.
const LINE: usize = 64;

/// Asks the CPU to bring the cache line holding `p` into its nearest cache. A hint only:
/// nothing the program sees changes, and an address that maps nothing is ignored.
#[inline(always)]
pub fn line<T: ?Sized>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is part of SSE, which every x86_64 CPU has; it reads nothing
    // the program sees, writes nothing and never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Every cache line of the `len` bytes from `p`.
#[inline(always)]
pub fn bytes<T: ?Sized>(p: *const T, len: usize) {
    let base = p.cast::<u8>();
    let mut off = 0;
    while off < len {
        line(base.wrapping_add(off));
        off += LINE;
    }
}

/// The line of an `Arc`'s counts, which a clone or a count check touches, and the
/// value's first line. The counts sit just before the value in std's layout; were that
/// to change, the first hint would only miss its line.
#[inline(always)]
pub fn arc<T: ?Sized>(a: &std::sync::Arc<T>) {
    let value = std::sync::Arc::as_ptr(a).cast::<u8>();
    line(value.wrapping_sub(2 * std::mem::size_of::<usize>()));
    line(value);
}
