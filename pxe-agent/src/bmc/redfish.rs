//! The Redfish driver: one ComputerSystem of one Redfish service (DMTF
//! DSP0266) over HTTP/1.1, with TLS from rustls (ring provider).
//!
//! Owns the HTTP exchanges, authentication (a SessionService session when
//! the service has one, else HTTP basic), TLS trust (a per-host CA bundle,
//! the system roots, or no verification only when asked), deadlines and
//! retries, and the mapping between Redfish properties and the [`Bmc`]
//! trait's types. It does not parse addresses ([`super::address`]) nor
//! choose a driver for a host ([`super::driver`]).
//!
//! What is read back after a boot override, and when it agrees: the
//! `BootSourceOverrideTarget` must equal what was set, and so must
//! `BootSourceOverrideMode` when the system reports one. For
//! `BootSourceOverrideEnabled`, `Continuous` read back after setting
//! `Once` is accepted with a warning (several BMCs and sushy-tools' fake
//! driver keep only `Continuous`: the host will keep booting the device
//! until told otherwise); any other difference is a mismatch.

use std::{
    collections::HashSet,
    fmt,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use http_body_util::{BodyExt as _, Full};
use hyper::{
    Method, Request,
    body::Bytes,
    header::{self, HeaderValue},
};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde_json::{Value, json};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::{
    sync::lock,
    trust::{self, Trust, TrustError},
};

use super::{
    Bmc, BmcAddress, BmcError, BmcInfo, BootDevice, BootFlags, BootTarget, Credentials,
    PowerAction, PowerState, RetryPolicy, address::REDFISH_ROOT,
};

/// How the driver trusts the BMC's certificate (HTTPS addresses only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM bundle of the CA (or CAs) that sign the BMC's certificate; the
    /// system roots are used without it.
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate. Never the default: only for BMCs with
    /// self-signed certificates on a network that is trusted anyway.
    pub insecure: bool,
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One ComputerSystem of one Redfish service.
#[derive(Clone)]
pub struct RedfishBmc {
    inner: Arc<Inner>,
}

struct Inner {
    /// `host:port`, for messages.
    bmc: String,
    /// `http(s)://host:port`.
    origin: String,
    /// The system's path from the address, if it had one.
    system_path: Option<String>,
    creds: Credentials,
    policy: RetryPolicy,
    client: HttpClient,
    /// The system's path once discovered.
    system: tokio::sync::OnceCell<String>,
    auth: tokio::sync::Mutex<AuthState>,
}

/// What is known about how to authenticate.
#[derive(Default)]
struct AuthState {
    /// `None` until the service root has been read; then the sessions
    /// collection's path, or `Some(None)` for basic authentication.
    sessions: Option<Option<String>>,
    session: Option<Session>,
}

/// A SessionService session (DSP0266 §13.3.4).
struct Session {
    token: String,
    /// Where to DELETE it.
    location: Option<String>,
}

impl fmt::Debug for RedfishBmc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedfishBmc")
            .field("origin", &self.inner.origin)
            .field("system", &self.inner.system_path)
            .field("creds", &self.inner.creds)
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

/// Endpoints already warned about for `insecure: true`.
static WARNED_INSECURE: Mutex<Option<HashSet<String>>> = Mutex::new(None);

impl RedfishBmc {
    /// A driver for `address`; fails for addresses of other drivers and for
    /// TLS settings that cannot work (an unreadable or empty CA bundle).
    pub fn new(
        address: &BmcAddress,
        creds: Credentials,
        tls: &TlsOptions,
        policy: RetryPolicy,
    ) -> Result<RedfishBmc, BmcError> {
        let BmcAddress::Redfish(addr) = address else {
            return Err(BmcError::UnsupportedDriver {
                address: address.to_string(),
                driver: "Redfish",
            });
        };
        let bmc = addr.endpoint();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(policy.attempt_timeout));
        http.set_nodelay(true);
        let connector = connector(&bmc, addr.https, tls, http)?;
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(RedfishBmc {
            inner: Arc::new(Inner {
                bmc,
                origin: addr.origin(),
                system_path: addr.system.clone(),
                creds,
                policy,
                client,
                system: tokio::sync::OnceCell::new(),
                auth: tokio::sync::Mutex::new(AuthState::default()),
            }),
        })
    }

    /// `host:port` of the BMC.
    pub fn endpoint(&self) -> &str {
        &self.inner.bmc
    }

    /// Runs `op` within the call's deadline.
    async fn call<T>(
        &self,
        op: impl AsyncFnOnce(&Inner, Instant) -> Result<T, BmcError>,
    ) -> Result<T, BmcError> {
        let deadline = self.inner.policy.deadline;
        let end = Instant::now() + deadline;
        match tokio::time::timeout_at(end, op(&self.inner, end)).await {
            Ok(result) => result,
            Err(_) => Err(BmcError::Timeout {
                bmc: self.inner.bmc.clone(),
                deadline,
            }),
        }
    }
}

