//! HAProxy 2.6 from Debian's `haproxy` package: an HTTP balancer in front of
//! gateways, health-checked on their `/readyz`.
//!
//! A gateway whose `/readyz` fails twice (it is dead, or it has no primary
//! database) is taken out of rotation within about a second; it comes back
//! after two good checks. A request whose connection to a gateway is refused
//! is retried on another one (`retries`, `option redispatch`): that request
//! never reached a gateway, so retrying it is safe. A request already sent to
//! a gateway that dies is not retried by HAProxy (the client sees a 502 and
//! decides; our worker retries the same PUT with the same token and body).

use std::path::Path;
use std::time::Duration;

use crate::process::{find_binary, free_port, wait_until, Recipe};
use crate::service::{Server, Service};

/// An HAProxy balancing HTTP over gateways: what is its own (its config,
/// its stats page as readiness). The rest is [`Server`]'s.
#[derive(Debug, Clone)]
pub struct HaproxyService {
    /// The gateways' ports on 127.0.0.1, named `gw1`, `gw2`... in the stats.
    pub servers: Vec<u16>,
    pub stats_port: u16,
    /// With an address: connect to the gateways from it and send each
    /// connection's client in a PROXY protocol v2 header (`send-proxy-v2`,
    /// health checks too), for gateways that trust that address.
    pub proxy_protocol_from: Option<String>,
}

/// One `haproxy` process balancing HTTP over gateways. Killed on drop.
pub type Haproxy = Server<HaproxyService>;

/// The configuration for a balancer on `port` over gateways on `servers`,
/// with its stats page on `stats_port`.
pub fn config(port: u16, stats_port: u16, servers: &[u16], proxy_from: Option<&str>) -> String {
    let mut cfg = format!(
        "global\n\
         \x20   maxconn 4096\n\
         defaults\n\
         \x20   mode http\n\
         \x20   timeout connect 1s\n\
         \x20   timeout client 60s\n\
         \x20   timeout server 30s\n\
         \x20   timeout http-keep-alive 60s\n\
         \x20   retries 3\n\
         \x20   option redispatch\n\
         frontend gateways\n\
         \x20   bind 127.0.0.1:{port}\n\
         \x20   default_backend gateways\n\
         backend gateways\n\
         \x20   balance roundrobin\n\
         \x20   option httpchk GET /readyz\n\
         \x20   http-check expect status 200\n\
         \x20   default-server inter 300ms fastinter 200ms downinter 500ms fall 2 rise 2\n"
    );
    let proxy = proxy_from
        .map(|ip| format!(" source {ip} send-proxy-v2 check-send-proxy"))
        .unwrap_or_default();
    for (i, p) in servers.iter().enumerate() {
        cfg.push_str(&format!(
            "    server gw{} 127.0.0.1:{p} check{proxy}\n",
            i + 1
        ));
    }
    cfg.push_str(&format!(
        "listen stats\n\
         \x20   bind 127.0.0.1:{stats_port}\n\
         \x20   stats enable\n\
         \x20   stats uri /stats\n"
    ));
    cfg
}

impl Service for HaproxyService {
    const NAME: &'static str = "haproxy";
    /// The gateways need not be up: its stats page answers without them.
    const READY_WITHIN: Duration = Duration::from_secs(15);

    async fn prepare(&self, dir: &Path, port: u16) -> Recipe {
        let cfg = dir.join("haproxy.cfg");
        let proxy_from = self.proxy_protocol_from.as_deref();
        std::fs::write(
            &cfg,
            config(port, self.stats_port, &self.servers, proxy_from),
        )
        .expect("write haproxy.cfg");
        // -db: stay in the foreground; -W would add a master process.
        let args = vec![
            "-db".into(),
            "-f".into(),
            cfg.to_string_lossy().into_owned(),
        ];
        Recipe::new(
            find_binary("haproxy", &["/usr/sbin"]),
            args,
            dir.join("haproxy.log"),
        )
    }

    async fn probe(&self, _port: u16) -> anyhow::Result<()> {
        states_at(self.stats_port)
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(())
    }
}

impl Server<HaproxyService> {
    /// Start on a free port in front of `servers` and wait until it answers
    /// its stats page (the gateways need not be up yet).
    pub async fn start(servers: &[u16]) -> Self {
        Self::start_on(free_port(), servers).await
    }

