//! The dashboard in a real browser: headless Chromium, driven over WebDriver
//! (Debian's `chromium` and `chromium-driver`), against `scripts/stack`.
//!
//! The test opens `/` of the fenced gateway while the three workers edit page
//! `demo`, then runs the tutorial's straggler demos (steps 7 and 8) and waits,
//! with a deadline, until the page shows what happened: the straggler's lock
//! grant and its PUT refused (`token_not_current` from the issuer check, or
//! `stale_token` from the fence) on its lane and in the list of
//! attempts; then, through the unfenced gateway, the late PUT that landed,
//! drawn in red as a lost update and counted in the page list. It saves a
//! screenshot (`DASHBOARD_SCREENSHOT=path` chooses where) and writes the
//! caption of what it saw. With `DASHBOARD_UPDATE_DOCS=1` the two go into the
//! tutorial: docs/dashboard.png, and the caption between the markers under it
//! in docs/TUTORIAL.md, so the picture and its words come from one run.
//!
//! The scenario's own steps are checked through the history API first, so a
//! failure of the page itself is told apart from a straggler that did not
//! straggle. Without chromedriver or chromium the test fails and says what to
//! install: it never passes without a browser.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use harness::process::{temp_dir, Recipe};
use harness::stack::{repo, Stack};
use harness::ServiceProcess;
use serde_json::{json, Value};

/// How long the page may take to show something after the database has it.
const SHOW_WITHIN: Duration = Duration::from_secs(20);

/// chromedriver and chromium, or a failure that says what to install.
fn browser_binaries() -> (PathBuf, PathBuf) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let find = |name: &str| {
        std::env::split_paths(&path)
            .chain(["/usr/bin".into(), "/usr/lib/chromium".into()])
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "`{name}` is missing: the dashboard's browser test needs Debian's \
                     `chromium` and `chromium-driver` (`apt-get install chromium \
                     chromium-driver`; .ci/run installs them)"
                )
            })
    };
    (find("chromedriver"), find("chromium"))
}

/// chromedriver on a free port, killed (with its browsers) on drop.
struct Driver {
    process: ServiceProcess,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Driver {
    fn start(chromedriver: PathBuf) -> Driver {
        let dir = temp_dir("chromedriver");
        let port = harness::free_port();
        let process = ServiceProcess::spawn(
            "chromedriver",
            Recipe::new(
                chromedriver,
                vec![format!("--port={port}")],
                dir.path().join("chromedriver.log"),
            ),
        )
        .expect("spawn chromedriver");
        Driver {
            process,
            port,
            _dir: dir,
        }
    }

    /// A new headless Chromium session, with a fresh profile.
    async fn session(&self, chromium: &std::path::Path, profile: &std::path::Path) -> Client {
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        });
        let caps = caps.as_object().unwrap().clone();
        let url = format!("http://127.0.0.1:{}", self.port);
        harness::wait_until(Duration::from_secs(30), || {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            let caps = caps.clone();
            let url = url.clone();
            async move {
                ClientBuilder::new(connector)
                    .capabilities(caps)
                    .connect(&url)
                    .await
            }
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "no WebDriver session from chromedriver: {e}\n--- chromedriver log ---\n{}",
                self.process.log_tail(40)
            )
        })
    }
}

/// The browser, the stack and a runtime to drive the one while the other runs.
struct Scene {
    rt: tokio::runtime::Runtime,
    client: Client,
    stack: Stack,
}

impl Scene {
    /// Run `script` in the page until it returns something other than
    /// `null`/`false`, within `timeout`; that value.
    #[track_caller]
    fn wait_dom(&self, what: &str, script: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self
                .rt
                .block_on(self.client.execute(script, vec![]))
                .unwrap_or_else(|e| panic!("run script for {what}: {e}"));
            if !matches!(got, Value::Null | Value::Bool(false)) {
                return got;
            }
            if Instant::now() > deadline {
                let shot = self.screenshot("dashboard-failure.png");
                let log = self
                    .rt
                    .block_on(self.client.execute(
                        "return document.querySelector('#log').innerText.slice(0, 3000)",
                        vec![],
                    ))
                    .unwrap_or_default();
                panic!(
                    "the dashboard did not show {what} within {timeout:?} (screenshot: {})\n\
                     --- its list of attempts ---\n{}",
                    shot.display(),
                    log.as_str().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        let path = update_docs()
            .then(|| repo().join("docs/dashboard.png"))
            .or_else(|| std::env::var_os("DASHBOARD_SCREENSHOT").map(PathBuf::from))
            .filter(|_| name == "dashboard.png")
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name));
        let png = self
            .rt
            .block_on(self.client.screenshot())
            .expect("screenshot");
        std::fs::write(&path, png).expect("write screenshot");
        path
    }
}