/// The TLS side of the connector: rustls with ring, trusting `tls`.
fn connector(
    bmc: &str,
    https: bool,
    tls: &TlsOptions,
    http: HttpConnector,
) -> Result<HttpsConnector<HttpConnector>, BmcError> {
    let trust = if !https {
        // Never used for TLS; nothing to read.
        None
    } else if tls.insecure {
        let mut warned = lock(&WARNED_INSECURE);
        if warned.get_or_insert_default().insert(bmc.to_owned()) {
            warn!(
                bmc,
                "bmc.insecure is set: the BMC's TLS certificate is not verified"
            );
        }
        Some(Trust::Insecure)
    } else {
        Some(tls.ca_file.clone().map_or(Trust::System, Trust::CaFile))
    };
    let config = match trust {
        None => rustls::ClientConfig::builder_with_provider(trust::provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        Some(trust) => trust::client_config(&trust).map_err(|e| BmcError::TlsConfig {
            bmc: bmc.to_owned(),
            reason: match e {
                TrustError::NoSystemRoots => "no bmc.ca_file and no system CA certificates: set \
                                              bmc.ca_file to the CA that signed the BMC's \
                                              certificate, or bmc.insecure: true"
                    .to_owned(),
                e => e.to_string(),
            },
        })?,
    };
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

/// Whether a request may be sent again after its answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replay {
    /// GET, PATCH of absolute values, idempotent resets: retried on
    /// transport errors and 5xx.
    Safe,
    /// A reset that must not happen twice: retried only when it was
    /// certainly not sent (the connection failed).
    Once,
}

/// How to authenticate one request.
enum Auth {
    None,
    Basic,
    Token(String),
}

/// An HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    etag: Option<String>,
    location: Option<String>,
    token: Option<String>,
    body: Value,
}

/// Why one attempt failed below HTTP.
#[derive(Debug)]
struct Transport {
    error: BmcError,
    /// The request may have reached the BMC.
    sent: bool,
    /// Retrying cannot help (TLS verification).
    permanent: bool,
}

/// What a failed call reports when the answer to a [`Replay::Once`]
/// request was lost.
#[derive(Debug)]
enum Failure {
    Error(BmcError),
    Lost(Duration),
}

impl From<BmcError> for Failure {
    fn from(e: BmcError) -> Self {
        Failure::Error(e)
    }
}

impl Inner {
    fn malformed(&self, path: &str, problem: impl Into<String>) -> BmcError {
        BmcError::Malformed {
            bmc: self.bmc.clone(),
            path: path.to_owned(),
            problem: problem.into(),
        }
    }

