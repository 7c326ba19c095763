//! [`VerbsError`]: a failed libibverbs call, by name and errno.
//!
//! It is plain data, so the device-free modules (`demux`'s posting errors,
//! the relaxed-ordering fallback, their fakes in tests) name a failed call
//! without importing `ffi`, the module that makes the calls. Every
//! `VerbsError` becomes a [`TransferError::Verbs`] with the same call and
//! errno: nothing about the failure is dropped on the way to the caller.

use std::fmt;

use crate::error::TransferError;

/// A failed libibverbs call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerbsError {
    /// The C call.
    pub call: &'static str,
    /// Its errno (positive).
    pub errno: i32,
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // io::Error's text already ends with "(os error N)".
        write!(
            f,
            "libibverbs call {} failed: {}",
            self.call,
            std::io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl std::error::Error for VerbsError {}

impl From<VerbsError> for TransferError {
    fn from(e: VerbsError) -> TransferError {
        TransferError::Verbs {
            call: e.call,
            errno: e.errno,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_call_and_errno() {
        let e = VerbsError {
            call: "ibv_reg_mr",
            errno: libc::ENOMEM,
        };
        assert!(e
            .to_string()
            .starts_with("libibverbs call ibv_reg_mr failed: "));
        assert_eq!(
            TransferError::from(e),
            TransferError::Verbs {
                call: "ibv_reg_mr",
                errno: libc::ENOMEM
            }
        );
    }
}
