//! A persistent thread pool for many tiny parallel regions.
//!
//! Decoding one token runs a few hundred matrix products of a few microseconds each, so the cost
//! that matters is the latency of starting and finishing a region, not throughput. Workers spin on
//! one atomic word for a while after each region (a new region starts within ~100 ns) and only
//! then park on a condition variable. Each thread starts on its own share of the tasks (the same
//! share every time, so weight rows stay in that core's cache) and then helps with the others'. The calling thread takes part in the work, so a pool of `n`
//! threads owns `n - 1` workers.
//!
//! Protocol (all through [`Shared::state`], one `u64`):
//! `epoch` (high 32 bits) names the current region, `CLOSED` says no worker may join it any more,
//! and the low bits count workers that have joined it and not yet left. The caller publishes the
//! job, then bumps the epoch. A worker joins with a compare-and-swap that only succeeds while the
//! epoch is the one it saw and the region is open, so it never touches a job whose region has
//! finished. When the caller runs out of tasks it closes the region and waits for the joined count
//! to drop to zero; only then does `run` return and the job (which borrows the caller's closure)
//! go away.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::{self, JoinHandle};

use super::isa::Isa;

const CLOSED: u64 = 1 << 31;
const JOINED_MASK: u64 = CLOSED - 1;
const EPOCH_SHIFT: u32 = 32;

/// Spin iterations before a worker parks (each is a `spin_loop` hint plus an atomic load, about
/// 27 ns on Zen 4): ~55 µs bridges the serial gaps between the matmuls of one token, yet a worker
/// does not burn a shared core for long. (Spinning longer made 2-thread decode on a loaded
/// 2-core machine markedly slower: a spinner uses up its scheduler share and is then preempted
/// while holding a task, which stalls the whole region.)
const SPIN_LIMIT: u32 = 1 << 11;

/// A type-erased `&F` for some `F: Fn(usize) + Sync` living on the caller's stack.
#[derive(Clone, Copy)]
struct Job {
    data: *const (),
    call: unsafe fn(*const (), usize),
    n_tasks: usize,
}

unsafe fn call_job<F: Fn(usize) + Sync>(data: *const (), task: usize) {
    // SAFETY: `data` was made from `&F` in `run`, which outlives every call (see module docs).
    unsafe { (*(data as *const F))(task) }
}

/// Keeps a value alone in a 128-byte span (a cache line and the neighbour that adjacent-line
/// prefetchers pair it with), so spinning readers of one atomic do not slow writers of another.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    /// Polled by spinning workers.
    state: Padded<AtomicU64>,
    /// Written by the caller only while no worker has joined (before the epoch bump that opens a
    /// region); read by workers only after joining that region.
    job: UnsafeCell<Job>,
    /// Per thread, the next unclaimed task of its share (see [`run_tasks`]).
    cursors: Box<[Padded<AtomicUsize>]>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

// SAFETY: `job` is only written while no worker can read it (see the field's comment); everything
// else is atomics and mutexes. The raw pointer inside `Job` refers to a `Sync` closure.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

thread_local! {
    /// Set while this thread executes a task, so a nested `run` goes serial instead of deadlocking.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// A fixed set of threads that execute `run` regions. See the module documentation.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one region at a time. A second concurrent caller runs serially.
    caller: Mutex<()>,
    n_threads: usize,
    isa: Isa,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in total, the calling thread included (0 is taken as 1),
    /// whose kernels use the best instruction set of this CPU.
    pub fn new(n_threads: usize) -> Self {
        Self::with_isa(n_threads, Isa::detect())
    }

    /// As [`ThreadPool::new`], with kernels of level `isa` (scalar if the CPU lacks it): the
    /// kernel choice is fixed for the pool's life, so its results are reproducible.
    pub fn with_isa(n_threads: usize, isa: Isa) -> Self {
        let isa = isa.or_scalar();
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            state: Padded(AtomicU64::new(0)),
            job: UnsafeCell::new(Job {
                data: std::ptr::null(),
                call: call_job::<fn(usize)>,
                n_tasks: 0,
            }),
            cursors: (0..n_threads).map(|_| Padded(AtomicUsize::new(0))).collect(),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("tandem-cpu-{i}"))
                    .spawn(move || worker_loop(&shared, i))
                    .expect("failed to spawn a thread-pool worker")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            caller: Mutex::new(()),
            n_threads,
            isa,
        }
    }

    /// The instruction-set level of the kernels run with this pool.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Threads that execute tasks, the caller included.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(task)` for every task in `0..n_tasks` across the pool and returns when all are done.
    /// Thread `i` of `n` starts on tasks `i·n_tasks/n ..`, in order; a thread that runs out of its
    /// own takes over the rest of others' (so slow or absent threads are covered).
    ///
    /// If a task panics, the remaining unstarted tasks are skipped and the panic is resumed on the
    /// caller once every running task has finished. Calling `run` from inside a task, or while
    /// another thread's region is running, executes the tasks serially on the calling thread.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: &F) {
        if n_tasks == 0 {
            return;
        }
        if n_tasks == 1 || self.workers.is_empty() || IN_TASK.with(Cell::get) {
            return run_serial(n_tasks, f);
        }
        let _guard = match self.caller.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return run_serial(n_tasks, f),
        };
        let sh = &*self.shared;
        // SAFETY: the previous region closed with no worker joined, and none can join until the
        // epoch bump below, so nobody reads `job` now.
        unsafe {
            *sh.job.get() = Job {
                data: f as *const F as *const (),
                call: call_job::<F>,
                n_tasks,
            };
        }
        for (t, c) in sh.cursors.iter().enumerate() {
            c.store(share_start(t, n_tasks, self.n_threads), Ordering::Relaxed);
        }
        let epoch = (sh.state.load(Ordering::Relaxed) >> EPOCH_SHIFT).wrapping_add(1) & 0xffff_ffff;
        // SeqCst pairs with the sleeper's SeqCst increment-then-check: one of us sees the other.
        sh.state.store(epoch << EPOCH_SHIFT, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = sh.sleep_lock.lock().unwrap_or_else(|p| p.into_inner());
            sh.wake.notify_all();
        }

        // SAFETY: `job` was just written by this thread.
        run_tasks(sh, unsafe { &*sh.job.get() }, 0);

        // Close the region and wait for joined workers to leave; after this no worker can reach `f`.
        sh.state.fetch_or(CLOSED, Ordering::AcqRel);
        let mut spins = 0u32;
        while sh.state.load(Ordering::Acquire) & JOINED_MASK != 0 {
            spins += 1;
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        let payload = sh.panic.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(_guard);
        if let Some(p) = payload {
            panic::resume_unwind(p);
        }
    }
}

