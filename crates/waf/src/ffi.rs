//! ModSecurity's C API, loaded from `libmodsecurity.so.3` once per process, and the process's
//! one `ModSecurity` instance (its log callback set).

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// `ModSecurityIntervention` (`modsecurity/intervention.h`).
#[repr(C)]
pub(crate) struct Intervention {
    pub status: c_int,
    pub pause: c_int,
    pub url: *mut c_char,
    pub log: *mut c_char,
    pub disruptive: c_int,
}

/// The log callback's type: the transaction's `logCbData` and, with no properties asked for, a
/// NUL-terminated line.
pub(crate) type LogCb = unsafe extern "C" fn(*mut c_void, *const c_void);

/// The functions this crate calls, and the process's `ModSecurity` instance.
pub(crate) struct Api {
    pub msc: *mut c_void,
    pub create_rules_set: unsafe extern "C" fn() -> *mut c_void,
    pub rules_add: unsafe extern "C" fn(*mut c_void, *const c_char, *mut *const c_char) -> c_int,
    pub rules_cleanup: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub new_transaction: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void) -> *mut c_void,
    pub process_connection:
        unsafe extern "C" fn(*mut c_void, *const c_char, c_int, *const c_char, c_int) -> c_int,
    pub process_uri:
        unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char, *const c_char) -> c_int,
    pub add_n_request_header:
        unsafe extern "C" fn(*mut c_void, *const u8, usize, *const u8, usize) -> c_int,
    pub process_request_headers: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub append_request_body: unsafe extern "C" fn(*mut c_void, *const u8, usize) -> c_int,
    pub process_request_body: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub add_n_response_header:
        unsafe extern "C" fn(*mut c_void, *const u8, usize, *const u8, usize) -> c_int,
    pub process_response_headers: unsafe extern "C" fn(*mut c_void, c_int, *const c_char) -> c_int,
    pub append_response_body: unsafe extern "C" fn(*mut c_void, *const u8, usize) -> c_int,
    pub process_response_body: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub intervention: unsafe extern "C" fn(*mut c_void, *mut Intervention) -> c_int,
    pub process_logging: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub transaction_cleanup: unsafe extern "C" fn(*mut c_void),
    _lib: libloading::Library,
}

// SAFETY: the function pointers are plain code addresses; the `ModSecurity` instance is only
// read by libmodsecurity after `msc_init` and `msc_set_log_cb` (both done before `Api` is
// shared), as every threaded ModSecurity connector uses it.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

/// The loaded API, or why it could not be loaded (kept: loading is tried once).
pub(crate) fn api() -> Result<&'static Api, crate::WafError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| crate::WafError::Library(e.clone()))
}

fn load() -> Result<Api, String> {
    // SAFETY: loading libmodsecurity runs its (C++) static initializers, which have no
    // preconditions.
    let lib = unsafe { libloading::Library::new("libmodsecurity.so.3") }
        .map_err(|e| format!("{e} (Debian: apt install libmodsecurity3)"))?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol's type is the one `modsecurity/*.h` declares for it.
            *unsafe { lib.get($name) }.map_err(|e| format!("{e}"))?
        };
    }
    let init: unsafe extern "C" fn() -> *mut c_void = sym!(b"msc_init\0");
    let set_connector_info: unsafe extern "C" fn(*mut c_void, *const c_char) =
        sym!(b"msc_set_connector_info\0");
    let set_log_cb: unsafe extern "C" fn(*mut c_void, LogCb) = sym!(b"msc_set_log_cb\0");
    let api = Api {
        msc: std::ptr::null_mut(),
        create_rules_set: sym!(b"msc_create_rules_set\0"),
        rules_add: sym!(b"msc_rules_add\0"),
        rules_cleanup: sym!(b"msc_rules_cleanup\0"),
        new_transaction: sym!(b"msc_new_transaction\0"),
        process_connection: sym!(b"msc_process_connection\0"),
        process_uri: sym!(b"msc_process_uri\0"),
        add_n_request_header: sym!(b"msc_add_n_request_header\0"),
        process_request_headers: sym!(b"msc_process_request_headers\0"),
        append_request_body: sym!(b"msc_append_request_body\0"),
        process_request_body: sym!(b"msc_process_request_body\0"),
        add_n_response_header: sym!(b"msc_add_n_response_header\0"),
        process_response_headers: sym!(b"msc_process_response_headers\0"),
        append_response_body: sym!(b"msc_append_response_body\0"),
        process_response_body: sym!(b"msc_process_response_body\0"),
        intervention: sym!(b"msc_intervention\0"),
        process_logging: sym!(b"msc_process_logging\0"),
        transaction_cleanup: sym!(b"msc_transaction_cleanup\0"),
        _lib: lib,
    };
    // SAFETY: msc_init has no preconditions; the instance lives as long as the process (the
    // library is never unloaded: `Api` sits in a static).
    let msc = unsafe { init() };
    if msc.is_null() {
        return Err("msc_init returned no instance".into());
    }
    // SAFETY: msc is the live instance; the string is NUL-terminated and copied by the callee;
    // the callback has the type msc_set_log_cb takes.
    unsafe {
        set_connector_info(msc, c"rampart".as_ptr());
        set_log_cb(msc, crate::log_line::on_log);
    }
    Ok(Api { msc, ..api })
}

/// Frees a string libmodsecurity allocated with malloc (an error or an intervention's log).
pub(crate) fn free_c_string(p: *mut c_char) {
    if !p.is_null() {
        // SAFETY: p came from libmodsecurity's strdup/malloc and is freed once.
        unsafe { libc::free(p.cast()) };
    }
}