    /// One HTTP exchange, no retries.
    async fn once(
        &self,
        method: &Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
        auth: &Auth,
    ) -> Result<Answer, Transport> {
        let uri = format!("{}{path}", self.origin);
        let mut req = Request::builder()
            .method(method.clone())
            .uri(&uri)
            .header(header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        match auth {
            Auth::None => {}
            Auth::Basic => {
                let pair = [
                    self.creds.user().as_bytes(),
                    b":",
                    self.creds.password().expose(),
                ]
                .concat();
                let mut value = HeaderValue::from_str(&format!("Basic {}", base64(&pair)))
                    .map_err(|_| Transport {
                        error: self.malformed(path, "user name not valid in an HTTP header"),
                        sent: false,
                        permanent: true,
                    })?;
                value.set_sensitive(true);
                req = req.header(header::AUTHORIZATION, value);
            }
            Auth::Token(token) => {
                let mut value = HeaderValue::from_str(token).map_err(|_| Transport {
                    error: self.malformed(path, "session token not valid in an HTTP header"),
                    sent: false,
                    permanent: true,
                })?;
                value.set_sensitive(true);
                req = req.header("X-Auth-Token", value);
            }
        }
        if let Some(etag) = if_match
            && let Ok(v) = HeaderValue::from_str(etag)
        {
            req = req.header(header::IF_MATCH, v);
        }
        let payload = match body {
            Some(b) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(b.to_string())
            }
            None => Bytes::new(),
        };
        let req = req.body(Full::new(payload)).map_err(|e| Transport {
            error: self.malformed(path, format!("cannot build the request: {e}")),
            sent: false,
            permanent: true,
        })?;
        let started = Instant::now();
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| self.transport(&e, started.elapsed()))?;
        let status = resp.status().as_u16();
        let text = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let etag = text("etag");
        let location = text("location");
        let token = text("x-auth-token");
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| Transport {
                error: BmcError::Connect {
                    bmc: self.bmc.clone(),
                    reason: format!("answer cut short: {e}"),
                },
                sent: true,
                permanent: false,
            })?
            .to_bytes();
        let body = if bytes.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            // A non-JSON error page is still an HTTP error; a non-JSON
            // success is reported by whoever reads the field it lacks.
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        Ok(Answer {
            status,
            etag,
            location,
            token,
            body,
        })
    }

    /// A hyper error as this BMC's error.
    fn transport(&self, e: &hyper_util::client::legacy::Error, waited: Duration) -> Transport {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        let mut innermost = e.to_string();
        while let Some(err) = source {
            if let Some(tls) = tls_error(err) {
                return Transport {
                    error: BmcError::TlsRejected {
                        bmc: self.bmc.clone(),
                        reason: tls.to_string(),
                    },
                    sent: false,
                    permanent: true,
                };
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::TimedOut
            {
                return Transport {
                    error: BmcError::Unreachable {
                        bmc: self.bmc.clone(),
                        waited,
                    },
                    sent: !e.is_connect(),
                    permanent: false,
                };
            }
            innermost = err.to_string();
            source = err.source();
        }
        if e.is_connect() && innermost.contains("timed out") {
            return Transport {
                error: BmcError::Unreachable {
                    bmc: self.bmc.clone(),
                    waited,
                },
                sent: false,
                permanent: false,
            };
        }
        Transport {
            error: BmcError::Connect {
                bmc: self.bmc.clone(),
                reason: innermost,
            },
            sent: !e.is_connect(),
            permanent: false,
        }
    }

    /// The request with authentication and retries, as `policy` allows.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
        replay: Replay,
        end: Instant,
    ) -> Result<Answer, Failure> {
        let started = Instant::now();
        let mut backoff = self.policy.initial_backoff;
        let mut attempt = 0;
        let mut renewed = false;
        loop {
            attempt += 1;
            let auth = self.auth(end).await?;
            let result =
                match tokio::time::timeout_at(end, self.once(&method, path, body, if_match, &auth))
                    .await
                {
                    Ok(result) => result,
                    Err(_) => Err(Transport {
                        error: BmcError::Unreachable {
                            bmc: self.bmc.clone(),
                            waited: started.elapsed(),
                        },
                        sent: true,
                        permanent: true,
                    }),
                };
            let more = attempt < self.policy.max_attempts && Instant::now() + backoff < end;
            match result {
                Ok(answer)
                    if answer.status == 401 && matches!(auth, Auth::Token(_)) && !renewed =>
                {
                    // The session expired or was deleted: one new session.
                    renewed = true;
                    self.auth.lock().await.session = None;
                    continue;
                }
                Ok(answer) if answer.status >= 500 && replay == Replay::Safe && more => {
                    debug!(bmc = %self.bmc, %method, path, status = answer.status, "retrying");
                }
                Ok(answer) => return Ok(answer),
                Err(t) if t.sent && replay == Replay::Once => {
                    return Err(Failure::Lost(started.elapsed()));
                }
                Err(t) if t.permanent || !more => return Err(t.error.into()),
                Err(t) => debug!(bmc = %self.bmc, %method, path, error = %t.error, "retrying"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.policy.max_backoff);
        }
    }

    /// [`Inner::send`], then an error for any status but 2xx.
    async fn checked(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
        replay: Replay,
        end: Instant,
    ) -> Result<Answer, Failure> {
        let name = method_name(&method);
        let answer = self.send(method, path, body, if_match, replay, end).await?;
        self.status_ok(name, path, answer).map_err(Failure::Error)
    }

    fn status_ok(
        &self,
        method: &'static str,
        path: &str,
        answer: Answer,
    ) -> Result<Answer, BmcError> {
        match answer.status {
            200..=299 => Ok(answer),
            401 => Err(BmcError::AuthFailed {
                bmc: self.bmc.clone(),
                user: self.creds.user().to_owned(),
            }),
            403 => Err(BmcError::InsufficientPrivilege {
                bmc: self.bmc.clone(),
                user: self.creds.user().to_owned(),
            }),
            status => Err(BmcError::Http {
                bmc: self.bmc.clone(),
                method,
                path: path.to_owned(),
                status,
                message: error_message(&answer.body),
            }),
        }
    }

    async fn get(&self, path: &str, end: Instant) -> Result<Answer, BmcError> {
        self.checked(Method::GET, path, None, None, Replay::Safe, end)
            .await
            .map_err(|f| self.settle(f, None))
    }

    /// A [`Failure`] as an error; `action` names a lost reset.
    fn settle(&self, f: Failure, action: Option<PowerAction>) -> BmcError {
        match (f, action) {
            (Failure::Error(e), _) => e,
            (Failure::Lost(waited), Some(action)) => BmcError::OutcomeUnknown {
                bmc: self.bmc.clone(),
                action,
                waited,
            },
            (Failure::Lost(waited), None) => BmcError::Unreachable {
                bmc: self.bmc.clone(),
                waited,
            },
        }
    }

    /// How to authenticate the next request: reads the service root once,
    /// then opens a session when it lists a sessions collection.
    async fn auth(&self, end: Instant) -> Result<Auth, BmcError> {
        let mut state = self.auth.lock().await;
        if state.sessions.is_none() {
            let root = format!("{REDFISH_ROOT}/");
            // The service root is readable without credentials (DSP0266
            // §13.3.1); some services want them anyway.
            let mut answer = self.once_safe(&root, &Auth::None, end).await?;
            if answer.status == 401 {
                answer = self.once_safe(&root, &Auth::Basic, end).await?;
            }
            let answer = self.status_ok("GET", &root, answer)?;
            let sessions = answer
                .body
                .pointer("/Links/Sessions/@odata.id")
                .and_then(Value::as_str)
                .map(str::to_owned);
            debug!(bmc = %self.bmc, sessions = sessions.is_some(), "read the service root");
            state.sessions = Some(sessions);
        }
        let Some(Some(sessions)) = state.sessions.clone() else {
            return Ok(Auth::Basic);
        };
        if let Some(s) = &state.session {
            return Ok(Auth::Token(s.token.clone()));
        }
        let body = json!({
            "UserName": self.creds.user(),
            "Password": String::from_utf8_lossy(self.creds.password().expose()),
        });
        let answer = match tokio::time::timeout_at(
            end,
            self.once(&Method::POST, &sessions, Some(&body), None, &Auth::None),
        )
        .await
        {
            Ok(Ok(answer)) => answer,
            Ok(Err(t)) => return Err(t.error),
            Err(_) => {
                return Err(BmcError::Timeout {
                    bmc: self.bmc.clone(),
                    deadline: self.policy.deadline,
                });
            }
        };
        let answer = match answer.status {
            // Some services answer a bad password with 400.
            400 | 401 => {
                return Err(BmcError::AuthFailed {
                    bmc: self.bmc.clone(),
                    user: self.creds.user().to_owned(),
                });
            }
            _ => self.status_ok("POST", &sessions, answer)?,
        };
        let token = answer
            .token
            .ok_or_else(|| self.malformed(&sessions, "session created without X-Auth-Token"))?;
        let location = answer.location.map(|l| match l.find(REDFISH_ROOT) {
            Some(i) => l[i..].to_owned(),
            None => l,
        });
        state.session = Some(Session {
            token: token.clone(),
            location,
        });
        Ok(Auth::Token(token))
    }

    /// A GET of `path` with retries on transport errors, before any
    /// authentication is known.
    async fn once_safe(&self, path: &str, auth: &Auth, end: Instant) -> Result<Answer, BmcError> {
        let started = Instant::now();
        let mut backoff = self.policy.initial_backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result =
                tokio::time::timeout_at(end, self.once(&Method::GET, path, None, None, auth))
                    .await
                    .unwrap_or_else(|_| {
                        Err(Transport {
                            error: BmcError::Unreachable {
                                bmc: self.bmc.clone(),
                                waited: started.elapsed(),
                            },
                            sent: true,
                            permanent: true,
                        })
                    });
            let more = attempt < self.policy.max_attempts && Instant::now() + backoff < end;
            match result {
                Ok(a) if a.status >= 500 && more => {}
                Ok(a) => return Ok(a),
                Err(t) if t.permanent || !more => return Err(t.error),
                Err(_) => {}
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.policy.max_backoff);
        }
    }

    /// The ComputerSystem's path: the address's, or the only member of
    /// the Systems collection.
    async fn system(&self, end: Instant) -> Result<String, BmcError> {
        if let Some(p) = &self.system_path {
            return Ok(p.clone());
        }
        self.system
            .get_or_try_init(|| async {
                let path = format!("{REDFISH_ROOT}/Systems");
                let answer = self.get(&path, end).await?;
                let members: Vec<String> = answer
                    .body
                    .get("Members")
                    .and_then(Value::as_array)
                    .ok_or_else(|| self.malformed(&path, "no Members"))?
                    .iter()
                    .filter_map(|m| m.get("@odata.id").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect();
                match members.as_slice() {
                    [one] => Ok(one.clone()),
                    [] => Err(BmcError::SystemNotFound {
                        bmc: self.bmc.clone(),
                        problem: format!("{path} lists no ComputerSystem"),
                    }),
                    many => Err(BmcError::SystemNotFound {
                        bmc: self.bmc.clone(),
                        problem: format!(
                            "{path} lists {} systems ({}): name one in the address, \
                             e.g. redfish://{}{}",
                            many.len(),
                            many.join(", "),
                            self.bmc,
                            many[0]
                        ),
                    }),
                }
            })
            .await
            .cloned()
    }

    async fn power_state(&self, path: &str, system: &Value) -> Result<PowerState, BmcError> {
        match system.get("PowerState").and_then(Value::as_str) {
            Some("On" | "PoweringOn" | "Paused") => Ok(PowerState::On),
            Some("Off" | "PoweringOff") => Ok(PowerState::Off),
            Some(other) => Err(self.malformed(path, format!("unknown PowerState {other:?}"))),
            None => Err(self.malformed(path, "no PowerState")),
        }
    }

    async fn power(&self, action: PowerAction, end: Instant) -> Result<(), BmcError> {
        let path = self.system(end).await?;
        let system = self.get(&path, end).await?.body;
        let reset = system
            .pointer("/Actions/#ComputerSystem.Reset")
            .ok_or_else(|| self.malformed(&path, "no #ComputerSystem.Reset action"))?;
        let target = reset
            .get("target")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed(&path, "#ComputerSystem.Reset has no target"))?
            .to_owned();
        let advertised: Option<Vec<String>> = reset
            .get("ResetType@Redfish.AllowableValues")
            .and_then(Value::as_array)
            .map(|v| {
                v.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            });
        let state = self.power_state(&path, &system).await?;
        let reset_type = reset_type(action, state, advertised.as_deref()).ok_or_else(|| {
            BmcError::NotAdvertised {
                bmc: self.bmc.clone(),
                what: "reset type for",
                wanted: format!("{action:?}"),
                advertised: advertised.clone().unwrap_or_default(),
            }
        })?;
        let replay = if matches!(
            reset_type,
            "On" | "ForceOn" | "ForceOff" | "GracefulShutdown"
        ) {
            Replay::Safe
        } else {
            Replay::Once
        };
        debug!(bmc = %self.bmc, ?action, reset_type, "resetting");
        self.checked(
            Method::POST,
            &target,
            Some(&json!({ "ResetType": reset_type })),
            None,
            replay,
            end,
        )
        .await
        .map_err(|f| self.settle(f, Some(action)))?;
        Ok(())
    }

    async fn set_boot_device(&self, wanted: BootTarget, end: Instant) -> Result<(), BmcError> {
        let path = self.system(end).await?;
        let target = match wanted.device {
            BootDevice::Pxe => "Pxe",
            BootDevice::Disk => "Hdd",
            BootDevice::BiosSetup => "BiosSetup",
            BootDevice::UefiHttp => "UefiHttp",
        };
        let enabled = if wanted.persistent {
            "Continuous"
        } else {
            "Once"
        };
        // HTTP boot is a UEFI feature whatever the host's boot mode says.
        let mode = if wanted.efi || wanted.device.needs_efi() {
            "UEFI"
        } else {
            "Legacy"
        };
        let mut refreshed = false;
        loop {
            let answer = self.get(&path, end).await?;
            let boot = answer
                .body
                .get("Boot")
                .ok_or_else(|| self.malformed(&path, "no Boot object"))?;
            if let Some(allowed) = boot
                .get("BootSourceOverrideTarget@Redfish.AllowableValues")
                .and_then(Value::as_array)
                && !allowed.iter().any(|v| v.as_str() == Some(target))
            {
                return Err(BmcError::NotAdvertised {
                    bmc: self.bmc.clone(),
                    what: "boot source override target",
                    wanted: target.to_owned(),
                    advertised: allowed
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect(),
                });
            }
            // A system without a mode property has no mode to set.
            let has_mode = boot.get("BootSourceOverrideMode").is_some();
            let mut patch = json!({
                "BootSourceOverrideTarget": target,
                "BootSourceOverrideEnabled": enabled,
            });
            if has_mode {
                patch["BootSourceOverrideMode"] = json!(mode);
            }
            let etag = answer.etag.clone().or_else(|| {
                answer
                    .body
                    .get("@odata.etag")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
            let sent = self
                .send(
                    Method::PATCH,
                    &path,
                    Some(&json!({ "Boot": patch })),
                    etag.as_deref(),
                    Replay::Safe,
                    end,
                )
                .await
                .map_err(|f| self.settle(f, None))?;
            if sent.status == 412 && !refreshed {
                // Changed between our GET and PATCH: read it again, once.
                refreshed = true;
                continue;
            }
            self.status_ok("PATCH", &path, sent)?;
            break;
        }
        let back = self.get(&path, end).await?.body;
        let boot = back.get("Boot").cloned().unwrap_or(Value::Null);
        let field = |name: &str| boot.get(name).and_then(Value::as_str).map(str::to_owned);
        let got_target = field("BootSourceOverrideTarget");
        let got_enabled = field("BootSourceOverrideEnabled");
        let got_mode = field("BootSourceOverrideMode");
        let target_ok = got_target.as_deref() == Some(target);
        let mode_ok = got_mode.as_deref().is_none_or(|m| m == mode);
        let enabled_ok = match got_enabled.as_deref() {
            Some(e) if e == enabled => true,
            Some("Continuous") if !wanted.persistent => {
                warn!(
                    bmc = %self.bmc,
                    "BootSourceOverrideEnabled Once reads back as Continuous: this BMC keeps \
                     the override for every boot"
                );
                true
            }
            _ => false,
        };
        if target_ok && mode_ok && enabled_ok {
            Ok(())
        } else {
            Err(BmcError::ReadBackMismatch {
                bmc: self.bmc.clone(),
                wanted,
                got: boot_flags(&boot),
            })
        }
    }

    async fn boot_device(&self, end: Instant) -> Result<BootFlags, BmcError> {
        let path = self.system(end).await?;
        let system = self.get(&path, end).await?.body;
        let boot = system
            .get("Boot")
            .ok_or_else(|| self.malformed(&path, "no Boot object"))?;
        Ok(boot_flags(boot))
    }

    async fn info(&self, end: Instant) -> Result<BmcInfo, BmcError> {
        let path = self.system(end).await?;
        let system = self.get(&path, end).await?.body;
        let manager = match system
            .pointer("/Links/ManagedBy/0/@odata.id")
            .and_then(Value::as_str)
        {
            Some(m) => self.get(m, end).await?.body,
            None => Value::Null,
        };
        let text = |name: &str| {
            manager
                .get(name)
                .or_else(|| system.get(name))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let firmware_version = manager
            .get("FirmwareVersion")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let (firmware_major, firmware_minor) = firmware_version
            .as_deref()
            .map(version_pair)
            .unwrap_or((0, 0));
        Ok(BmcInfo {
            device_id: 0,
            device_revision: 0,
            firmware_major,
            firmware_minor,
            ipmi_version: (0, 0),
            manufacturer_id: 0,
            product_id: 0,
            vendor: text("Manufacturer"),
            model: text("Model"),
            firmware_version,
        })
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Sessions are a scarce resource on most BMCs: give it back.
        let Some(session) = self.auth.get_mut().session.take() else {
            return;
        };
        let Some(location) = session.location else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(mut token) = HeaderValue::from_str(&session.token) else {
            return;
        };
        token.set_sensitive(true);
        let Ok(req) = Request::delete(format!("{}{location}", self.origin))
            .header("X-Auth-Token", token)
            .body(Full::new(Bytes::new()))
        else {
            return;
        };
        let client = self.client.clone();
        let timeout = self.policy.attempt_timeout;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(timeout, client.request(req)).await;
        });
    }
}

