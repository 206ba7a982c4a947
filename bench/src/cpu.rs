//! CPU time of processes, from `/proc/PID/stat`: where the CPU of a run
//! went (the gateways, PostgreSQL, HAProxy, the load generator).

/// Which children's CPU counts with a process's own.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Children {
    No,
    /// Those it has waited for (their time is in its `cutime`/`cstime`).
    Reaped,
    /// Reaped ones and live ones (PostgreSQL forks a backend per connection).
    All,
}

/// CPU seconds of `pid` (user + system), with `children` as said.
pub fn cpu_of(pid: u32, children: Children) -> f64 {
    // USER_HZ: the unit of /proc/PID/stat's times, 100 on Linux.
    const TICKS: f64 = 100.0;
    let fields = |pid: u32| -> Vec<u64> {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = s.rsplit_once(')')?.1.to_string();
                // After the name: state is field 3; utime 14, stime 15, cutime 16, cstime 17.
                Some(
                    rest.split_whitespace()
                        .skip(11)
                        .take(4)
                        .filter_map(|f| f.parse().ok())
                        .collect(),
                )
            })
            .unwrap_or_default()
    };
    let own = fields(pid);
    let with_reaped = if children == Children::No { 2 } else { 4 };
    let mut ticks: u64 = own.iter().take(with_reaped).sum();
    if children == Children::All {
        for child in children_of(pid) {
            ticks += fields(child).iter().take(2).sum::<u64>();
        }
    }
    ticks as f64 / TICKS
}

fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                })
                == Some(parent)
        })
        .collect()
}
