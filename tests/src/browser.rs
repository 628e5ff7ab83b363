//! A real browser for the tests: Debian's headless Chromium, started in a
//! test's namespace and driven over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: commands on its fd 3, answers on its fd 4),
//! so that it needs no listening port and reaches nothing but what the
//! namespace holds. It evaluates script in the page, clicks with the
//! mouse at a point and takes screenshots.

use std::{
    io::{BufRead, BufReader, Write},
    process::{ChildStdin, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use base64::Engine as _;
use serde_json::{Value, json};
use xtask::{ChildGuard, Lab};

use crate::agent::Scratch;

/// The browser itself; `/usr/bin/chromium` is a wrapper script that does
/// not exec it, and the guard must hold the browser's own PID.
const CHROMIUM: &str = "/usr/lib/chromium/chromium";

/// How long one protocol call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Browser {
    to: ChildStdin,
    answers: mpsc::Receiver<Value>,
    next_id: u64,
    /// The page's session, which page-level calls go to.
    session: String,
    child: ChildGuard,
    _profile: Scratch,
}

impl Browser {
    /// Starts Chromium in `ns` of `lab` with a fresh profile and a
    /// `width`×`height` window, and attaches to its page.
    ///
    /// # Panics
    /// If Chromium is missing or does not answer.
    pub fn start(lab: &Lab, ns: &str, width: u32, height: u32) -> Browser {
        assert!(
            std::path::Path::new(CHROMIUM).exists(),
            "{CHROMIUM} missing: install Debian's chromium (`cargo xtask setup` does)"
        );
        let profile = Scratch::new("chromium-profile");
        let mut cmd = lab.cmd_in(ns, "sh");
        // The pipe is the child's stdin and stdout moved to fds 3 and 4.
        cmd.args([
            "-c",
            "exec \"$0\" \"$@\" 3<&0 4>&1 </dev/null >/dev/null",
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-breakpad",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
            &format!("--window-size={width},{height}"),
            &format!("--user-data-dir={}", profile.0.display()),
            "about:blank",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = ChildGuard::spawn(&mut cmd).expect("spawn chromium");
        let to = child.0.stdin.take().expect("chromium's command pipe");
        let from = child.0.stdout.take().expect("chromium's answer pipe");
        let (tx, answers) = mpsc::channel();
        thread::spawn(move || {
            // Messages end with a NUL; only answers (with an id) are kept.
            for message in BufReader::new(from).split(0) {
                let Ok(message) = message else { return };
                let Ok(value) = serde_json::from_slice::<Value>(&message) else {
                    continue;
                };
                if value.get("id").is_some() && tx.send(value).is_err() {
                    return;
                }
            }
        });
        let mut browser = Browser {
            to,
            answers,
            next_id: 0,
            session: String::new(),
            child,
            _profile: profile,
        };
        let targets = browser.send(None, "Target.getTargets", json!({}));
        let page = targets["targetInfos"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .unwrap_or_else(|| panic!("chromium has no page: {targets}"))["targetId"]
            .clone();
        let attached = browser.send(
            None,
            "Target.attachToTarget",
            json!({"targetId": page, "flatten": true}),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {attached}"))
            .to_owned();
        browser.call("Page.enable", json!({}));
        browser.call("Runtime.enable", json!({}));
        browser
    }

    fn send(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("json");
        bytes.push(0);
        self.to
            .write_all(&bytes)
            .unwrap_or_else(|e| panic!("chromium's pipe closed at {method}: {e}"));
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .answers
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no answer from chromium to {method}: {e}"));
            if answer["id"] != id {
                continue;
            }
            if let Some(error) = answer.get("error") {
                panic!("chromium refused {method}: {error}");
            }
            return answer["result"].clone();
        }
    }

    /// A call on the page's session.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.send(Some(&session), method, params)
    }

    /// Opens `url` and waits until it loaded.
    pub fn open(&mut self, url: &str) {
        let nav = self.call("Page.navigate", json!({"url": url}));
        assert!(nav.get("errorText").is_none(), "opening {url}: {nav}");
        self.wait_for(
            "the page to load",
            "document.readyState === 'complete'",
            Duration::from_secs(20),
        );
    }

    /// The value of `expression` in the page, promises awaited.
    ///
    /// # Panics
    /// If it throws.
    pub fn eval(&mut self, expression: &str) -> Value {
        let out = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = out.get("exceptionDetails") {
            panic!("{expression} threw: {e}");
        }
        out["result"]["value"].clone()
    }

    /// Evaluates `expression` every 100 ms until it is truthy, and returns
    /// that value.
    ///
    /// # Panics
    /// After `within`, naming `what`.
    pub fn wait_for(&mut self, what: &str, expression: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let value = self.eval(expression);
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "waited {} s for {what}; last value: {value}",
                within.as_secs()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// A left click with the mouse at (`x`, `y`) in CSS pixels of the
    /// viewport: pressed and released, as a user's.
    pub fn click_at(&mut self, x: f64, y: f64) {
        self.call(
            "Input.dispatchMouseEvent",
            json!({"type": "mouseMoved", "x": x, "y": y}),
        );
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }

    /// Types `text` into the focused element.
    pub fn type_text(&mut self, text: &str) {
        self.call("Input.insertText", json!({"text": text}));
    }

    /// The viewport as PNG.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG")
    }
}

impl Drop for Browser {
    /// Asks the browser to close, so that it takes its helper processes
    /// with it; the guard ends it by its PID if it does not.
    fn drop(&mut self) {
        self.next_id += 1;
        let mut bytes = serde_json::to_vec(&json!({"id": self.next_id, "method": "Browser.close"}))
            .expect("json");
        bytes.push(0);
        if self.to.write_all(&bytes).is_ok() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if matches!(self.child.0.try_wait(), Ok(Some(_))) {
                    return;
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
