//! On `BACKEND=redis scripts/stack up`, worker-1 used to make every
//! edit of the demo page while workers 2 and 3 waited: the polled Redis lock
//! let the worker that had just released take it again at once. With the
//! fair lock (the workers' default), every worker has edits in the page
//! within 30 s of the workers starting (they start last, as `up` returns).
//!
//! The stack takes about 40 s to come up: one test.

use std::time::{Duration, Instant};

use harness::stack::Stack;

const WORKERS: [&str; 3] = ["worker-1", "worker-2", "worker-3"];

/// How many lines of the demo page each worker wrote (`<client> #<n> token=<t>`).
fn lines_by_worker(stack: &Stack) -> Vec<usize> {
    let body = stack
        .curl("/pages/demo")
        .and_then(|page| serde_json::from_str::<serde_json::Value>(&page).ok())
        .and_then(|page| page["body"].as_str().map(str::to_owned))
        .unwrap_or_default();
    WORKERS
        .iter()
        .map(|w| {
            body.lines()
                .filter(|l| l.split_whitespace().next() == Some(w))
                .count()
        })
        .collect()
}

#[test]
fn with_redis_every_worker_has_edits_in_the_page_within_30_seconds() {
    let stack = Stack::up_with("stack-redis-fair-", "redis");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    let mut seen = lines_by_worker(&stack);
    while seen.contains(&0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        seen = lines_by_worker(&stack);
    }
    eprintln!("after {:?}: lines by worker {seen:?}", started.elapsed());
    assert!(
        !seen.contains(&0),
        "lines by worker-1..3 after 30 s: {seen:?}\n--- logs ---\n{}",
        stack.logs()
    );
}
