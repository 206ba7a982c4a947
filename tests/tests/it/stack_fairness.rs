//! On `BACKEND=redis scripts/stack up`, worker-1 used to make every
//! edit of the demo page while workers 2 and 3 waited: the polled Redis lock
//! let the worker that had just released take it again at once. With the
//! fair lock (the workers' default) the three separate worker processes take
//! turns: worker-1 works 1.5 s per edit and the others 0.3 s, yet each gets
//! its share of the edits, not its share of the time.
//!
//! The stack takes about 40 s to come up: one test.

use std::time::{Duration, Instant};

use harness::stack::Stack;

const WORKERS: [&str; 3] = ["worker-1", "worker-2", "worker-3"];

/// Edits in the page before the shares are judged: about five turns each.
const EDITS: usize = 15;

/// The smallest share of the edits a worker may have (a third when the
/// turns are perfect; a round in progress moves it by one edit).
const SMALLEST_SHARE: f64 = 0.20;
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
fn with_redis_the_three_worker_processes_take_fair_turns_on_the_demo_page() {
    let stack = Stack::up_with("stack-redis-fair-", "redis");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(90);
    let mut seen = lines_by_worker(&stack);
    while seen.iter().sum::<usize>() < EDITS && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        seen = lines_by_worker(&stack);
    }
    let total: usize = seen.iter().sum();
    eprintln!("after {:?}: lines by worker {seen:?}", started.elapsed());
    assert!(
        total >= EDITS
            && seen
                .iter()
                .all(|&n| n as f64 >= SMALLEST_SHARE * total as f64),
        "lines by worker-1..3: {seen:?} (at least {EDITS} in all, each at least \
         {SMALLEST_SHARE} of them)\n--- logs ---\n{}",
        stack.logs()
    );
}
