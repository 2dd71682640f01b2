//! Headless Chromium, driven over the DevTools protocol (a websocket): open a page,
//! evaluate JavaScript, click with the mouse where an element is, take screenshots.
//!
//! Chromium must be installed (Debian: `apt-get install -y chromium`; `.ci/run` does
//! it): without it the test fails and says so, it is never skipped.

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Longest a single DevTools call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest one in-page watch of a `wait_for` condition lasts before it is checked anew.
const WATCH: Duration = Duration::from_secs(1);

/// Whether a DevTools error says the page's document was replaced under the call.
fn navigated_away(e: &Value) -> bool {
    let m = e["message"].as_str().unwrap_or("");
    m.contains("context was destroyed")
        || m.contains("Cannot find context")
        || m.contains("navigated or closed")
}

/// The browser binary: `$CHROMIUM`, else `chromium` or `chromium-browser` on PATH.
fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(p);
    }
    for name in ["chromium", "chromium-browser"] {
        if let Some(dir) = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .find(|d| d.join(name).is_file())
        {
            return dir.join(name);
        }
    }
    panic!(
        "chromium not found on PATH (nor $CHROMIUM): the dashboard's browser test needs a \
         real headless Chromium. Install it with `apt-get update && apt-get install -y \
         chromium` (.ci/run does this when it is missing)"
    )
}

/// A headless Chromium with one page attached; killed on Drop.
pub struct Browser {
    child: Child,
    profile: PathBuf,
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
}

