//! The IPMI 2.0 driver: RMCP+ (lanplus) sessions through ipmi-rs, kept off
//! the async runtime.
//!
//! Owns one session per BMC, each call's deadline, retries with exponential
//! back-off, re-establishing a session the BMC dropped, the boot-device
//! read-back, and containment of ipmi-rs panics. ipmi-rs 0.6.0 is blocking
//! (a `std` UDP socket with a read timeout) and panics on some answers
//! (`todo!()` for algorithms other than cipher suite 3, unchecked slicing of
//! short ASF pongs, an `unwrap` on RAKP 4): every call runs on tokio's
//! blocking pool inside `catch_unwind`, and a panic becomes
//! [`ProtocolError::LibraryPanic`] for that BMC only.
//!
//! It has no retransmission of its own and no Close Session, so a request
//! is retried here on a fresh session (new socket, so a late answer to the
//! old request cannot be taken for the new one's). Power actions that are
//! not idempotent (cycle, reset, soft off) are sent at most once per call,
//! after a status read proved the session alive.

use std::{
    net::ToSocketAddrs as _,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use ipmi_rs::{
    Ipmi, IpmiError,
    app::GetDeviceId,
    connection::{CompletionErrorCode, IpmiCommand},
    rmcp::{
        ActivationError, RakpMessage4ErrorStatusCode, RakpMessage4ParseError, Rmcp, RmcpIpmiError,
        RmcpIpmiReceiveError, V2_0ActivationError,
    },
};

use crate::sync::lock;

use super::{
    Bmc, BmcAddress, BmcError, BmcInfo, BootFlags, BootTarget, CommandName, Credentials,
    HandshakeStep, PowerAction, PowerState, ProtocolError,
    command::{
        ADMINISTRATOR, BootParameter, ChassisControl, DecodeError, GetBootFlags, GetChassisStatus,
        KEEP_VALID_PAST_TIMEOUT, SetSessionPrivilege, SetSystemBootOptions, bmc_info,
    },
    rakp,
};

/// How long one call may take and how it retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The whole call, session setup and retries included.
    pub deadline: Duration,
    /// How long to wait for each answer (the socket read timeout).
    pub attempt_timeout: Duration,
    /// Pause before the first retry; doubled each time up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Attempts per call, the first included.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            deadline: Duration::from_secs(15),
            attempt_timeout: Duration::from_secs(2),
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(2),
            max_attempts: 5,
        }
    }
}

/// What the BMC echoes in Get System Boot Options, which decides what the
/// read-back after a set compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BootFlagEcho {
    /// Device, valid, persistent and EFI bits must all read back as set.
    #[default]
    Full,
    /// Only the device selector is compared: for BMCs that keep nothing else
    /// (OpenIPMI's ipmi_sim answers byte 1 = 0).
    DeviceOnly,
}

/// Extra time the async side waits past the deadline for the blocking
/// worker's own, more specific, error.
const DEADLINE_GRACE: Duration = Duration::from_millis(500);
/// Shortest socket read timeout given to ipmi-rs.
const MIN_READ_TIMEOUT: Duration = Duration::from_millis(50);

/// One BMC spoken to over IPMI 2.0 / RMCP+ with cipher suite 3.
#[derive(Debug, Clone)]
pub struct IpmiBmc {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: String,
    creds: Credentials,
    policy: RetryPolicy,
    echo: BootFlagEcho,
    session: Mutex<Option<Ipmi<Rmcp>>>,
    handshakes: AtomicU64,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("endpoint", &self.endpoint)
            .field("creds", &self.creds)
            .field("policy", &self.policy)
            .field("echo", &self.echo)
            .field("handshakes", &self.handshakes)
            .finish_non_exhaustive()
    }
}

/// How a failed attempt may continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Permanent: return the error now.
    No,
    /// The session is fine; ask again.
    SameSession,
    /// Drop the session and set up a new one.
    NewSession,
}

#[derive(Debug)]
struct Failure {
    error: BmcError,
    retry: Retry,
    /// The request may have reached the BMC (the answer is what was lost).
    sent: bool,
}

