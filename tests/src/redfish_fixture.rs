//! A small Redfish service on a loopback port, shaped like a Dell iDRAC
//! (hand-written from the DMTF ComputerSystem schema and mockups): what
//! sushy-tools' fake driver does not do. It keeps `Once` apart from
//! `Continuous` and clears a `Once` override at the next power-on, sends
//! an ETag and answers a PATCH without the matching `If-Match` with 412,
//! advertises Dell's reset types (no PowerCycle, no GracefulShutdown),
//! can fail the next reset with a 500 and a Redfish ExtendedInfo message,
//! and authenticates with a SessionService (X-Auth-Token) or, when
//! started without one, HTTP basic only.
//!
//! For the fallback tests it can also fail in the ways a BMC's Redfish
//! service fails while its IPMI still works: answer every request with an
//! HTTP error ([`RedfishFixture::fail_all`]), or accept a boot override and
//! read back another target ([`RedfishFixture::lie_on_read_back`]); and it
//! can listen inside a lab namespace ([`RedfishFixture::start_in`]). Its
//! power and boot override can drive a QEMU guest through the chassis
//! directory of [`crate::bmc_lab::PoweredGuest`]
//! ([`RedfishFixture::drive_chassis`]), as ipmi_sim's chassis program does.
//!
//! One thread serves one connection at a time and closes each after its
//! answer. Every request is recorded for the tests to inspect.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use serde_json::{Value, json};

use crate::bmc_sim::{BOOT_FILE, POWER_FILE, REPLY_FILE, REQUEST_FILE};

/// The fixture's user and password.
pub const USER: &str = "root";
pub const PASSWORD: &str = "calvin-fixture";
/// The system's path.
pub const SYSTEM: &str = "/redfish/v1/Systems/System.Embedded.1";
/// The session token it hands out.
const TOKEN: &str = "fixture-token-0123456789abcdef";
const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";
const SESSION: &str = "/redfish/v1/SessionService/Sessions/22";

/// A request as the fixture saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub token: Option<String>,
    pub basic: bool,
    pub if_match: Option<String>,
    pub body: Value,
}

/// The system's state.
#[derive(Debug)]
struct System {
    power: &'static str,
    target: String,
    enabled: String,
    mode: String,
    etag: u32,
    fail_next_reset: bool,
    /// Every request is answered with this status.
    fail_all: Option<u16>,
    /// GETs of the system report this override target, whatever was set.
    lie_target: Option<String>,
    /// The chassis directory of a guest watcher: power comes from it and
    /// resets and the boot override go to it.
    chassis: Option<PathBuf>,
}

struct Shared {
    system: Mutex<System>,
    seen: Mutex<Vec<Seen>>,
    sessions: bool,
    /// The account it accepts.
    user: String,
    password: String,
    stop: AtomicBool,
}