/// What the page shows for one attempt (by its seq): its row in the list of
/// attempts, its mark on its client's lane, and the grant inferred for its
/// token; `null` until all are there.
fn shown(seq: &Value, client: &str, token: &Value, kind: &str) -> String {
    format!(
        r#"
        const row = document.querySelector('#log tr[data-seq="{seq}"]');
        const lane = [...document.querySelectorAll('#timeline g.lane')]
            .find((g) => g.getAttribute('data-client') === {client});
        const mark = lane && lane.querySelector('g.mark[data-seq="{seq}"]');
        const grant = lane && lane.querySelector('g.mark.grant[data-token="{token}"]');
        if (!row || !mark || !grant) return null;
        return {{
            row_class: row.className,
            row_outcome: row.querySelector('td.outcome').textContent,
            mark_class: mark.getAttribute('class'),
            mark_label: mark.querySelector('text') ? mark.querySelector('text').textContent : null,
            mark_fill: getComputedStyle(mark.querySelector('{shape}')).{paint},
            lane_label: lane.querySelector('.lane-label').textContent,
        }};
        "#,
        client = serde_json::to_string(client).unwrap(),
        shape = if kind == "refused" { "line" } else { "rect" },
        paint = if kind == "refused" { "stroke" } else { "fill" },
    )
}

const PAGE_COUNTERS: &str = r#"
    const tr = document.querySelector('#pages tr[data-page="demo"]');
    if (!tr) return null;
    const n = (c) => Number(tr.querySelector('td.' + c).textContent);
    return { writes: n('writes'), refused: n('refused'), lost: n('lost'),
             refused_class: tr.querySelector('td.refused').className,
             lost_class: tr.querySelector('td.lost').className };
"#;

const RED: &str = "rgb(198, 40, 40)";

/// `DASHBOARD_UPDATE_DOCS=1`: the screenshot and its caption go into docs/.
fn update_docs() -> bool {
    std::env::var("DASHBOARD_UPDATE_DOCS").as_deref() == Ok("1")
}

/// The tutorial's markers around the caption this test writes.
const CAPTION_START: &str =
    "<!-- dashboard caption: written by tests/tests/it/dashboard.rs; do not edit by hand -->\n";
const CAPTION_END: &str = "<!-- end of dashboard caption -->";

/// What the screenshot shows, in words, from what this run saw: the fenced
/// straggler's token, the fence its PUT met and why it was refused; the
/// unfenced one's, and the acknowledged edits it made disappear (the others'
/// lines its stale body replaced, or its own, written over by a worker that
/// had read the page before its PUT).
fn caption(fenced: &Value, unfenced: &Value, lost: &[Value]) -> String {
    let edits: Vec<String> = lost
        .iter()
        .map(|e| match e["client_id"].as_str().unwrap_or("?") {
            "straggler-unfenced" => format!(
                "its own (token {}), written over by a worker that had read the page before it",
                e["token"]
            ),
            client => format!("{client}'s (token {})", e["token"]),
        })
        .collect();
    let gone = match edits.len() {
        1 => "an acknowledged edit is",
        _ => "acknowledged edits are",
    };
    format!(
        "`straggler` was granted token {}, read the page and froze; the other workers \
         went on, and when its PUT arrived the page's fence was at {}: refused \
         (`{}`). `straggler-unfenced` did the same through the unfenced gateway \
         with token {}: its PUT landed (`stale`, the fence at {}), drawn in red as \
         a lost update, and {gone} gone from the body: {}.",
        fenced["token"],
        fenced["fence_token"],
        fenced["outcome"].as_str().unwrap_or("?"),
        unfenced["token"],
        unfenced["fence_token"],
        edits.join("; "),
    )
}

/// Replace the caption between the tutorial's markers.
fn write_caption(text: &str) {
    let path = repo().join(harness::transcript::TUTORIAL);
    let doc = std::fs::read_to_string(&path).expect("read the tutorial");
    let start = doc.find(CAPTION_START).expect("the caption's start marker") + CAPTION_START.len();
    let end = start
        + doc[start..]
            .find(CAPTION_END)
            .expect("the caption's end marker");
    let doc = format!("{}{text}\n{}", &doc[..start], &doc[end..]);
    std::fs::write(&path, doc).expect("write the tutorial");
}

