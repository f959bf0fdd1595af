//! The C ABI's argument checks and error reporting, without a daemon.

use super::*;

fn last_error() -> String {
    // SAFETY: stoker_last_error returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(stoker_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn null_arguments_are_errors_not_crashes() {
    let mut client: *mut stoker_client = std::ptr::null_mut();
    // SAFETY: NULL options are allowed and refused; `client` is writable.
    let r = unsafe { stoker_attach(std::ptr::null(), &mut client) };
    assert_eq!(r, STOKER_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "options is NULL");
    let mut batch: *mut stoker_batch = std::ptr::null_mut();
    // SAFETY: NULL client is refused.
    let r = unsafe { stoker_next(std::ptr::null_mut(), &mut batch) };
    assert_eq!(r, STOKER_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "client is NULL");
    // SAFETY: NULL is ignored.
    unsafe {
        stoker_batch_release(std::ptr::null_mut());
        stoker_detach(std::ptr::null_mut());
    }
}

#[test]
fn attach_reports_bad_spec_and_missing_daemon() {
    let mut o = stoker_attach_options::default();
    // SAFETY: `o` is writable.
    assert_eq!(unsafe { stoker_attach_options_init(&mut o) }, STOKER_OK);
    let dir = tempfile::tempdir().unwrap();
    let sock = CString::new(dir.path().join("none.sock").to_str().unwrap()).unwrap();
    o.socket = sock.as_ptr();
    o.dataset = c"/data".as_ptr();
    o.spec_json = c"{\"batch_size\": 2}".as_ptr();
    let mut client: *mut stoker_client = std::ptr::null_mut();
    // SAFETY: valid options with live strings; `client` is writable.
    let r = unsafe { stoker_attach(&o, &mut client) };
    assert_eq!(r, STOKER_ERR_SPEC);
    assert!(last_error().contains("crop"), "{}", last_error());

    o.spec_json =
        c"{\"batch_size\": 2, \"crop\": {\"kind\": \"center_crop\", \"resize\": 8, \"size\": [8, 8]}}"
            .as_ptr();
    // SAFETY: as above.
    let r = unsafe { stoker_attach(&o, &mut client) };
    assert_eq!(r, STOKER_ERR_CONNECT, "{}", last_error());
    assert!(
        last_error().contains("no stoker daemon"),
        "{}",
        last_error()
    );
    assert!(client.is_null());

    // A device name is parsed once, before any connection: a bad one is a device error
    // naming it.
    o.device = c"tpu:0".as_ptr();
    // SAFETY: as above.
    let r = unsafe { stoker_attach(&o, &mut client) };
    assert_eq!(r, STOKER_ERR_DEVICE, "{}", last_error());
    assert!(last_error().contains("\"tpu:0\""), "{}", last_error());
    o.device = std::ptr::null();

    o.world_size = 2;
    o.rank = 0;
    // SAFETY: as above.
    let r = unsafe { stoker_attach(&o, &mut client) };
    assert_eq!(r, STOKER_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("job"), "{}", last_error());
}

#[test]
fn a_struct_from_a_newer_header_with_unknown_fields_is_refused() {
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Newer {
        base: stoker_attach_options,
        extra: u64,
    }
    let mut n = Newer {
        base: stoker_attach_options::default(),
        extra: 7,
    };
    n.base.size = std::mem::size_of::<Newer>();
    let mut client: *mut stoker_client = std::ptr::null_mut();
    // SAFETY: `n` is valid for its declared size.
    let r = unsafe { stoker_attach(&n.base, &mut client) };
    assert_eq!(r, STOKER_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("does not know"), "{}", last_error());
}

#[test]
fn result_names_match_the_enum() {
    for r in [
        STOKER_OK,
        STOKER_END_OF_DATA,
        STOKER_ERR_SPEC,
        STOKER_ERR_INTERNAL,
    ] {
        // SAFETY: static strings.
        let name = unsafe { CStr::from_ptr(stoker_result_name(r as i32)) };
        assert_eq!(name.to_str().unwrap(), format!("{r:?}"));
    }
}