/// A running fixture service.
pub struct RedfishFixture {
    pub port: u16,
    /// The address it listens on.
    pub ip: String,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl RedfishFixture {
    /// With a SessionService when `sessions`, else basic authentication.
    pub fn start(sessions: bool) -> RedfishFixture {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fixture");
        RedfishFixture::serve_on(listener, sessions, USER, PASSWORD)
    }

    /// Listening on `ip`:`port` inside the namespace `ns` (which the test
    /// made), accepting `user` and `password`.
    pub fn start_in(ns: &str, ip: &str, port: u16, user: &str, password: &str) -> RedfishFixture {
        let at = format!("{ip}:{port}");
        let listener = crate::raw::in_netns(ns, move || TcpListener::bind(at))
            .expect("enter the fixture's namespace")
            .expect("bind fixture");
        RedfishFixture::serve_on(listener, true, user, password)
    }

    fn serve_on(
        listener: TcpListener,
        sessions: bool,
        user: &str,
        password: &str,
    ) -> RedfishFixture {
        let ip = listener.local_addr().unwrap().ip().to_string();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared {
            system: Mutex::new(System {
                power: "On",
                target: "None".into(),
                enabled: "Disabled".into(),
                mode: "UEFI".into(),
                etag: 1,
                fail_next_reset: false,
                fail_all: None,
                lie_target: None,
                chassis: None,
            }),
            seen: Mutex::new(Vec::new()),
            sessions,
            user: user.to_owned(),
            password: password.to_owned(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let _ = serve(&s, stream);
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        RedfishFixture {
            port,
            ip,
            shared,
            thread: Some(thread),
        }
    }

    /// `redfish+http://IP:PORT` with the system's path.
    pub fn address(&self) -> String {
        format!("redfish+http://{}:{}{SYSTEM}", self.ip, self.port)
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Answers every request with `status` (`None`: serve again).
    pub fn fail_all(&self, status: Option<u16>) {
        self.system().fail_all = status;
    }

    /// Reports `target` as the boot override on every GET of the system,
    /// whatever a PATCH set.
    pub fn lie_on_read_back(&self, target: &str) {
        self.system().lie_target = Some(target.to_owned());
    }

    /// Hands power to the guest watcher of chassis directory `dir` (see
    /// [`crate::bmc_lab`]): the guest is off until a reset turns it on.
    pub fn drive_chassis(&self, dir: PathBuf) {
        let mut s = self.system();
        s.power = "Off";
        s.chassis = Some(dir);
    }

    /// The power state as the fixture holds it (`On`, `Off`).
    pub fn power(&self) -> &'static str {
        self.system().power
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The next reset is answered 500 with an ExtendedInfo message.
    pub fn fail_next_reset(&self) {
        self.system().fail_next_reset = true;
    }

    /// Changes the ETag behind the client's back (another client's PATCH).
    pub fn bump_etag(&self) {
        self.system().etag += 1;
    }

    /// Powers the system off and on, consuming a `Once` override.
    pub fn reboot(&self) {
        let mut s = self.system();
        if s.enabled == "Once" {
            s.enabled = "Disabled".into();
        }
    }

    fn system(&self) -> std::sync::MutexGuard<'_, System> {
        self.shared
            .system
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for RedfishFixture {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(shared: &Shared, mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_len, method, path, headers) = loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut hs = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut hs);
        if let Ok(httparse::Status::Complete(len)) = req.parse(&buf) {
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            break (
                len,
                req.method.unwrap_or("").to_owned(),
                req.path.unwrap_or("").to_owned(),
                headers,
            );
        }
    };
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_len + length {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body: Value = serde_json::from_slice(&buf[head_len..]).unwrap_or(Value::Null);
    let basic_ok = header("authorization").is_some_and(|v| {
        v == format!(
            "Basic {}",
            base64(format!("{}:{}", shared.user, shared.password).as_bytes())
        )
    });
    let token = header("x-auth-token");
    shared
        .seen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Seen {
            method: method.clone(),
            path: path.clone(),
            token: token.clone(),
            basic: header("authorization").is_some(),
            if_match: header("if-match"),
            body: body.clone(),
        });
    let authed = basic_ok || token.as_deref() == Some(TOKEN);
    let (status, extra, answer) = answer(shared, &method, &path, &body, authed, header("if-match"));
    let text = if answer.is_null() {
        String::new()
    } else {
        answer.to_string()
    };
    let reason = match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        401 => "Unauthorized",
        404 => "Not Found",
        412 => "Precondition Failed",
        _ => "Status",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\nOData-Version: 4.0\r\n",
        text.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&text);
    stream.write_all(out.as_bytes())
}

type Answer = (u16, Vec<(&'static str, String)>, Value);

fn error(status: u16, message: &str) -> Answer {
    (
        status,
        vec![],
        json!({"error": {
            "code": "Base.1.8.GeneralError",
            "message": "A general error has occurred. See ExtendedInfo for more information.",
            "@Message.ExtendedInfo": [{
                "MessageId": "Base.1.8.GeneralError",
                "Message": message,
                "Severity": "Critical",
            }],
        }}),
    )
}

fn answer(
    shared: &Shared,
    method: &str,
    path: &str,
    body: &Value,
    authed: bool,
    if_match: Option<String>,
) -> Answer {
    let mut s = shared.system.lock().unwrap_or_else(PoisonError::into_inner);
    let etag = format!("W/\"{}\"", s.etag);
    if let Some(status) = s.fail_all {
        return error(
            status,
            "Unable to complete the operation because the service is not available.",
        );
    }
    let reported_target = s.lie_target.clone().unwrap_or_else(|| s.target.clone());
    if let Some(dir) = &s.chassis {
        let on = fs::read_to_string(dir.join(POWER_FILE)).is_ok_and(|p| p.trim() == "1");
        s.power = if on { "On" } else { "Off" };
    }
    match (method, path) {
        ("GET", "/redfish/v1/" | "/redfish/v1") => {
            let mut root = json!({
                "@odata.id": "/redfish/v1",
                "@odata.type": "#ServiceRoot.v1_11_0.ServiceRoot",
                "Id": "RootService",
                "Name": "Root Service",
                "RedfishVersion": "1.15.0",
                "Systems": {"@odata.id": "/redfish/v1/Systems"},
                "Managers": {"@odata.id": "/redfish/v1/Managers"},
                "Links": {},
            });
            if shared.sessions {
                root["SessionService"] = json!({"@odata.id": "/redfish/v1/SessionService"});
                root["Links"]["Sessions"] = json!({"@odata.id": SESSIONS});
            }
            (200, vec![], root)
        }
        ("POST", SESSIONS) if shared.sessions => {
            if body["UserName"] == shared.user.as_str()
                && body["Password"] == shared.password.as_str()
            {
                (
                    201,
                    vec![
                        ("X-Auth-Token", TOKEN.to_owned()),
                        ("Location", SESSION.to_owned()),
                    ],
                    json!({"@odata.id": SESSION, "Id": "22", "UserName": shared.user}),
                )
            } else {
                error(
                    401,
                    "The authentication credentials included with this request are missing or invalid.",
                )
            }
        }
        _ if !authed => error(
            401,
            "The authentication credentials included with this request are missing or invalid.",
        ),
        ("DELETE", SESSION) => (204, vec![], Value::Null),
        ("GET", SYSTEM) => (
            200,
            vec![("ETag", etag.clone())],
            json!({
                "@odata.id": SYSTEM,
                "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
                "@odata.etag": etag,
                "Id": "System.Embedded.1",
                "Manufacturer": "Dell Inc.",
                "Model": "PowerEdge R650",
                "PowerState": s.power,
                "Boot": {
                    "BootSourceOverrideEnabled": s.enabled,
                    "BootSourceOverrideTarget": reported_target,
                    "BootSourceOverrideMode": s.mode,
                    "BootSourceOverrideTarget@Redfish.AllowableValues": [
                        "None", "Pxe", "Floppy", "Cd", "Hdd", "BiosSetup", "Utilities",
                        "UefiTarget", "SDCard", "UefiHttp"
                    ],
                },
                "Actions": {"#ComputerSystem.Reset": {
                    "target": format!("{SYSTEM}/Actions/ComputerSystem.Reset"),
                    "ResetType@Redfish.AllowableValues": [
                        "On", "ForceOff", "ForceRestart", "GracefulRestart", "PushPowerButton",
                        "Nmi", "PowerCycle"
                    ],
                }},
                "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/iDRAC.Embedded.1"}]},
            }),
        ),
        ("GET", "/redfish/v1/Managers/iDRAC.Embedded.1") => (
            200,
            vec![],
            json!({
                "@odata.id": "/redfish/v1/Managers/iDRAC.Embedded.1",
                "Id": "iDRAC.Embedded.1",
                "Manufacturer": "Dell Inc.",
                "Model": "15G Monolithic",
                "FirmwareVersion": "6.10.30.00",
            }),
        ),
        ("PATCH", SYSTEM) => {
            if if_match.as_deref() != Some(etag.as_str()) {
                return error(
                    412,
                    "The resource has changed since the ETag in If-Match was read.",
                );
            }
            let boot = &body["Boot"];
            if let Some(t) = boot["BootSourceOverrideTarget"].as_str() {
                s.target = t.to_owned();
            }
            if let Some(e) = boot["BootSourceOverrideEnabled"].as_str() {
                s.enabled = e.to_owned();
            }
            if let Some(m) = boot["BootSourceOverrideMode"].as_str() {
                s.mode = m.to_owned();
            }
            if let Some(dir) = &s.chassis {
                let device = match s.target.as_str() {
                    "Pxe" | "UefiHttp" => "pxe",
                    "Hdd" => "default",
                    "BiosSetup" => "bios",
                    "Cd" => "cdrom",
                    _ => "none",
                };
                fs::write(dir.join(BOOT_FILE), format!("{device}\n")).expect("write boot file");
            }
            s.etag += 1;
            (204, vec![], Value::Null)
        }
        ("POST", p) if p == format!("{SYSTEM}/Actions/ComputerSystem.Reset") => {
            if s.fail_next_reset {
                s.fail_next_reset = false;
                return error(
                    500,
                    "Unable to complete the operation because the server is busy.",
                );
            }
            let request = match body["ResetType"].as_str() {
                Some("On") => "power 1",
                Some("ForceOff") => "power 0",
                Some("ForceRestart" | "PowerCycle" | "GracefulRestart") => "reset 1",
                _ => return error(400, "The value for ResetType is not supported."),
            };
            if let Some(dir) = s.chassis.clone() {
                if let Err(e) = to_guest(&dir, request) {
                    return error(500, &format!("The chassis did not act: {e}"));
                }
                // The next boot consumes a Once override.
                if request != "power 0" && s.enabled == "Once" {
                    s.enabled = "Disabled".into();
                }
            }
            match request {
                "power 1" => s.power = "On",
                "power 0" => s.power = "Off",
                _ => {}
            }
            (204, vec![], Value::Null)
        }
        _ => error(404, "The resource at the URI was not found."),
    }
}

/// Hands `request` (`power 1`, `reset 1`, ...) to the guest watcher of
/// `dir` and waits (at most 10 s) for its answer, as ipmi_sim's chassis
/// program does.
fn to_guest(dir: &Path, request: &str) -> Result<(), String> {
    let tmp = dir.join("request.tmp");
    fs::write(&tmp, format!("{request}\n")).map_err(|e| e.to_string())?;
    let _ = fs::remove_file(dir.join(REPLY_FILE));
    fs::rename(&tmp, dir.join(REQUEST_FILE)).map_err(|e| e.to_string())?;
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while dir.join(REQUEST_FILE).exists() {
        if std::time::Instant::now() > end {
            let _ = fs::remove_file(dir.join(REQUEST_FILE));
            return Err("no guest watcher".into());
        }
        thread::sleep(Duration::from_millis(20));
    }
    match fs::read_to_string(dir.join(REPLY_FILE)) {
        Ok(reply) if reply.trim() == "ok" => Ok(()),
        Ok(reply) => Err(reply.trim().to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// Standard base64 (RFC 4648 §4).
fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 0x3f) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