impl Browser {
    /// Starts Chromium (a fresh profile, no network but what the page asks for) with a
    /// 1280x900 window, and opens a blank page.
    pub async fn launch() -> Browser {
        let profile = std::env::temp_dir().join(format!(
            "pelican-chromium-{}-{}",
            std::process::id(),
            pelican_testkit::free_port()
        ));
        let mut child = Command::new(binary())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--no-first-run",
                "--no-default-browser-check",
                "--mute-audio",
                "--hide-scrollbars",
                "--window-size=1280,900",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start chromium: {e}"));
        // It prints "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID".
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(url) = line.split("DevTools listening on ").nth(1) {
                        let _ = tx.send(url.trim().to_string());
                        sent = true;
                    }
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("chromium did not print its DevTools address within 60 s");
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("connect to chromium's DevTools websocket");
        let mut b = Browser {
            child,
            profile,
            ws,
            session: String::new(),
            next_id: 0,
        };
        let target = b
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let target_id = target["targetId"].as_str().unwrap().to_string();
        let attached = b
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target_id, "flatten": true }),
            )
            .await;
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        b.call("Page.enable", json!({})).await;
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        b
    }

    /// One DevTools call (on the page's session once attached); panics on an error.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        match self.try_call(method, params).await {
            Ok(v) => v,
            Err(e) => panic!("{method} failed: {e}"),
        }
    }

    /// One DevTools call: its result, or the error Chromium answered with.
    async fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        self.ws
            .send(Message::Text(msg.to_string().into()))
            .await
            .expect("send to chromium");
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = tokio::time::timeout(left, self.ws.next())
                .await
                .unwrap_or_else(|_| {
                    panic!("chromium did not answer {method} within {CALL_TIMEOUT:?}")
                });
            let text = match next {
                Some(Ok(Message::Text(t))) => t.to_string(),
                Some(Ok(_)) => continue,
                other => panic!("chromium's websocket ended during {method}: {other:?}"),
            };
            let v: Value = serde_json::from_str(&text).expect("DevTools messages are JSON");
            if v["id"] != json!(id) {
                continue; // an event, or another call's answer
            }
            if let Some(e) = v.get("error") {
                return Err(e.clone());
            }
            return Ok(v["result"].clone());
        }
    }

    /// Loads `url` and waits until its document has loaded.
    pub async fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
        self.wait_for("the page to load", "document.readyState === 'complete'")
            .await;
    }

    /// The value of a JavaScript expression (promises awaited).
    pub async fn eval(&mut self, expr: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr} threw: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Waits until `cond` (a JavaScript expression) is true; panics after 30 s with what
    /// the page shows. The page itself watches: `cond` is checked again on every change
    /// to the document (and to its load state), so the wait ends as soon as it holds.
    /// A navigation ends the page's watch; it starts again in the new document.
    pub async fn wait_for(&mut self, what: &str, cond: &str) {
        let start = Instant::now();
        loop {
            let left = super::DEADLINE.saturating_sub(start.elapsed());
            if left.is_zero() {
                let text = self
                    .eval("document.body ? document.body.innerText : ''")
                    .await;
                panic!(
                    "timed out after {:?} waiting for {what} ({cond}); the page shows:\n{}",
                    start.elapsed(),
                    text.as_str().unwrap_or("")
                );
            }
            // One watch lasts at most WATCH (or what is left of the deadline): conditions
            // that no document change announces (a timer's work) are checked then.
            let watch_ms = left.min(WATCH).as_millis();
            let expr = format!(
                "new Promise((resolve, reject) => {{ \
                   const holds = () => !!({cond}); \
                   let done = false, timer, obs; \
                   const finish = (ok) => {{ if (done) return; done = true; clearTimeout(timer); \
                     if (obs) obs.disconnect(); document.removeEventListener('readystatechange', check); \
                     resolve(ok); }}; \
                   const check = () => {{ try {{ if (holds()) finish(true); }} \
                     catch (e) {{ done = true; reject(e); }} }}; \
                   check(); if (done) return; \
                   obs = new MutationObserver(check); \
                   obs.observe(document, {{ subtree: true, childList: true, attributes: true, characterData: true }}); \
                   document.addEventListener('readystatechange', check); \
                   timer = setTimeout(() => {{ try {{ finish(holds()); }} catch (e) {{ done = true; reject(e); }} }}, {watch_ms}); \
                 }})"
            );
            let r = self
                .try_call(
                    "Runtime.evaluate",
                    json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
                )
                .await;
            match r {
                Ok(r) => {
                    if let Some(e) = r.get("exceptionDetails") {
                        panic!("waiting for {what}: {cond} threw: {e}");
                    }
                    if r["result"]["value"] == json!(true) {
                        return;
                    }
                }
                // The document went away under the watch (a navigation): watch the new one.
                Err(e) if navigated_away(&e) => {}
                Err(e) => panic!("waiting for {what}: Runtime.evaluate failed: {e}"),
            }
        }
    }

    /// The text of the first element matching `selector` (`None` if there is none).
    pub async fn text(&mut self, selector: &str) -> Option<String> {
        let sel = serde_json::to_string(selector).unwrap();
        self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); return e ? e.textContent : null; }})()"
        ))
        .await
        .as_str()
        .map(str::to_string)
    }

    /// Clicks the middle of the first element matching `selector` with the mouse (as a
    /// person would: it must be visible and on top there).
    pub async fn click(&mut self, selector: &str) {
        let sel = serde_json::to_string(selector).unwrap();
        let at = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({sel}); if (!e) return null; \
                 e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
                 const x = r.left + r.width / 2, y = r.top + r.height / 2; \
                 const top = document.elementFromPoint(x, y); \
                 return {{ x, y, onTop: !!top && (top === e || e.contains(top)) }}; }})()"
            ))
            .await;
        assert!(!at.is_null(), "nothing matches {selector} to click");
        assert_eq!(
            at["onTop"],
            json!(true),
            "{selector} is covered by another element"
        );
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": at["x"], "y": at["y"], "button": "left", "clickCount": 1 }),
            )
            .await;
        }
    }

    /// Types `text` into the focused element, as a keyboard would.
    pub async fn type_text(&mut self, text: &str) {
        self.call("Input.insertText", json!({ "text": text })).await;
    }

    /// Saves a PNG of the page: the 1280x900 viewport, or the whole page if `full`.
    pub async fn screenshot(&mut self, path: &Path, full: bool) {
        use base64::Engine;
        let height = if full {
            self.eval("Math.max(900, Math.ceil(document.documentElement.scrollHeight))")
                .await
                .as_u64()
                .unwrap_or(900)
        } else {
            900
        };
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        let r = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("base64 screenshot");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