#[test]
fn the_stragglers_refused_write_and_lost_update_appear_on_the_dashboard_as_they_happen() {
    let started = Instant::now();
    let (chromedriver, chromium) = browser_binaries();
    let stack = Stack::up("stack-dashboard-");
    stack.wait_for_page("demo", Duration::from_secs(60));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let driver = Driver::start(chromedriver);
    let profile = tempfile::Builder::new()
        .prefix("chromium-profile-")
        .tempdir()
        .unwrap();
    let client = rt.block_on(driver.session(&chromium, profile.path()));
    let scene = Scene { rt, client, stack };

    // `/` leads to the dashboard, which follows the page written last.
    let root = format!("{}/", scene.stack.gateway_url());
    scene.rt.block_on(scene.client.goto(&root)).expect("open /");
    let head = scene.wait_dom(
        "the workers' attempts, live",
        r#"
        if (document.querySelector('#status').textContent !== 'live') return null;
        if (!document.querySelector('#timeline g.mark.write')) return null;
        return { title: document.querySelector('#page-title').textContent,
                 mode: document.querySelector('#mode').textContent,
                 url: location.pathname };
        "#,
        SHOW_WITHIN,
    );
    assert_eq!(
        head,
        json!({"title": "page demo", "mode": "this gateway: fencing enforced", "url": "/dashboard"})
    );

    // Tutorial step 7: the gateway refuses the straggler's late PUT.
    let straggle = scene.stack.straggle("straggler");
    let (get, put) = (straggle.get, straggle.put);
    let fenced_put = put.clone();
    // Refused by the issuer check (the lock moved on) or by the fence.
    let refused = put["outcome"].as_str().unwrap_or_default().to_string();
    assert!(
        refused == "token_not_current" || refused == "stale_token",
        "the scenario: {put}"
    );
    let seen = scene.wait_dom(
        "the straggler's refused PUT",
        &shown(&put["seq"], "straggler", &get["token"], "refused"),
        SHOW_WITHIN,
    );
    assert_eq!(seen["row_class"], "refused", "{seen}");
    assert_eq!(seen["row_outcome"], refused.as_str(), "{seen}");
    assert_eq!(seen["mark_class"], "mark refused", "{seen}");
    assert_eq!(seen["mark_label"], refused.as_str(), "{seen}");
    assert_eq!(seen["mark_fill"], RED, "{seen}");
    assert_eq!(seen["lane_label"], "straggler", "{seen}");
    let counters = scene.wait_dom("the page's refusal counted", PAGE_COUNTERS, SHOW_WITHIN);
    assert!(counters["refused"].as_i64() >= Some(1), "{counters}");
    assert_eq!(counters["lost"], 0, "no lost update with the fence on");

    // Tutorial step 8: without the fence the late PUT lands, and an
    // acknowledged edit is lost.
    let straggle = scene.stack.straggle("straggler-unfenced");
    let (get, put) = (straggle.get, straggle.put);
    assert_eq!(put["outcome"], "stale", "the scenario: {put}");
    let lost = scene.stack.lost_edits("demo");
    assert!(
        !lost.is_empty(),
        "no acknowledged edit was lost without fencing"
    );
    let seen = scene.wait_dom(
        "the unfenced straggler's stale PUT",
        &shown(&put["seq"], "straggler-unfenced", &get["token"], "stale"),
        SHOW_WITHIN,
    );
    assert_eq!(seen["row_class"], "stale", "{seen}");
    assert_eq!(seen["row_outcome"], "stale (lost update)", "{seen}");
    assert_eq!(seen["mark_class"], "mark stale", "{seen}");
    assert_eq!(seen["mark_label"], "stale write: lost update", "{seen}");
    assert_eq!(seen["mark_fill"], RED, "{seen}");
    let counters = scene.wait_dom(
        "the lost update counted",
        &PAGE_COUNTERS.replace(
            "return {",
            "if (tr.querySelector('td.lost').textContent === '0') return null; return {",
        ),
        SHOW_WITHIN,
    );
    assert_eq!(counters["lost"], 1, "{counters}");
    assert_eq!(
        counters["lost_class"], "n lost some",
        "drawn in red: {counters}"
    );

    let shot = scene.screenshot("dashboard.png");
    let text = caption(&fenced_put, &put, &lost);
    if update_docs() {
        write_caption(&text);
    }
    eprintln!(
        "screenshot: {} (the test took {:?})\ncaption: {text}",
        shot.display(),
        started.elapsed()
    );
    let Scene { rt, client, stack } = scene;
    rt.block_on(client.close())
        .expect("end the WebDriver session");
    drop(driver);
    drop(stack);
}
