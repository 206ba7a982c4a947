//! Where and when a figure was measured: the machine (CPUs, their model,
//! memory, the OS, the services' versions), its load, and the time.

/// CPUs this process may use (`nproc`).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// The CPU's model name, from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// `/proc/loadavg`'s first three fields (1, 5 and 15 minutes): how loaded
/// the shared machine was.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The machine the figures come from.
#[derive(Debug, Clone)]
pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub memory: String,
    pub os: String,
    /// The services' versions as their binaries report them.
    pub services: Vec<String>,
}

impl Machine {
    pub fn probe() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let memory = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
            .unwrap_or_else(|| "unknown".into());
        let pretty = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_else(|| "unknown OS".into());
        let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
        Machine {
            nproc: cpus(),
            cpu: cpu_model(),
            memory,
            os: format!("{pretty}, Linux {kernel}"),
            services: service_versions(),
        }
    }
}

/// First line of `program args`, or nothing when it cannot run.
fn version_of(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| line.to_string())
}

fn service_versions() -> Vec<String> {
    let mut v = vec![];
    if let Some(l) = version_of("redis-server", &["--version"]) {
        // "Redis server v=7.0.15 sha=..."
        let ver = l.split_whitespace().find_map(|w| w.strip_prefix("v="));
        v.push(format!("redis-server {}", ver.unwrap_or(&l)));
    }
    if let Some(l) = version_of(
        &harness::postgres::pgbench()
            .with_file_name("postgres")
            .to_string_lossy(),
        &["--version"],
    ) {
        v.push(l);
    }
    if let Some(l) = version_of("mariadbd", &["--version"]) {
        v.push(
            l.split(" for ")
                .next()
                .unwrap_or(&l)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    let zk = std::fs::read_dir("/usr/share/java")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|f| {
            f.strip_prefix("zookeeper-")?
                .strip_suffix(".jar")
                .filter(|ver| ver.starts_with(|c: char| c.is_ascii_digit()))
                .map(|ver| format!("ZooKeeper {ver}, standalone and a 3-node ensemble"))
        });
    v.extend(zk);
    v
}

/// Now, UTC, to the minute (civil date from the Unix day count).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_now_is_a_date() {
        let now = utc_now();
        assert!(now.starts_with("20") && now.ends_with(" UTC"), "{now}");
        assert_eq!(now.len(), "2026-11-21 19:30 UTC".len());
    }
}
