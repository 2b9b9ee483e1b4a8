//! Thread pool: many tiny regions, panics, nesting, concurrent callers.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tandem_backend::ThreadPool;

#[test]
fn many_tiny_regions() {
    for n in [1, 2, 3, 4] {
        let pool = ThreadPool::new(n);
        let total = AtomicUsize::new(0);
        for i in 0..20_000 {
            let tasks = 1 + i % 5;
            pool.run(tasks, &|t| {
                total.fetch_add(t + 1, Ordering::Relaxed);
            });
        }
        // Σ over i of (1 + … + tasks) with tasks cycling 1..=5: 4000 · (1 + 3 + 6 + 10 + 15).
        assert_eq!(total.load(Ordering::Relaxed), 4000 * 35, "threads={n}");
    }
}

#[test]
fn tasks_see_borrowed_data_and_write_disjoint_parts() {
    let pool = ThreadPool::new(3);
    let input: Vec<u64> = (0..1000).collect();
    let out: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
    pool.run(100, &|t| {
        let s: u64 = input[t * 10..t * 10 + 10].iter().sum();
        out[t].store(s as usize, Ordering::Relaxed);
    });
    for (t, v) in out.iter().enumerate() {
        assert_eq!(
            v.load(Ordering::Relaxed) as u64,
            (t as u64 * 10..t as u64 * 10 + 10).sum::<u64>()
        );
    }
}

#[test]
fn panics_propagate_and_the_pool_survives() {
    let pool = ThreadPool::new(3);
    for round in 0..50 {
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(64, &|t| {
                ran.fetch_add(1, Ordering::Relaxed);
                if t == round % 64 {
                    panic!("task {t} failed");
                }
            })
        }));
        let msg = r.unwrap_err();
        let msg = msg.downcast_ref::<String>().map(String::as_str).unwrap_or("");
        assert_eq!(msg, format!("task {} failed", round % 64));
        assert!(ran.load(Ordering::Relaxed) >= 1);
        // Still usable afterwards.
        let n = AtomicUsize::new(0);
        pool.run(10, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }
}

#[test]
fn nested_runs_execute_serially() {
    let pool = ThreadPool::new(2);
    let n = AtomicUsize::new(0);
    pool.run(4, &|_| {
        pool.run(3, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
    });
    assert_eq!(n.load(Ordering::Relaxed), 12);
}

#[test]
fn concurrent_callers_share_one_pool() {
    let pool = Arc::new(ThreadPool::new(2));
    let total = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let (pool, total) = (Arc::clone(&pool), Arc::clone(&total));
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    pool.run(3, &|_| {
                        total.fetch_add(1, Ordering::Relaxed);
                    });
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(total.load(Ordering::Relaxed), 3 * 2000 * 3);
}

#[test]
fn parked_workers_wake_up() {
    let pool = ThreadPool::new(3);
    let n = AtomicUsize::new(0);
    for _ in 0..3 {
        // Long enough for workers to stop spinning and park.
        std::thread::sleep(std::time::Duration::from_millis(30));
        pool.run(100, &|_| {
            std::thread::sleep(std::time::Duration::from_micros(50));
            n.fetch_add(1, Ordering::Relaxed);
        });
    }
    assert_eq!(n.load(Ordering::Relaxed), 300);
}
