//! User names for uids, as `stoker status` shows a job's owner.
//!
//! # Design
//! - `getpwuid_r` through `libc` (rustix has no user database; the lookup is NSS, libc's own),
//!   so users from LDAP or SSSD are named as `ls -l` names them.
//!
//! # Limitations
//! - A uid the database does not know has no name; callers show the number.

/// The user name of `uid` from the system's user database, if it has one.
pub fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: a zeroed libc::passwd is a valid out-parameter for getpwuid_r.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer refers to live memory of the stated size for the call's duration;
    // the result points only into `pwd` and `buf`, both alive while pw_name is read below.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded, so pw_name is a NUL-terminated string inside `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_is_named_and_an_unused_uid_is_not() {
        assert_eq!(super::user_name(0).as_deref(), Some("root"));
        assert_eq!(super::user_name(u32::MAX - 7), None);
    }
}
