//! The `gateway` binary on a port of its own, with trust on as in the demo:
//! it requires API keys (one per client, [`api_key`]) and, with its fence
//! on, checks every token with the lock service that issued it.

use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use super::binary::binary;

/// The clients a gateway knows by default: the roles the chaos scenarios
/// give their workers (a worker of another name is refused with 401). One
/// row's workers have different roles; rows use different pages, so the
/// same role in two rows never shares a lock.
pub const CLIENTS: &[&str] = &[
    "paused",
    "other",
    "victim",
    "before",
    "after",
    "first",
    "second",
    "a",
    "b",
    "slow",
    "jumper",
    "bystander0",
    "bystander1",
    "bystander2",
    "bystander3",
];

/// The API key of a test client (never secret: test keys).
pub fn api_key(client: &str) -> String {
    format!("chaos-{client}-key-not-secret")
}

/// A running gateway. It can be killed and started again on its port (a
/// balancer's configuration names it); killed and reaped on drop.
pub struct GatewayProc {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    log: tempfile::NamedTempFile,
    _keys: tempfile::NamedTempFile,
}

impl GatewayProc {
    /// On a free port, with the keys of [`CLIENTS`] required, and, with the
    /// fence on, every token checked with `issuer` (`Fencing-Issuer` name,
    /// URL), if any.
    pub async fn spawn(
        database_url: &str,
        fencing: bool,
        issuer: Option<&(String, String)>,
    ) -> anyhow::Result<Self> {
        Self::spawn_on(database_url, fencing, issuer, crate::free_port()).await
    }

    /// [`GatewayProc::spawn`] on a chosen port.
    pub async fn spawn_on(
        database_url: &str,
        fencing: bool,
        issuer: Option<&(String, String)>,
        port: u16,
    ) -> anyhow::Result<Self> {
        let clients: Vec<String> = CLIENTS.iter().map(|c| c.to_string()).collect();
        let issuers: Vec<(String, String)> = issuer.into_iter().cloned().collect();
        Self::spawn_for(database_url, fencing, &issuers, &clients, port).await
    }

    /// A gateway on `port` that knows the keys of `clients` (see [`api_key`])
    /// and, with its fence on, checks tokens with every one of `issuers`
    /// (`Fencing-Issuer` name, URL). With several, a page whose id holds
    /// `-<issuer>-` is that issuer's (the operator's choice, not the first
    /// writer's: [`page_issuers`]).
    pub async fn spawn_for(
        database_url: &str,
        fencing: bool,
        issuers: &[(String, String)],
        clients: &[String],
        port: u16,
    ) -> anyhow::Result<Self> {
        Self::spawn_with_args(database_url, fencing, issuers, clients, port, &[]).await
    }

    /// [`GatewayProc::spawn_for`] with `extra` flags after the usual ones.
    pub async fn spawn_with_args(
        database_url: &str,
        fencing: bool,
        issuers: &[(String, String)],
        clients: &[String],
        port: u16,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let log = tempfile::Builder::new()
            .prefix("gateway-")
            .suffix(".log")
            .tempfile()?;
        let keys = tempfile::Builder::new().prefix("api-keys-").tempfile()?;
        let lines: Vec<String> = clients
            .iter()
            .map(|c| format!("{c}={}", api_key(c)))
            .collect();
        std::fs::write(keys.path(), lines.join("\n") + "\n")?;
        let mut args: Vec<String> = [
            "--database-url",
            database_url,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--fencing",
            if fencing { "enforce" } else { "off" },
            "--auth",
            "required",
            "--api-keys-file",
        ]
        .map(String::from)
        .into();
        args.push(keys.path().display().to_string());
        if fencing {
            for (name, url) in issuers {
                args.extend(["--issuer".to_string(), format!("{name}={url}")]);
            }
            if issuers.len() > 1 {
                args.extend(["--page-issuers".to_string(), page_issuers(issuers)]);
            }
        }
        args.extend(extra.iter().cloned());
        setup(database_url).await?;
        let mut me = Self {
            child: None,
            port,
            args,
            log,
            _keys: keys,
        };
        me.start().await?;
        Ok(me)
    }

    /// Start the process (again, after [`GatewayProc::crash`]) and wait
    /// until it answers `/healthz`.
    pub async fn start(&mut self) -> anyhow::Result<()> {
        let log = File::options().append(true).open(self.log.path())?;
        let mut cmd = Command::new(binary("gateway")?);
        cmd.args(&self.args)
            .env("RUST_LOG", "gateway=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(crate::process::spawn_tied_to_test(cmd).context("spawn the gateway")?);
        let http = reqwest::Client::new();
        let url = format!("{}/healthz", self.url());
        let ready = crate::wait_until(Duration::from_secs(30), || async {
            http.get(&url).send().await?.error_for_status()
        })
        .await;
        if let Err(e) = ready {
            bail!(
                "gateway did not answer {url}: {e}\n--- log ---\n{}",
                std::fs::read_to_string(self.log.path()).unwrap_or_default()
            );
        }
        Ok(())
    }

    /// SIGKILL, reaped.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `None` while it is down.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// The roles `gateway setup` grants to, by its default names; created once
/// per cluster (roles are the cluster's, databases share them).
const ROLES: &str = "
do $$
declare r text;
begin
  foreach r in array array['fence_gateway', 'fence_unfenced', 'fence_issuer'] loop
    if not exists (select from pg_roles where rolname = r) then
      execute format('create role %I login', r);
    end if;
  end loop;
  if not exists (select from pg_roles where rolname = 'fence_lock_client') then
    create role fence_lock_client nologin;
  end if;
exception when duplicate_object or unique_violation then
  null; -- another test created them meanwhile
end $$";

/// What an operator does before the gateways serve: the roles, then
/// `gateway setup` (the migrations, the grants, the lease table) with
/// `database_url`, whose login owns what it creates (in the harness, the
/// superuser).
pub async fn setup(database_url: &str) -> anyhow::Result<()> {
    use sqlx::Connection;
    // Roles are the cluster's: any server of a multi-host URL that accepts
    // writes will do, and the harness names its primary first.
    let mut conn = sqlx::PgConnection::connect(&first_host(database_url))
        .await
        .context("connect to create the gateway's roles")?;
    sqlx::query(ROLES)
        .execute(&mut conn)
        .await
        .context("create the gateway's roles")?;
    conn.close().await.ok();
    let out = tokio::process::Command::new(binary("gateway")?)
        .args(["setup", "--database-url", database_url])
        .env("RUST_LOG", "gateway=warn")
        .output()
        .await
        .context("run gateway setup")?;
    if !out.status.success() {
        bail!(
            "gateway setup failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// `--page-issuers` for `issuers`: `*-<name>-*=<name>`, the longest name
/// first, so that `redis` does not take `redis-sentinel`'s pages.
pub fn page_issuers(issuers: &[(String, String)]) -> String {
    let mut names: Vec<&str> = issuers.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    names
        .iter()
        .map(|n| format!("*-{n}-*={n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `url` with only the first of its hosts (`h1:p1,h2:p2` → `h1:p1`): sqlx
/// does not parse the multi-host form.
fn first_host(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (login, hosts) = authority.rsplit_once('@').unwrap_or(("", authority));
    let host = hosts.split(',').next().unwrap_or(hosts);
    let at = if login.is_empty() { "" } else { "@" };
    format!("{scheme}://{login}{at}{host}{tail}")
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        self.crash();
    }
}
