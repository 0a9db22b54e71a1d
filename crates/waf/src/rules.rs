//! A compiled rule set.

use crate::ffi;
use crate::WafError;
use std::ffi::{c_char, c_void, CStr, CString};

/// Rules compiled from ModSecurity directives, shared by the inspections that use them.
pub struct RuleSet {
    ptr: *mut c_void,
    rules: usize,
}

// SAFETY: a RulesSet is not changed after it is built (only read by transactions), which is
// how ModSecurity's threaded connectors share one across their worker threads; dropping it
// needs `&mut`/ownership, so no transaction can be using it then (each `inspect` borrows it).
unsafe impl Send for RuleSet {}
// SAFETY: as above.
unsafe impl Sync for RuleSet {}

impl RuleSet {
    /// Compiles `directives` (ModSecurity's configuration language; `Include` paths are read
    /// then). The error is ModSecurity's own, which names the file and line it stopped at.
    pub fn new(directives: &str) -> Result<Self, WafError> {
        let api = ffi::api()?;
        let text = CString::new(directives)
            .map_err(|_| WafError::Rules("the directives hold a NUL byte".into()))?;
        // SAFETY: no preconditions.
        let ptr = unsafe { (api.create_rules_set)() };
        if ptr.is_null() {
            return Err(WafError::Rules(
                "msc_create_rules_set returned nothing".into(),
            ));
        }
        let mut set = RuleSet { ptr, rules: 0 };
        let mut error: *const c_char = std::ptr::null();
        // ModSecurity's rule parser keeps state in globals: one build at a time.
        static PARSER: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = PARSER.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: ptr is a live rules set, text NUL-terminated; `error` receives a malloc'd
        // message on failure, which is freed below.
        let added = unsafe { (api.rules_add)(set.ptr, text.as_ptr(), &mut error) };
        if added < 0 {
            let msg = if error.is_null() {
                "no reason given".to_string()
            } else {
                // SAFETY: a NUL-terminated string from libmodsecurity.
                let s = unsafe { CStr::from_ptr(error) }
                    .to_string_lossy()
                    .trim()
                    .to_string();
                ffi::free_c_string(error.cast_mut());
                s
            };
            return Err(WafError::Rules(msg));
        }
        set.rules = added as usize;
        Ok(set)
    }

    /// How many rules were loaded.
    pub fn len(&self) -> usize {
        self.rules
    }

    /// Whether no rule was loaded.
    pub fn is_empty(&self) -> bool {
        self.rules == 0
    }

    pub(crate) fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }
}

impl Drop for RuleSet {
    fn drop(&mut self) {
        if let Ok(api) = ffi::api() {
            // SAFETY: ptr is this set's, released once; no transaction borrows it any more.
            unsafe { (api.rules_cleanup)(self.ptr) };
        }
    }
}

impl std::fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleSet")
            .field("rules", &self.rules)
            .finish()
    }
}
