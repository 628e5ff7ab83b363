//! Running outside programs: checked runs that capture or forward output,
//! [`ChildGuard`] for long-running children, and the root check privileged
//! tasks start with.
//!
//! Children are always stopped by their own PID, never by name, so parallel
//! runs and unrelated processes on the machine are left alone.

use std::{
    io::{BufRead as _, BufReader, Read, Write as _},
    process::{Child, Command, ExitStatus, Output, Stdio},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// How long [`ChildGuard`] waits after SIGTERM before it sends SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(2);

/// Fails with a clear message unless the effective user is root.
pub fn ensure_root() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!("privileged tests need root (CAP_BPF, CAP_NET_ADMIN): run as root");
    }
    Ok(())
}

/// Renders a command as a shell-like line for messages.
pub fn describe(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `cmd` to completion and returns its stdout; fails with its stderr
/// when it exits unsuccessfully.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let output = output(cmd)?;
    if !output.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(cmd),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `cmd` to completion capturing stdout and stderr, whatever its exit status.
pub fn output(cmd: &mut Command) -> anyhow::Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .with_context(|| format!("failed to run `{}`", describe(cmd)))
}

/// Runs `cmd` with the terminal's stdout and stderr; fails when it exits
/// unsuccessfully.
pub fn run_forwarded(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to run `{}`", describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Owns a spawned child: on drop it sends SIGTERM to that PID, waits up to
/// [`TERM_GRACE`], then sends SIGKILL, and always reaps it.
///
/// Declare the guard after the [`crate::Lab`] its child runs in, so it drops
/// first: a namespace is only torn down once its last process has exited.
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// Spawns `cmd` and guards the child.
    pub fn spawn(cmd: &mut Command) -> anyhow::Result<Self> {
        let child = cmd
            .spawn()
            .with_context(|| format!("failed to spawn `{}`", describe(cmd)))?;
        Ok(Self(child))
    }

    /// Spawns `cmd` with stdout and stderr copied line by line to this
    /// process's stderr, each line prefixed with `[prefix]`. Join the returned
    /// handles after the guard dropped to flush the child's last lines.
    pub fn spawn_prefixed(
        cmd: &mut Command,
        prefix: &str,
    ) -> anyhow::Result<(Self, Vec<JoinHandle<()>>)> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut guard = Self::spawn(cmd)?;
        let mut pumps = Vec::new();
        if let Some(out) = guard.0.stdout.take() {
            pumps.push(pump_lines(out, prefix.to_owned()));
        }
        if let Some(err) = guard.0.stderr.take() {
            pumps.push(pump_lines(err, prefix.to_owned()));
        }
        Ok((guard, pumps))
    }

    /// The child's PID.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Returns the exit status if the child has already exited.
    pub fn try_wait(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.0.try_wait().context("failed to poll child process")
    }

    /// Stops the child (SIGTERM, then SIGKILL after [`TERM_GRACE`]) and
    /// returns its exit status.
    pub fn stop(mut self) -> anyhow::Result<ExitStatus> {
        self.terminate()
    }

    fn terminate(&mut self) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        signal(self.id(), libc::SIGTERM);
        let deadline = Instant::now() + TERM_GRACE;
        while Instant::now() < deadline {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            thread::sleep(Duration::from_millis(20));
        }
        // Child::kill sends SIGKILL to this PID only.
        let _ = self.0.kill();
        self.0.wait().context("failed to reap child process")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Err(err) = self.terminate() {
            let _ = writeln!(std::io::stderr(), "warning: pid {}: {err:#}", self.id());
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers; the PID is our own unreaped child,
    // so it cannot have been recycled for another process.
    unsafe {
        libc::kill(pid, sig);
    }
}

fn pump_lines(stream: impl Read + Send + 'static, prefix: String) -> JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(std::io::stderr(), "[{prefix}] {line}");
        }
    })
}
