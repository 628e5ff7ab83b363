//! Why an inventory was refused: the read, parse and validation errors, and
//! the per-field [`Problem`]s that validation collects. Owns their wording;
//! deciding what is a problem is `validate`'s job.

use std::{fmt, io, path::PathBuf};

/// An inventory that could not be read, parsed or validated.
///
/// Every variant names the file, so that a refused reload can be logged as
/// is.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("failed to read inventory {}: {source}", .path.display())]
    Io { path: PathBuf, source: io::Error },
    /// The file is not valid YAML or does not have the inventory's shape
    /// (wrong type, missing or unknown key). `message` is the YAML parser's,
    /// with line and column.
    #[error("failed to parse inventory {}: {message}", .path.display())]
    Syntax { path: PathBuf, message: String },
    /// The file parsed but breaks one or more rules; all of them are listed.
    #[error("invalid inventory {}{}", .path.display(), ProblemList(.problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

/// One broken rule: which host (if any), which field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The host in [`Host::label`](super::Host::label) form, or `hosts[3]`
    /// when its MAC is unusable; `None` for subnet and profile problems.
    pub host: Option<String>,
    /// The key, e.g. `ip`, `options.42`, `subnets[0].cidr` or
    /// `profiles[worker].boot.http`.
    pub field: String,
    pub message: String,
}

impl Problem {
    pub fn new(
        host: Option<String>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Problem {
        Problem {
            host,
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(host) = &self.host {
            write!(f, "host {host}: ")?;
        }
        write!(f, "field {}: {}", self.field, self.message)
    }
}

/// Renders ` (N problems):` followed by one indented problem per line.
struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.len();
        write!(
            f,
            " ({count} problem{}):",
            if count == 1 { "" } else { "s" }
        )?;
        for problem in self.0 {
            write!(f, "\n  {problem}")?;
        }
        Ok(())
    }
}
