//! pgbench doing a fenced PUT's database work, beside the gateway: the
//! gateway's own statement with pgbench variables for its parameters, the
//! script around it, and the command (`bench gateway`, `bench scale`).

use std::path::{Path, PathBuf};

use tokio::process::Command;

/// The gateway's statement for an accepted fenced PUT
/// ([`gateway::store::FENCED_ACCESS`]) with pgbench variables for its
/// parameters: `:id`, `:method`, `:body`, `:tok`, `:issuer`, `:enforce`,
/// `:client`; `$6` (If-Match) is NULL, as in the benchmarks' requests.
/// Comment lines are dropped: pgbench would substitute `:names` in them too.
pub fn fenced_access_sql() -> String {
    let mut sql: String = gateway::store::FENCED_ACCESS
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    // pgbench makes every occurrence of a variable its own parameter, so each
    // one gets the type the gateway's (single, typed) parameter has.
    for (param, var) in [
        ("$8", "(:client::text)"),
        ("$7", "(:enforce::boolean)"),
        ("$6", "(null::bigint)"),
        ("$5", "(:issuer::text)"),
        ("$4", "(:tok::bigint)"),
        ("$3", "(:body::text)"),
        ("$2", "(:method::text)"),
        ("$1", "(:id::text)"),
    ] {
        sql = sql.replace(param, var);
    }
    sql
}

/// `dir/name`: a pgbench script running `sql` on a random page of `1..=pages`.
pub fn write_script(dir: &Path, name: &str, sql: &str, pages: u64) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, format!("\\set id random(1, {pages})\n{sql};\n"))?;
    Ok(path)
}

/// `dir/fenced_access.sql`: the gateway's statement ([`fenced_access_sql`])
/// on a random page of `1..=pages`.
pub fn fenced_access_script(dir: &Path, pages: u64) -> anyhow::Result<PathBuf> {
    write_script(dir, "fenced_access.sql", &fenced_access_sql(), pages)
}

/// pgbench doing fenced PUTs: `script` from `clients` clients (one
/// connection each) for `secs` against `db` on 127.0.0.1:`port`, with the
/// variables of a fenced PUT of `body` with `token`.
#[derive(Debug, Clone, Copy)]
pub struct FencedPuts<'a> {
    pub port: u16,
    pub db: &'a str,
    pub script: &'a Path,
    pub clients: usize,
    pub secs: u64,
    pub token: u64,
    pub body: &'a str,
}

impl FencedPuts<'_> {
    /// `pgbench -M prepared` with these settings; killed if dropped.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(harness::postgres::pgbench());
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", self.db])
            .args(["-n", "-M", "prepared"])
            .args(["-c", &self.clients.to_string()])
            .args(["-j", &self.clients.min(2).to_string()])
            .args(["-T", &self.secs.to_string()])
            .args(["-D", "method=PUT", "-D", &format!("body={}", self.body)])
            .args(["-D", &format!("tok={}", self.token), "-D", "issuer=default"])
            .args(["-D", "enforce=true", "-D", "client=pgbench"])
            .arg("-f")
            .arg(self.script)
            .kill_on_drop(true);
        cmd
    }
}