impl Default for ThreadPool {
    /// One thread per available core.
    fn default() -> Self {
        Self::new(thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = sh.sleep_lock.lock().unwrap_or_else(|p| p.into_inner());
            sh.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn run_serial<F: Fn(usize)>(n_tasks: usize, f: &F) {
    let was = IN_TASK.with(|c| c.replace(true));
    let reset = ResetInTask(was);
    for task in 0..n_tasks {
        f(task);
    }
    drop(reset);
}

/// Restores `IN_TASK` even when a task unwinds.
struct ResetInTask(bool);

impl Drop for ResetInTask {
    fn drop(&mut self) {
        IN_TASK.with(|c| c.set(self.0));
    }
}

/// First task of thread `t`'s share of `0..n_tasks` (thread `t` owns `start(t)..start(t + 1)`).
fn share_start(t: usize, n_tasks: usize, n_threads: usize) -> usize {
    t * n_tasks / n_threads
}

/// Claims and runs tasks until none are left: first those of its own share (thread `me` of the
/// pool, the caller being 0), in order, then what remains of the others' shares. Shares keep a
/// thread on the same tasks — the same weight rows, still in its L2 — from one region to the
/// next when the load is even; taking over the rest of a share rebalances when it is not.
/// Panics are caught and parked in `Shared::panic`.
fn run_tasks(sh: &Shared, job: &Job, me: usize) {
    let _reset = ResetInTask(IN_TASK.with(|c| c.replace(true)));
    let n = sh.cursors.len();
    for k in 0..n {
        let t = (me + k) % n;
        let end = share_start(t + 1, job.n_tasks, n);
        loop {
            let task = sh.cursors[t].fetch_add(1, Ordering::Relaxed);
            if task >= end {
                break;
            }
            // SAFETY: the region is open or we have joined it, so `f` is alive (module docs).
            let r = panic::catch_unwind(AssertUnwindSafe(|| unsafe { (job.call)(job.data, task) }));
            if let Err(p) = r {
                // Skip the tasks nobody has started; keep the first panic.
                for (u, c) in sh.cursors.iter().enumerate() {
                    c.fetch_max(share_start(u + 1, job.n_tasks, n), Ordering::Relaxed);
                }
                let mut slot = sh.panic.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert(p);
            }
        }
    }
}

fn worker_loop(sh: &Shared, me: usize) {
    let mut seen_epoch = 0u64;
    loop {
        // Wait for a region with a new epoch that is still open, and join it.
        let mut spins = 0u32;
        loop {
            if sh.shutdown.load(Ordering::Relaxed) {
                return;
            }
            let s = sh.state.load(Ordering::Acquire);
            let epoch = s >> EPOCH_SHIFT;
            if epoch != seen_epoch {
                if s & CLOSED != 0 {
                    seen_epoch = epoch; // finished before we got here: nothing to do
                    continue;
                }
                if sh
                    .state
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    seen_epoch = epoch;
                    break;
                }
                continue;
            }
            spins += 1;
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
                continue;
            }
            park(sh, seen_epoch);
            spins = 0;
        }
        // SAFETY: we joined an open region, whose caller wrote `job` before opening it and will
        // not return (or write `job` again) until we leave.
        let job = unsafe { *sh.job.get() };
        run_tasks(sh, &job, me);
        sh.state.fetch_sub(1, Ordering::Release);
    }
}

/// Sleeps until the epoch moves past `seen_epoch` or the pool shuts down.
fn park(sh: &Shared, seen_epoch: u64) {
    let mut guard = sh.sleep_lock.lock().unwrap_or_else(|p| p.into_inner());
    sh.sleepers.fetch_add(1, Ordering::SeqCst);
    while sh.state.load(Ordering::SeqCst) >> EPOCH_SHIFT == seen_epoch && !sh.shutdown.load(Ordering::SeqCst) {
        guard = sh.wake.wait(guard).unwrap_or_else(|p| p.into_inner());
    }
    sh.sleepers.fetch_sub(1, Ordering::SeqCst);
}

/// A raw pointer that tasks may share, for writing disjoint parts of one buffer in parallel.
/// Whoever creates one from a `&mut` borrow must keep that borrow alive (and unused) meanwhile.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub(crate) *mut T);

// SAFETY: only a pointer; the users guarantee disjoint access (see `slice`).
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// `len` elements at `start`.
    ///
    /// # Safety
    /// The range must be in bounds of the allocation and accessed by no one else while the
    /// returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn runs_every_task_once() {
        for n_threads in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n_threads);
            for n in [0, 1, 2, 7, 100] {
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }
}