    /// [`Haproxy::start`] on a chosen port.
    pub async fn start_on(port: u16, servers: &[u16]) -> Self {
        let service = HaproxyService {
            servers: servers.to_vec(),
            stats_port: free_port(),
            proxy_protocol_from: None,
        };
        Self::launch_on(service, port).await
    }

    /// [`Haproxy::start`], connecting to the gateways from `from` (a
    /// loopback address such as 127.0.0.5) with a PROXY protocol v2 header.
    pub async fn start_with_proxy_protocol(servers: &[u16], from: &str) -> Self {
        let service = HaproxyService {
            servers: servers.to_vec(),
            stats_port: free_port(),
            proxy_protocol_from: Some(from.to_owned()),
        };
        Self::launch_on(service, free_port()).await
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    /// `(server, status)` of each gateway as the health checks see it
    /// (`UP`, `DOWN`, `UP 1/2`...), from the stats page's CSV.
    pub async fn server_states(&self) -> Result<Vec<(String, String)>, String> {
        states_at(self.service().stats_port).await
    }

    /// Wait until `n` gateways are `UP`.
    pub async fn wait_up(&self, n: usize, timeout: Duration) -> Result<(), String> {
        wait_until(timeout, || async {
            let states = self.server_states().await?;
            let up = states.iter().filter(|(_, s)| s == "UP").count();
            if up >= n {
                Ok(())
            } else {
                Err(format!("{up} of {n} gateways UP: {states:?}"))
            }
        })
        .await
    }

    /// Wait until gateway `name` (`gw1`...) is `DOWN`.
    pub async fn wait_down(&self, name: &str, timeout: Duration) -> Result<(), String> {
        wait_until(timeout, || async {
            let states = self.server_states().await?;
            if states.iter().any(|(n, s)| n == name && s == "DOWN") {
                Ok(())
            } else {
                Err(format!("{name} not DOWN yet: {states:?}"))
            }
        })
        .await
    }
}

/// The gateways' states from the stats page on `stats_port`.
async fn states_at(stats_port: u16) -> Result<Vec<(String, String)>, String> {
    let csv = http_get(stats_port, "/stats;csv").await?;
    Ok(parse_states(&csv))
}

fn parse_states(csv: &str) -> Vec<(String, String)> {
    let mut lines = csv.lines();
    let Some(header) = lines.next() else {
        return vec![];
    };
    let cols: Vec<&str> = header.trim_start_matches("# ").split(',').collect();
    let col = |name: &str| cols.iter().position(|c| *c == name);
    let (Some(px), Some(sv), Some(st)) = (col("pxname"), col("svname"), col("status")) else {
        return vec![];
    };
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.get(px) == Some(&"gateways"))
        .filter(|f| !matches!(f.get(sv), Some(&"FRONTEND") | Some(&"BACKEND")))
        .filter_map(|f| Some((f.get(sv)?.to_string(), f.get(st)?.to_string())))
        .collect()
}

/// A bare HTTP/1.0 GET on 127.0.0.1 (no client crate in the harness).
async fn http_get(port: u16, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| format!("GET {path} on port {port}: no answer within 2 s"))?
        .map_err(|e| format!("GET {path} on port {port}: {e}"))?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "GET {path}: {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return dechunk(body).ok_or_else(|| format!("GET {path}: bad chunked body"));
    }
    Ok(body.to_string())
}

/// The payload of a `Transfer-Encoding: chunked` body (HAProxy's stats page
/// answers even an HTTP/1.0 request that way).
fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            super::dechunk("5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n").as_deref(),
            Some("hello, world")
        );
        assert_eq!(super::dechunk("5\r\nhel"), None);
    }

    #[test]
    fn server_states_come_from_the_stats_csv() {
        let csv = "# pxname,svname,qcur,status,x\n\
                   gateways,FRONTEND,0,OPEN,\n\
                   gateways,gw1,0,UP,\n\
                   gateways,gw2,0,DOWN,\n\
                   gateways,BACKEND,0,UP,\n\
                   stats,FRONTEND,0,OPEN,\n";
        assert_eq!(
            super::parse_states(csv),
            vec![
                ("gw1".to_string(), "UP".to_string()),
                ("gw2".to_string(), "DOWN".to_string())
            ]
        );
    }
}