impl Bmc for RedfishBmc {
    async fn power_status(&self) -> Result<PowerState, BmcError> {
        self.call(async |inner: &Inner, end| {
            let path = inner.system(end).await?;
            let system = inner.get(&path, end).await?.body;
            inner.power_state(&path, &system).await
        })
        .await
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        self.call(async move |inner: &Inner, end| inner.power(action, end).await)
            .await
    }

    async fn set_boot_device(&self, target: BootTarget) -> Result<(), BmcError> {
        self.call(async move |inner: &Inner, end| inner.set_boot_device(target, end).await)
            .await
    }

    async fn boot_device(&self) -> Result<BootFlags, BmcError> {
        self.call(async |inner: &Inner, end| inner.boot_device(end).await)
            .await
    }

    async fn info(&self) -> Result<BmcInfo, BmcError> {
        self.call(async |inner: &Inner, end| inner.info(end).await)
            .await
    }
}

/// The ResetType for `action` on a system in `state`, from those it
/// advertises (all standard ones when it advertises none).
fn reset_type(
    action: PowerAction,
    state: PowerState,
    advertised: Option<&[String]>,
) -> Option<&'static str> {
    let candidates: &[&'static str] = match (action, state) {
        (PowerAction::On, _) | (PowerAction::Cycle, PowerState::Off) => &["On", "ForceOn"],
        (PowerAction::Off, _) => &["ForceOff"],
        (PowerAction::SoftOff, _) => &["GracefulShutdown"],
        (PowerAction::Cycle, PowerState::On) => &["PowerCycle", "ForceRestart"],
        (PowerAction::Reset, _) => &["ForceRestart"],
    };
    match advertised {
        None => candidates.first().copied(),
        Some(list) => candidates
            .iter()
            .copied()
            .find(|c| list.iter().any(|a| a == c)),
    }
}