impl IpmiBmc {
    /// A driver for `address`; fails for addresses of other drivers.
    pub fn new(
        address: &BmcAddress,
        creds: Credentials,
        policy: RetryPolicy,
    ) -> Result<IpmiBmc, BmcError> {
        let endpoint = match address {
            BmcAddress::Ipmi { .. } => address.endpoint(),
            BmcAddress::Redfish(_) => {
                return Err(BmcError::UnsupportedDriver {
                    address: address.to_string(),
                    driver: "IPMI",
                });
            }
        };
        creds.check_ipmi().map_err(|source| BmcError::Credentials {
            bmc: endpoint.clone(),
            source,
        })?;
        Ok(IpmiBmc {
            inner: Arc::new(Inner {
                endpoint,
                creds,
                policy,
                echo: BootFlagEcho::default(),
                session: Mutex::new(None),
                handshakes: AtomicU64::new(0),
            }),
        })
    }

    /// Sets what the read-back after a boot-device set compares.
    pub fn with_boot_flag_echo(self, echo: BootFlagEcho) -> IpmiBmc {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            endpoint: shared.endpoint.clone(),
            creds: shared.creds.clone(),
            policy: shared.policy,
            echo,
            session: Mutex::new(None),
            handshakes: AtomicU64::new(shared.handshakes.load(Ordering::Relaxed)),
        });
        IpmiBmc {
            inner: Arc::new(Inner { echo, ..inner }),
        }
    }

    /// `host:port` of the BMC.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// RMCP+ sessions set up (or attempted) so far: one per call on a
    /// healthy BMC, more after the BMC dropped a session, never more than
    /// one per call for refused credentials.
    pub fn handshakes(&self) -> u64 {
        self.inner.handshakes.load(Ordering::Relaxed)
    }

    /// Runs `op` on the blocking pool with the call's deadline; a panic in
    /// it is this BMC's error.
    async fn call<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Inner, Instant) -> Result<T, BmcError> + Send + 'static,
    ) -> Result<T, BmcError> {
        let inner = Arc::clone(&self.inner);
        let deadline = inner.policy.deadline;
        let worker = tokio::task::spawn_blocking(move || {
            let end = Instant::now() + deadline;
            catch_unwind(AssertUnwindSafe(|| op(&inner, end))).unwrap_or_else(|_| {
                // The session may be mid-exchange: never reuse it.
                *lock(&inner.session) = None;
                Err(inner.protocol(ProtocolError::LibraryPanic))
            })
        });
        match tokio::time::timeout(deadline + DEADLINE_GRACE, worker).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(BmcError::WorkerLost {
                bmc: self.inner.endpoint.clone(),
            }),
            Err(_) => Err(BmcError::Timeout {
                bmc: self.inner.endpoint.clone(),
                deadline,
            }),
        }
    }
}

impl Bmc for IpmiBmc {
    async fn power_status(&self) -> Result<PowerState, BmcError> {
        self.call(|inner, end| {
            inner
                .with_session(end, |ipmi| {
                    inner.send(ipmi, GetChassisStatus, CommandName::GetChassisStatus)
                })
                .map(|s| s.power())
        })
        .await
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        self.call(move |inner, end| inner.power(action, end)).await
    }

    async fn set_boot_device(&self, target: BootTarget) -> Result<(), BmcError> {
        self.call(move |inner, end| inner.set_boot_device(target, end))
            .await
    }

    async fn boot_device(&self) -> Result<BootFlags, BmcError> {
        self.call(|inner, end| {
            inner.with_session(end, |ipmi| {
                inner.send(ipmi, GetBootFlags, CommandName::GetSystemBootOptions)
            })
        })
        .await
    }

    async fn info(&self) -> Result<BmcInfo, BmcError> {
        self.call(|inner, end| {
            inner.with_session(end, |ipmi| {
                inner
                    .send_with(ipmi, GetDeviceId, CommandName::GetDeviceId, |_| {
                        DecodeError {
                            cmd: CommandName::GetDeviceId,
                        }
                    })
                    .map(|id| bmc_info(&id))
            })
        })
        .await
    }
}

impl Inner {
    fn protocol(&self, source: ProtocolError) -> BmcError {
        BmcError::Protocol {
            bmc: self.endpoint.clone(),
            source,
        }
    }

    fn timeout(&self) -> BmcError {
        BmcError::Timeout {
            bmc: self.endpoint.clone(),
            deadline: self.policy.deadline,
        }
    }

