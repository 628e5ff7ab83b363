//! The agent's descriptor budget: raises the soft `RLIMIT_NOFILE` toward
//! the hard one for the TFTP and HTTP bounds it is given, and, where the limit still
//! falls short, lowers both bounds so that what is past them waits (TFTP
//! requests in the wait queue, connections in the listen backlog) instead
//! of failing for want of a descriptor.

use std::io;

use tracing::{info, warn};

/// Descriptors one TFTP transfer holds: its socket, the file it reads and
/// the eventfd of its mailbox.
pub const FDS_PER_TFTP_TRANSFER: u64 = 3;

/// Descriptors one boot HTTP connection holds: its socket and the file it
/// sends.
pub const FDS_PER_HTTP_CONNECTION: u64 = 2;

/// Descriptors one parked boot HTTP connection holds (waiting for an
/// artifact's turn, its slot given back): its socket.
pub const FDS_PER_PARKED_CONNECTION: u64 = 1;

/// Descriptors the rest of the agent needs: BPF maps and programs, the
/// DHCP and listening sockets, the lease store, BMC sessions, the log.
pub const FDS_RESERVED: u64 = 64;

/// The bounds the boot services run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub tftp_transfers: usize,
    pub http_connections: usize,
    pub http_parked: usize,
}

impl Bounds {
    /// Descriptors these bounds can hold at once, with the reserve.
    pub fn descriptors(&self) -> u64 {
        FDS_RESERVED
            .saturating_add((self.tftp_transfers as u64).saturating_mul(FDS_PER_TFTP_TRANSFER))
            .saturating_add((self.http_connections as u64).saturating_mul(FDS_PER_HTTP_CONNECTION))
            .saturating_add((self.http_parked as u64).saturating_mul(FDS_PER_PARKED_CONNECTION))
    }

    /// The largest bounds within `nofile` descriptors: `self` if it fits,
    /// else both scaled down by the same factor (each at least 1).
    pub fn within(self, nofile: u64) -> Bounds {
        let need = self.descriptors();
        if need <= nofile {
            return self;
        }
        let room = u128::from(nofile.saturating_sub(FDS_RESERVED));
        let want = u128::from(need - FDS_RESERVED);
        let scale = |n: usize| -> usize {
            if n == 0 {
                return 0;
            }
            let scaled = (n as u128 * room / want) as usize;
            scaled.max(1)
        };
        Bounds {
            tftp_transfers: scale(self.tftp_transfers),
            http_connections: scale(self.http_connections),
            http_parked: scale(self.http_parked),
        }
    }
}

/// Raises the open-files limit toward what `wanted` needs and returns the
/// bounds that fit the limit then in force, saying in the log when they
/// are lower than asked.
pub fn fit(wanted: Bounds) -> Bounds {
    let nofile = match raise_to(wanted.descriptors()) {
        Ok(nofile) => nofile,
        Err(e) => {
            warn!(error = %e, "failed to read or raise the open-files limit; keeping the bounds as given");
            return wanted;
        }
    };
    let fitted = wanted.within(nofile);
    if fitted == wanted {
        info!(
            nofile,
            tftp_max_transfers = wanted.tftp_transfers,
            http_max_connections = wanted.http_connections,
            "open-files limit holds the boot services' bounds"
        );
    } else {
        warn!(
            nofile,
            tftp_max_transfers = fitted.tftp_transfers,
            http_max_connections = fitted.http_connections,
            asked_tftp_max_transfers = wanted.tftp_transfers,
            asked_http_max_connections = wanted.http_connections,
            "the open-files limit holds fewer transfers and connections than asked; \
             the rest wait for a slot (raise LimitNOFILE, or lower \
             --tftp-max-transfers and --http-max-connections)"
        );
    }
    fitted
}

/// Raises the soft `RLIMIT_NOFILE` toward `want`, up to the hard limit
/// (the operator's ceiling, e.g. systemd's `LimitNOFILE=`, is kept), and
/// returns the soft limit then in force.
fn raise_to(want: u64) -> io::Result<u64> {
    let mut lim = getrlimit()?;
    let target = want.min(lim.rlim_max);
    if target > lim.rlim_cur {
        lim.rlim_cur = target;
        setrlimit(&lim)?;
    }
    Ok(lim.rlim_cur)
}

fn getrlimit() -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which lim is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim)
}

fn setrlimit(lim: &libc::rlimit) -> io::Result<()> {
    // SAFETY: setrlimit reads one rlimit, which lim is.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn bounds(tftp_transfers: usize, http_connections: usize) -> Bounds {
        Bounds {
            tftp_transfers,
            http_connections,
            http_parked: 0,
        }
    }

    #[test]
    fn bounds_that_fit_are_kept() {
        let b = bounds(128, 1024);
        assert_eq!(b.descriptors(), 64 + 384 + 2048);
        assert_eq!(b.within(b.descriptors()), b);
        assert_eq!(b.within(1 << 20), b);
    }

    #[test]
    fn bounds_past_the_limit_shrink_together_to_fit() {
        // 65,535 of each wants 327,739 descriptors; 20,000 hold 6 %.
        let asked = bounds(65_535, 65_535);
        let fitted = asked.within(20_000);
        assert!(fitted.descriptors() <= 20_000, "{fitted:?}");
        assert_eq!(fitted, bounds(3_987, 3_987));
        // Not both at one: the one that is not served stays at zero.
        assert_eq!(bounds(0, 65_535).within(20_000), bounds(0, 9_968));
    }

    #[test]
    fn a_limit_below_the_reserve_still_leaves_one_of_each() {
        assert_eq!(bounds(128, 1024).within(50), bounds(1, 1));
    }

    #[test]
    fn the_soft_limit_rises_to_what_is_asked_within_the_hard_one() {
        let before = getrlimit().expect("getrlimit");
        let got = raise_to(before.rlim_cur).expect("raise");
        assert_eq!(got, before.rlim_cur);
        let got = raise_to(before.rlim_cur.saturating_sub(1)).expect("raise");
        assert_eq!(got, before.rlim_cur, "the limit is never lowered");
    }
}