/// The Boot object as IPMI-style boot flags: Redfish targets without an
/// IPMI selector (UefiHttp, UefiTarget, ...) read as selector 0xE, which
/// IPMI leaves reserved; UefiHttp reads as [`UEFI_HTTP_SELECTOR`].
pub fn boot_flags(boot: &Value) -> BootFlags {
    let field = |name: &str| boot.get(name).and_then(Value::as_str).unwrap_or("");
    let enabled = field("BootSourceOverrideEnabled");
    let selector = match field("BootSourceOverrideTarget") {
        "" | "None" => 0x0,
        "Pxe" => BootDevice::Pxe.selector(),
        "Hdd" => BootDevice::Disk.selector(),
        "BiosSetup" => BootDevice::BiosSetup.selector(),
        "Diags" => 0x4,
        "Cd" => 0x5,
        "Floppy" | "Usb" => 0xF,
        "RemoteDrive" => 0xB,
        "UefiHttp" => UEFI_HTTP_SELECTOR,
        _ => 0xE,
    };
    BootFlags {
        valid: selector != 0 && matches!(enabled, "Once" | "Continuous"),
        persistent: enabled == "Continuous",
        efi: field("BootSourceOverrideMode") == "UEFI",
        selector,
    }
}

/// The selector [`boot_flags`] reports for `UefiHttp`: reserved in IPMI,
/// so it never stands for another device.
pub const UEFI_HTTP_SELECTOR: u8 = 0xC;

