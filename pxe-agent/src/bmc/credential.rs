//! BMC credentials. The password lives in [`Password`], whose `Debug` and
//! `Display` print a placeholder, so it cannot reach a log line, an error
//! message or a `{:?}` dump by accident.
//!
//! Owns the IPMI 2.0 length limits (§13.28: user names up to 16 bytes,
//! RAKP-HMAC-SHA1 passwords up to 20 bytes), which apply to IPMI only:
//! Redfish user names and passwords may be longer. It does not load
//! secrets from anywhere.

use std::fmt;

/// A BMC password. Read it only with [`Password::expose`], at the one
/// place that hands it to the RAKP exchange.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(Vec<u8>);

impl Password {
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Password(secret.into())
    }

    /// The secret bytes.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Drop for Password {
    fn drop(&mut self) {
        // Best effort: the allocator may have copied it before.
        self.0.iter_mut().for_each(|b| *b = 0);
    }
}

/// A user name and password; [`Credentials::check_ipmi`] says whether
/// IPMI can use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: Password,
}

/// Why credentials were refused before any packet was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("IPMI user name {user:?} is longer than 16 bytes")]
    UserTooLong { user: String },
    #[error("IPMI user name {user:?} must be printable ASCII")]
    UserNotAscii { user: String },
    #[error("password of IPMI user {user:?} is longer than 20 bytes")]
    PasswordTooLong { user: String },
}

impl Credentials {
    /// Credentials for any driver: the user name must be printable ASCII.
    pub fn new(user: impl Into<String>, password: Password) -> Result<Self, CredentialError> {
        let user = user.into();
        if !user.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            return Err(CredentialError::UserNotAscii { user });
        }
        Ok(Credentials { user, password })
    }

    /// Credentials within the IPMI limits too.
    pub fn ipmi(user: impl Into<String>, password: Password) -> Result<Self, CredentialError> {
        let creds = Credentials::new(user, password)?;
        creds.check_ipmi()?;
        Ok(creds)
    }

    /// Whether IPMI can use these: user name up to 16 bytes, password up
    /// to 20.
    pub fn check_ipmi(&self) -> Result<(), CredentialError> {
        if self.user.len() > 16 {
            return Err(CredentialError::UserTooLong {
                user: self.user.clone(),
            });
        }
        if self.password.expose().len() > 20 {
            return Err(CredentialError::PasswordTooLong {
                user: self.user.clone(),
            });
        }
        Ok(())
    }

    pub fn user(&self) -> &str {
        &self.user
    }

    pub fn password(&self) -> &Password {
        &self.password
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_never_shows_in_debug_display_or_errors() {
        let secret = "hunter2-very-secret";
        let creds = Credentials::new("admin", Password::new(secret)).unwrap();
        let renderings = [
            format!("{creds:?}"),
            format!("{creds:#?}"),
            format!("{}", creds.password()),
            format!("{:?}", creds.password()),
            format!(
                "{}",
                Credentials::ipmi("x".repeat(17), Password::new(secret)).unwrap_err()
            ),
            format!(
                "{:?}",
                Credentials::ipmi("admin", Password::new(secret.repeat(2))).unwrap_err()
            ),
        ];
        for text in renderings {
            assert!(
                !text.contains(secret) && !text.contains("hunter2"),
                "{text}"
            );
        }
        assert_eq!(creds.password().expose(), secret.as_bytes());
    }

    #[test]
    fn ipmi_length_limits_are_enforced() {
        assert!(Credentials::ipmi("a".repeat(16), Password::new([0u8; 20])).is_ok());
        assert!(matches!(
            Credentials::ipmi("a".repeat(17), Password::new("p")),
            Err(CredentialError::UserTooLong { .. })
        ));
        assert!(matches!(
            Credentials::ipmi("admin", Password::new([b'p'; 21])),
            Err(CredentialError::PasswordTooLong { .. })
        ));
        assert!(matches!(
            Credentials::new("ädmin", Password::new("p")),
            Err(CredentialError::UserNotAscii { .. })
        ));
    }

    #[test]
    fn redfish_credentials_may_exceed_the_ipmi_limits() {
        let long = Credentials::new("a-long-redfish-user", Password::new([b'p'; 64])).unwrap();
        assert_eq!(long.password().expose().len(), 64);
        assert!(long.check_ipmi().is_err());
    }
}
