//! Latency samples and the figures quoted from them.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long each measured run lasts, and how many of each there are
/// (`bench gateway`, `trust`, `scale`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Repeats {
    /// Seconds per measured run.
    #[arg(long, default_value_t = 5)]
    pub secs: u64,
    /// Runs of each figure (figures are medians).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
}

/// The outcome of one measured run: how many operations in how long, and each
/// operation's latency.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub ops: u64,
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
}

impl Run {
    /// The operations whose latencies these are, done in `elapsed`.
    pub fn of(latencies: Vec<Duration>, elapsed: Duration) -> Run {
        Run {
            ops: latencies.len() as u64,
            elapsed,
            latencies,
        }
    }

    /// Tasks that run side by side since `start` (all spawned already), each
    /// with its latencies.
    pub async fn joined(
        start: Instant,
        tasks: Vec<JoinHandle<anyhow::Result<Vec<Duration>>>>,
    ) -> anyhow::Result<Run> {
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.context("bench task panicked")??);
        }
        Ok(Run::of(latencies, start.elapsed()))
    }

    /// `op` back to back for `secs`, one sample per call.
    pub async fn timed<F, Fut>(secs: Duration, mut op: F) -> anyhow::Result<Run>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<()>>,
    {
        let start = Instant::now();
        let end = start + secs;
        let mut latencies = Vec::new();
        while Instant::now() < end {
            let t0 = Instant::now();
            op().await?;
            latencies.push(t0.elapsed());
        }
        Ok(Run::of(latencies, start.elapsed()))
    }

    pub fn per_sec(&self) -> f64 {
        if self.elapsed.is_zero() {
            return 0.0;
        }
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    /// The `q` quantile (0.0..=1.0) of the latencies, nearest-rank.
    pub fn quantile(&self, q: f64) -> Duration {
        quantile(&self.latencies, q)
    }

    pub fn p50(&self) -> Duration {
        self.quantile(0.50)
    }

    pub fn p99(&self) -> Duration {
        self.quantile(0.99)
    }
}

/// Nearest-rank quantile of unsorted samples; zero for no samples.
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Median of repeated figures (runs are repeated because the machine is noisy).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `min..max` of repeated figures, for the spread column.
pub fn spread(values: &[f64]) -> (f64, f64) {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

/// Milliseconds with two decimals, for tables.
pub fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&s, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&s, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&s, 1.0), Duration::from_millis(100));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