/// The first message of a Redfish error object (DSP0266 §9.6).
fn error_message(body: &Value) -> Option<String> {
    let error = body.get("error")?;
    error
        .pointer("/@Message.ExtendedInfo/0/Message")
        .or_else(|| error.get("message"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// `major.minor` from the first two numbers of a version string.
fn version_pair(v: &str) -> (u8, u8) {
    let mut numbers = v
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u8>().unwrap_or(u8::MAX));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

fn method_name(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "request",
    }
}

/// The rustls error inside `err`: hyper-rustls wraps tokio-rustls's
/// io::Error, which wraps the rustls error, in another io::Error.
fn tls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut err: &(dyn std::error::Error + 'static) = err;
    for _ in 0..4 {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        err = err.downcast_ref::<std::io::Error>()?.get_ref()?;
    }
    None
}

/// Standard base64 (RFC 4648 §4), for the basic authentication header.
fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bmc::Password;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn reset_type_is_chosen_from_what_the_system_advertises() {
        let sushy: Vec<String> = [
            "On",
            "ForceOff",
            "GracefulShutdown",
            "GracefulRestart",
            "ForceRestart",
            "Nmi",
            "ForceOn",
        ]
        .map(String::from)
        .to_vec();
        let pick = |a, s| reset_type(a, s, Some(&sushy));
        assert_eq!(pick(PowerAction::On, PowerState::Off), Some("On"));
        assert_eq!(pick(PowerAction::Off, PowerState::On), Some("ForceOff"));
        assert_eq!(
            pick(PowerAction::SoftOff, PowerState::On),
            Some("GracefulShutdown")
        );
        assert_eq!(
            pick(PowerAction::Cycle, PowerState::On),
            Some("ForceRestart")
        );
        assert_eq!(pick(PowerAction::Cycle, PowerState::Off), Some("On"));
        assert_eq!(
            pick(PowerAction::Reset, PowerState::On),
            Some("ForceRestart")
        );
        let with_cycle = ["PowerCycle".to_owned(), "ForceRestart".to_owned()];
        assert_eq!(
            reset_type(PowerAction::Cycle, PowerState::On, Some(&with_cycle)),
            Some("PowerCycle")
        );
        let only_on = ["ForceOn".to_owned()];
        assert_eq!(
            reset_type(PowerAction::On, PowerState::Off, Some(&only_on)),
            Some("ForceOn")
        );
        assert_eq!(
            reset_type(PowerAction::Off, PowerState::On, Some(&only_on)),
            None
        );
        assert_eq!(
            reset_type(PowerAction::Off, PowerState::On, None),
            Some("ForceOff")
        );
    }

    #[test]
    fn boot_object_reads_as_boot_flags() {
        let flags = boot_flags(&json!({
            "BootSourceOverrideEnabled": "Once",
            "BootSourceOverrideTarget": "Pxe",
            "BootSourceOverrideMode": "UEFI",
        }));
        assert_eq!(
            flags,
            BootFlags {
                valid: true,
                persistent: false,
                efi: true,
                selector: BootDevice::Pxe.selector()
            }
        );
        let disabled = boot_flags(&json!({
            "BootSourceOverrideEnabled": "Disabled",
            "BootSourceOverrideTarget": "Hdd",
        }));
        assert!(!disabled.valid);
        let continuous = boot_flags(&json!({
            "BootSourceOverrideEnabled": "Continuous",
            "BootSourceOverrideTarget": "Hdd",
            "BootSourceOverrideMode": "Legacy",
        }));
        assert!(continuous.valid && continuous.persistent && !continuous.efi);
        assert_eq!(continuous.device(), Some(BootDevice::Disk));
    }

    #[test]
    fn redfish_error_message_comes_from_extended_info() {
        let body = json!({"error": {
            "code": "Base.1.8.GeneralError",
            "message": "A general error has occurred.",
            "@Message.ExtendedInfo": [{"Message": "The BMC is busy."}]
        }});
        assert_eq!(error_message(&body).as_deref(), Some("The BMC is busy."));
        let plain = json!({"error": {"message": "Authorization required"}});
        assert_eq!(
            error_message(&plain).as_deref(),
            Some("Authorization required")
        );
        assert_eq!(error_message(&Value::Null), None);
    }

    #[test]
    fn firmware_version_gives_major_and_minor() {
        assert_eq!(version_pair("4.40.10.00"), (4, 40));
        assert_eq!(version_pair("iLO 5 v2.72"), (5, 2));
        assert_eq!(version_pair(""), (0, 0));
    }

    #[test]
    fn ipmi_addresses_are_refused_by_the_redfish_driver() {
        let creds = Credentials::new("admin", Password::new("pw")).unwrap();
        let err = RedfishBmc::new(
            &"ipmi://10.0.0.1".parse().unwrap(),
            creds,
            &TlsOptions::default(),
            RetryPolicy::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("Redfish driver"), "{err}");
    }

    #[test]
    fn debug_of_the_driver_never_shows_the_password() {
        let creds = Credentials::new("admin", Password::new("hunter2-secret")).unwrap();
        let bmc = RedfishBmc::new(
            &"redfish+http://127.0.0.1:8000/redfish/v1/Systems/1"
                .parse()
                .unwrap(),
            creds,
            &TlsOptions::default(),
            RetryPolicy::default(),
        )
        .unwrap();
        assert!(!format!("{bmc:?}").contains("hunter2"));
    }

    #[test]
    fn an_empty_ca_file_is_refused_with_its_path() {
        let dir = std::env::temp_dir().join(format!("pxe-redfish-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("empty.pem");
        std::fs::write(&ca, "").unwrap();
        let err = RedfishBmc::new(
            &"redfish://127.0.0.1/redfish/v1/Systems/1".parse().unwrap(),
            Credentials::new("admin", Password::new("pw")).unwrap(),
            &TlsOptions {
                ca_file: Some(ca.clone()),
                insecure: false,
            },
            RetryPolicy::default(),
        )
        .unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(err, BmcError::TlsConfig { .. }), "{err}");
        assert!(err.to_string().contains("empty.pem"), "{err}");
    }
}