    fn power(&self, action: PowerAction, end: Instant) -> Result<(), BmcError> {
        let control = |ipmi: &mut Ipmi<Rmcp>| {
            self.send(ipmi, ChassisControl(action), CommandName::ChassisControl)
        };
        if action.is_idempotent() {
            return self.with_session(end, control);
        }
        // Prove the session alive with a read that is safe to repeat, then
        // send the action once: a lost answer must not cycle the host twice.
        self.with_session(end, |ipmi| {
            self.send(ipmi, GetChassisStatus, CommandName::GetChassisStatus)
        })?;
        let mut guard = lock(&self.session);
        let Some(ipmi) = guard.as_mut() else {
            return Err(self.timeout());
        };
        let started = Instant::now();
        control(ipmi).map_err(|failure| {
            if failure.retry != Retry::SameSession {
                *guard = None;
            }
            if failure.sent && failure.retry != Retry::No {
                BmcError::OutcomeUnknown {
                    bmc: self.endpoint.clone(),
                    action,
                    waited: started.elapsed(),
                }
            } else {
                failure.error
            }
        })
    }

    fn set_boot_device(&self, target: BootTarget, end: Instant) -> Result<(), BmcError> {
        let wanted = BootFlags::from(target);
        let set = |ipmi: &mut Ipmi<Rmcp>, param| {
            self.send(
                ipmi,
                SetSystemBootOptions(param),
                CommandName::SetSystemBootOptions,
            )
        };
        // Optional parameters (§28.12): "parameter not supported" (80h) or
        // "invalid data field" (CCh) from a BMC that lacks one is not a
        // failure of the boot-device set; the read-back decides.
        let optional = |ipmi: &mut Ipmi<Rmcp>, param| match set(ipmi, param) {
            Err(Failure {
                error:
                    BmcError::CompletionCode {
                        code: 0x80 | 0xcc, ..
                    },
                ..
            }) => {
                tracing::debug!(bmc = %self.endpoint, ?param, "optional boot parameter not supported");
                Ok(())
            }
            other => other,
        };
        let got = self.with_session(end, |ipmi| {
            optional(ipmi, BootParameter::SetInProgress(true))?;
            // Keep the valid bit past the 60-second timeout so a slow
            // recovery controller's power action still boots the target.
            optional(
                ipmi,
                BootParameter::ValidBitClearing(KEEP_VALID_PAST_TIMEOUT),
            )?;
            set(ipmi, BootParameter::BootFlags(wanted))?;
            // The BIOS/POST bit set to 1: not yet handled by the firmware.
            optional(
                ipmi,
                BootParameter::InfoAcknowledge {
                    mask: 0x01,
                    data: 0x01,
                },
            )?;
            optional(ipmi, BootParameter::SetInProgress(false))?;
            self.send(ipmi, GetBootFlags, CommandName::GetSystemBootOptions)
        })?;
        let agrees = match self.echo {
            BootFlagEcho::Full => got == wanted,
            BootFlagEcho::DeviceOnly => got.selector == wanted.selector,
        };
        if agrees {
            Ok(())
        } else {
            Err(BmcError::ReadBackMismatch {
                bmc: self.endpoint.clone(),
                wanted: target,
                got,
            })
        }
    }

