//! Owns how the agent takes its std locks: a lock that a panicking holder
//! poisoned is taken as it is, so one panic does not turn every later use
//! of that lock (on paths serving the whole fleet) into a panic of its own.
//! It does not know what any lock guards.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, poisoned or not.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `l`, poisoned or not.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `l`, poisoned or not.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_with_what_it_holds() {
        let m = Mutex::new(1);
        let l = RwLock::new(1);
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let (mut a, mut b) = (lock(&m), write(&l));
            (*a, *b) = (2, 2);
            panic!("poisons both");
        }));
        assert!(m.is_poisoned() && l.is_poisoned());
        assert_eq!(*lock(&m), 2);
        assert_eq!(*read(&l), 2);
        *write(&l) = 3;
        assert_eq!(*read(&l), 3);
    }
}
