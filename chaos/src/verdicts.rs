//! What the rows must show: no acknowledged edit lost and no stale write
//! accepted with the fence on; the faults that must hit did hit; the
//! demonstrations (fence off, Redlock, Sentinel) show what they are for.

use crate::backends::Backend;
use crate::report::Row;
use crate::scenarios::Scenario;

/// The suite's assertions over a set of rows; empty when they all hold.
pub fn violations(rows: &[Row]) -> Vec<String> {
    let mut out = vec![];
    for r in rows {
        let id = format!(
            "{} on {} (fencing {})",
            r.scenario,
            r.backend,
            if r.fencing { "on" } else { "off" }
        );
        if let Some(e) = &r.error {
            out.push(format!("{id}: did not run to the end: {e}"));
            continue;
        }
        let fenced = r.backend != Backend::Redlock.name();
        let sentinel_loss = r.scenario == Scenario::SentinelFailover.name();
        if sentinel_loss {
            // The promoted replica re-mints the lost grant's token;
            // the fence cannot order equal tokens (the issuer check, which
            // asks the promoted master, refuses the old holder). The row must
            // show it: the second holder, counted and explained.
            if r.double_holders == 0 {
                out.push(format!("{id}: no second holder: the failover did not hit"));
            }
            if !r.notes.iter().any(|n| n.starts_with("second holder:")) {
                out.push(format!("{id}: the second holder is not explained"));
            }
        }
        // An asynchronous standby may lose acknowledged edits and let a stale
        // write in after a failover: that row reports what happened.
        let measured_only = r.scenario == Scenario::PostgresFailoverAsync.name();
        if r.fencing && fenced && !measured_only {
            if r.lost_updates != 0 {
                out.push(format!("{id}: {} lost update(s)", r.lost_updates));
            }
            if r.stale_accepted != 0 {
                out.push(format!(
                    "{id}: {} stale write(s) accepted",
                    r.stale_accepted
                ));
            }
            let must_hit = [
                Scenario::GcPauseWriting.name(),
                Scenario::DelayedWrite.name(),
            ];
            if must_hit.contains(&r.scenario.as_str()) && r.stale_rejected == 0 {
                out.push(format!(
                    "{id}: no stale write rejected, so the fault did not hit"
                ));
            }
        }
        if r.notes.iter().any(|n| n.starts_with("EXPECTED")) {
            out.push(format!("{id}: {}", r.notes.join("; ")));
        }
        if !r.fencing && r.scenario == Scenario::GcPauseWriting.name() && r.lost_updates == 0 {
            out.push(format!(
                "{id}: expected at least one lost update with the fence off"
            ));
        }
        if r.scenario == Scenario::RedlockPartition.name()
            && (r.double_holders != 0 || r.lost_updates != 0)
        {
            out.push(format!(
                "{id}: a partition from a minority of masters must change nothing \
                 ({} two holders, {} lost)",
                r.double_holders, r.lost_updates
            ));
        }
        if r.scenario == Scenario::SentinelFailoverWait.name()
            && !r.notes.iter().any(|n| n.contains("refused (and released)"))
        {
            out.push(format!(
                "{id}: WAIT refused no grant: the fault did not hit"
            ));
        }
        if r.backend == Backend::Redlock.name()
            && r.scenario == Scenario::RedisRestart.name()
            && r.double_holders == 0
        {
            out.push(format!(
                "{id}: expected two clients holding the lock at once"
            ));
        }
    }
    out
}