    /// Runs `f` on the session (set up first when there is none) until it
    /// succeeds, fails permanently, runs out of attempts or of time.
    fn with_session<T>(
        &self,
        end: Instant,
        mut f: impl FnMut(&mut Ipmi<Rmcp>) -> Result<T, Failure>,
    ) -> Result<T, BmcError> {
        let policy = &self.policy;
        let mut guard = lock(&self.session);
        let mut backoff = policy.initial_backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let remaining = end.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.timeout());
            }
            let result = match guard.as_mut() {
                Some(ipmi) => f(ipmi),
                None => self
                    .activate(remaining)
                    .and_then(|ipmi| f(guard.insert(ipmi))),
            };
            let failure = match result {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            if failure.retry == Retry::NewSession {
                *guard = None;
            }
            tracing::debug!(bmc = %self.endpoint, attempt, error = %failure.error, "IPMI attempt failed");
            if failure.retry == Retry::No || attempt >= policy.max_attempts {
                return Err(failure.error);
            }
            if Instant::now() + backoff >= end {
                return Err(match failure.error {
                    e @ BmcError::Unreachable { .. } => e,
                    _ => self.timeout(),
                });
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(policy.max_backoff);
        }
    }

    fn activate(&self, remaining: Duration) -> Result<Ipmi<Rmcp>, Failure> {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
        let read_timeout = self
            .policy
            .attempt_timeout
            .min(remaining)
            .max(MIN_READ_TIMEOUT);
        let unreachable = |retry| Failure {
            error: BmcError::Unreachable {
                bmc: self.endpoint.clone(),
                waited: read_timeout,
            },
            retry,
            sent: false,
        };
        let mut rmcp = Rmcp::new(self.endpoint.as_str(), read_timeout)
            .map_err(|_| unreachable(Retry::NewSession))?;
        let password = self.creds.password().expose();
        match rmcp.activate(true, Some(self.creds.user()), Some(password)) {
            Ok(()) => {}
            Err(e) => return Err(self.classify_activation(e, read_timeout)),
        }
        // A new session runs at User privilege (IPMI 2.0 §22.18); chassis
        // control and boot options need more, and ipmi-rs does not raise it.
        let mut ipmi = Ipmi::new(rmcp);
        match self.send(
            &mut ipmi,
            SetSessionPrivilege(ADMINISTRATOR),
            CommandName::SetSessionPrivilege,
        ) {
            Ok(_) => Ok(ipmi),
            // 80h: level not available to this user; 81h: above the user's
            // or channel's limit.
            Err(Failure {
                error:
                    BmcError::CompletionCode {
                        code: 0x80 | 0x81 | 0xd4,
                        ..
                    },
                ..
            }) => Err(Failure {
                error: self.insufficient_privilege(),
                retry: Retry::No,
                sent: false,
            }),
            Err(failure) => Err(failure),
        }
    }

    fn classify_activation(&self, e: ActivationError, read_timeout: Duration) -> Failure {
        use V2_0ActivationError as V2;
        let failure = |error, retry| Failure {
            error,
            retry,
            sent: false,
        };
        let handshake = |step| {
            failure(
                self.protocol(ProtocolError::Handshake(step)),
                Retry::NewSession,
            )
        };
        let unreachable = || {
            failure(
                BmcError::Unreachable {
                    bmc: self.endpoint.clone(),
                    waited: read_timeout,
                },
                Retry::NewSession,
            )
        };
        let receive = |r: &RmcpIpmiReceiveError, step| match r {
            RmcpIpmiReceiveError::Io(_) => failure(self.timeout(), Retry::NewSession),
            _ => handshake(step),
        };
        match &e {
            ActivationError::BindSocket(_)
            | ActivationError::PingSend(_)
            | ActivationError::PongReceive(_) => unreachable(),
            ActivationError::PongRead
            | ActivationError::IpmiNotSupported
            | ActivationError::RmcpError(_) => handshake(HandshakeStep::Ping),
            ActivationError::NoSupportedIpmiLANVersions | ActivationError::V1_5(_) => {
                handshake(HandshakeStep::AuthCapabilities)
            }
            ActivationError::GetChannelAuthenticationCapabilities(IpmiError::Connection(
                RmcpIpmiError::Receive(RmcpIpmiReceiveError::Io(_)),
            )) => failure(self.timeout(), Retry::NewSession),
            ActivationError::GetChannelAuthenticationCapabilities(_) => {
                handshake(HandshakeStep::AuthCapabilities)
            }
            ActivationError::V2_0(v2) => match v2 {
                V2::Io(_) | V2::OpenSessionRequestSend(_) => unreachable(),
                V2::OpenSessionResponseReceive(r) => receive(r, HandshakeStep::OpenSession),
                V2::RakpMessage2Receive(r) => receive(r, HandshakeStep::Rakp2),
                V2::RakpMessage4Receive(r) => receive(r, HandshakeStep::Rakp4),
                // ipmi-rs hides the Open Session status and misreads RAKP 2's:
                // replay the two steps to read the BMC's status byte.
                V2::OpenSessionResponseParse(_) => {
                    self.diagnose(HandshakeStep::OpenSession, read_timeout)
                }
                V2::RakpMessage2Parse(_) => self.diagnose(HandshakeStep::Rakp2, read_timeout),
                // The BMC's RAKP 2 auth code did not match: a wrong
                // password, a user below Administrator refused in the status
                // byte ipmi-rs skips, or a BMC that keyed the code with the
                // user's lower privilege. The replay tells which.
                V2::ServerAuthenticationFailed => self.diagnose_auth(read_timeout),
                // The BMC found our RAKP 3 auth code wrong: same cause.
                V2::RakpMessage4Parse(RakpMessage4ParseError::ErrorStatusCode(
                    RakpMessage4ErrorStatusCode::InvalidIntegrityCheckValue,
                )) => failure(self.auth_failed(), Retry::No),
                V2::RakpMessage4Parse(RakpMessage4ParseError::UnknownErrorStatusCode(code)) => {
                    self.rmcp_status(HandshakeStep::Rakp4, *code)
                }
                V2::InvalidKeyExchangeAuthCodeLen(..)
                | V2::OpenSessionResponseRead(_)
                | V2::OpenSessionResponseValidate(_) => handshake(HandshakeStep::OpenSession),
                V2::SendRakpMessage1(_)
                | V2::RakpMessage2Read(_)
                | V2::RakpMessage2Validate(_)
                | V2::RakpMessage3Send(_) => handshake(HandshakeStep::Rakp2),
                V2::RakpMessage4Read(_)
                | V2::RakpMessage4Parse(_)
                | V2::RakpMessage4Validate(_)
                | V2::RakpMessage4InvalidIntegrityCheckValue => handshake(HandshakeStep::Rakp4),
            },
        }
    }

    /// Replays the handshake's first steps (`bmc/rakp.rs`) to attribute a
    /// failure ipmi-rs cannot: `None` when the replay tells nothing.
    fn replay(&self, read_timeout: Duration) -> Option<Failure> {
        let addr = self
            .endpoint
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())?;
        let probe = |privilege| {
            let password = self.creds.password().expose();
            rakp::probe(addr, self.creds.user(), password, privilege, read_timeout)
        };
        match rakp::attribute(probe(rakp::ADMIN), || probe(rakp::NAME_ONLY_USER)) {
            rakp::Finding::OpenSession(code) => {
                Some(self.rmcp_status(HandshakeStep::OpenSession, code))
            }
            rakp::Finding::Rakp2(code) => Some(self.rmcp_status(HandshakeStep::Rakp2, code)),
            rakp::Finding::BelowAdministrator => Some(Failure {
                error: self.insufficient_privilege(),
                retry: Retry::No,
                sent: false,
            }),
            rakp::Finding::Inconclusive => None,
        }
    }

    /// ipmi-rs could not parse the answer at `step`.
    fn diagnose(&self, step: HandshakeStep, read_timeout: Duration) -> Failure {
        self.replay(read_timeout).unwrap_or_else(|| Failure {
            error: self.protocol(ProtocolError::Handshake(step)),
            retry: Retry::NewSession,
            sent: false,
        })
    }

    /// The BMC's RAKP 2 auth code did not verify in ipmi-rs. ipmi_sim, for
    /// one, refuses a user below Administrator with status 0Dh in the byte
    /// ipmi-rs does not read, and an auth code over no user at all.
    fn diagnose_auth(&self, read_timeout: Duration) -> Failure {
        self.replay(read_timeout).unwrap_or_else(|| Failure {
            error: self.auth_failed(),
            retry: Retry::No,
            sent: false,
        })
    }

    /// Maps an RMCP+ status code (IPMI 2.0 Table 13-15).
    fn rmcp_status(&self, step: HandshakeStep, code: u8) -> Failure {
        let (error, retry) = match code {
            // Invalid or unmatched authentication / integrity /
            // confidentiality algorithm, no cipher suite match.
            0x04..=0x07 | 0x10 | 0x11 => (
                BmcError::NoCipherSuite {
                    bmc: self.endpoint.clone(),
                },
                Retry::No,
            ),
            // Invalid role; unauthorized role or privilege level.
            0x09 | 0x0a => (self.insufficient_privilege(), Retry::No),
            // Invalid name length, unauthorized name, invalid integrity check value.
            0x0c | 0x0d | 0x0f => (self.auth_failed(), Retry::No),
            // Insufficient resources: the BMC may free a session slot.
            0x01 | 0x0b => (
                self.protocol(ProtocolError::RmcpStatus { step, code }),
                Retry::NewSession,
            ),
            _ => (
                self.protocol(ProtocolError::RmcpStatus { step, code }),
                Retry::No,
            ),
        };
        Failure {
            error,
            retry,
            sent: false,
        }
    }

    fn insufficient_privilege(&self) -> BmcError {
        BmcError::InsufficientPrivilege {
            bmc: self.endpoint.clone(),
            user: self.creds.user().to_owned(),
        }
    }

    fn auth_failed(&self) -> BmcError {
        BmcError::AuthFailed {
            bmc: self.endpoint.clone(),
            user: self.creds.user().to_owned(),
        }
    }

    fn send<C>(
        &self,
        ipmi: &mut Ipmi<Rmcp>,
        cmd: C,
        name: CommandName,
    ) -> Result<C::Output, Failure>
    where
        C: IpmiCommand<Error = DecodeError>,
    {
        self.send_with(ipmi, cmd, name, |e| e)
    }

    fn send_with<C>(
        &self,
        ipmi: &mut Ipmi<Rmcp>,
        cmd: C,
        name: CommandName,
        decode: impl FnOnce(C::Error) -> DecodeError,
    ) -> Result<C::Output, Failure>
    where
        C: IpmiCommand,
    {
        let failure = |error, retry| Failure {
            error,
            retry,
            sent: true,
        };
        match ipmi.send_recv(cmd) {
            Ok(out) => Ok(out),
            Err(IpmiError::Connection(RmcpIpmiError::NotActive)) => Err(Failure {
                error: self.timeout(),
                retry: Retry::NewSession,
                sent: false,
            }),
            Err(IpmiError::Connection(RmcpIpmiError::Send(_))) => Err(Failure {
                error: BmcError::Unreachable {
                    bmc: self.endpoint.clone(),
                    waited: Duration::ZERO,
                },
                retry: Retry::NewSession,
                sent: false,
            }),
            // No answer on this session: the BMC dropped it (restart,
            // session timeout) or the network lost it.
            Err(IpmiError::Connection(RmcpIpmiError::Receive(RmcpIpmiReceiveError::Io(_)))) => {
                Err(failure(self.timeout(), Retry::NewSession))
            }
            Err(IpmiError::Connection(RmcpIpmiError::Receive(_))) => Err(failure(
                self.protocol(ProtocolError::Session),
                Retry::NewSession,
            )),
            Err(IpmiError::UnexpectedResponse {
                netfn_recvd,
                cmd_recvd,
                ..
            }) => Err(failure(
                self.protocol(ProtocolError::UnexpectedResponse {
                    netfn: netfn_recvd.response_value(),
                    cmd: cmd_recvd,
                }),
                Retry::NewSession,
            )),
            Err(IpmiError::NetFnIsResponse(_)) => Err(failure(
                self.protocol(ProtocolError::Response(name)),
                Retry::No,
            )),
            Err(IpmiError::Failed {
                completion_code, ..
            }) => Err(self.completion(name, completion_code)),
            Err(IpmiError::Command {
                completion_code: Some(cc),
                ..
            }) => Err(self.completion(name, cc)),
            Err(IpmiError::Command {
                error,
                completion_code: None,
                ..
            }) => {
                let DecodeError { cmd } = decode(error);
                Err(failure(
                    self.protocol(ProtocolError::Response(cmd)),
                    Retry::No,
                ))
            }
        }
    }

    fn completion(&self, cmd: CommandName, cc: CompletionErrorCode) -> Failure {
        let code = completion_code_byte(cc);
        let (error, retry) = match code {
            0xd4 => (self.insufficient_privilege(), Retry::No),
            // Node busy, timeout, response unavailable, BMC initializing.
            0xc0 | 0xc3 | 0xce | 0xd2 => (self.completion_error(cmd, code), Retry::SameSession),
            _ => (self.completion_error(cmd, code), Retry::No),
        };
        Failure {
            error,
            retry,
            sent: true,
        }
    }

    fn completion_error(&self, cmd: CommandName, code: u8) -> BmcError {
        BmcError::CompletionCode {
            bmc: self.endpoint.clone(),
            cmd,
            code,
        }
    }
}

/// The wire value of a completion code (IPMI 2.0 Table 5-2); ipmi-rs only
/// converts the other way.
pub fn completion_code_byte(cc: CompletionErrorCode) -> u8 {
    use CompletionErrorCode as C;
    match cc {
        C::NodeBusy => 0xc0,
        C::InvalidCommand => 0xc1,
        C::InvalidCommandForLun => 0xc2,
        C::ProcessingTimeout => 0xc3,
        C::OutOfSpace => 0xc4,
        C::ReservationCancelledOrInvalidId => 0xc5,
        C::RequestDataTruncated => 0xc6,
        C::RequestDataLenInvalid => 0xc7,
        C::RequestDataLengthLimitExceeded => 0xc8,
        C::ParameterOutOfRange => 0xc9,
        C::CannotReturnNumOfRequestedBytes => 0xca,
        C::RequestedDatapointNotPresent => 0xcb,
        C::InvalidDataFieldInRequest => 0xcc,
        C::CommandIllegalForSensorOrRecord => 0xcd,
        // The reason type is not exported: find the byte that parses to it.
        C::ResponseUnavailable { .. } => [0xd0, 0xd1, 0xd2]
            .into_iter()
            .find(|&b| C::try_from(b) == Ok(cc))
            .unwrap_or(0xce),
        C::CannotExecuteDuplicateRequest => 0xcf,
        C::DestinationUnavailable => 0xd3,
        C::InsufficientPrivilege => 0xd4,
        C::CannotExecuteCommandInCurrentState => 0xd5,
        C::SubFunctionDisabled => 0xd6,
        C::Unspecified => 0xff,
        C::Oem(v) | C::CommandSpecific(v) | C::Reserved(v) => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bmc::{BootDevice, Password};

    #[test]
    fn completion_codes_round_trip_to_their_wire_value() {
        for byte in 1..=u8::MAX {
            let cc = CompletionErrorCode::try_from(byte).unwrap();
            assert_eq!(completion_code_byte(cc), byte, "{cc:?}");
        }
    }

    fn bmc(policy: RetryPolicy) -> IpmiBmc {
        let creds = Credentials::new("admin", Password::new("s3cr3t-pw")).unwrap();
        IpmiBmc::new(&"ipmi://127.0.0.1:9".parse().unwrap(), creds, policy).unwrap()
    }

    #[test]
    fn redfish_addresses_are_refused_by_the_ipmi_driver() {
        let creds = Credentials::new("admin", Password::new("pw")).unwrap();
        let err = IpmiBmc::new(
            &"redfish://10.0.0.1/redfish/v1/Systems/1".parse().unwrap(),
            creds,
            RetryPolicy::default(),
        )
        .unwrap_err();
        assert!(matches!(err, BmcError::UnsupportedDriver { .. }));
        assert!(err.to_string().contains("IPMI driver"), "{err}");
    }

    #[test]
    fn debug_of_the_driver_never_shows_the_password() {
        let text = format!("{:?}", bmc(RetryPolicy::default()));
        assert!(!text.contains("s3cr3t"), "{text}");
    }

    #[tokio::test]
    async fn panics_inside_a_call_become_this_bmcs_protocol_error() {
        let bmc = bmc(RetryPolicy::default());
        let err = bmc
            .call(|_, _| -> Result<(), BmcError> { panic!("library bug") })
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            BmcError::Protocol {
                source: ProtocolError::LibraryPanic,
                ..
            }
        ));
        // The driver stays usable after the panic.
        let ok = bmc.call(|_, _| Ok(7)).await.unwrap();
        assert_eq!(ok, 7);
    }

    #[tokio::test]
    async fn a_stuck_worker_is_cut_off_at_the_deadline() {
        let policy = RetryPolicy {
            deadline: Duration::from_millis(100),
            ..RetryPolicy::default()
        };
        let started = Instant::now();
        let err = bmc(policy)
            .call(|_, _| {
                thread::sleep(Duration::from_secs(2));
                Ok(())
            })
            .await
            .unwrap_err();
        assert!(matches!(err, BmcError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_millis(1500));
    }

    #[test]
    fn permanent_errors_are_marked_so_callers_do_not_loop() {
        let auth = BmcError::AuthFailed {
            bmc: "b:623".into(),
            user: "u".into(),
        };
        assert!(auth.is_permanent());
        let mismatch = BmcError::ReadBackMismatch {
            bmc: "b:623".into(),
            wanted: BootTarget {
                device: BootDevice::Pxe,
                persistent: false,
                efi: false,
            },
            got: BootFlags {
                valid: false,
                persistent: false,
                efi: false,
                selector: 2,
            },
        };
        assert!(!mismatch.is_permanent());
    }
}
