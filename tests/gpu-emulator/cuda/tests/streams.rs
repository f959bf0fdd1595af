//! Contract 2: a stream is a worker of its own, in order and asynchronous; with a delay per
//! operation, reading before synchronising reads stale bytes; events complete in stream
//! order.

mod support;

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Mutex;

use support::*;

// Long enough that a loaded 2-core CI machine does not run the work before the test looks.
const DELAY_US: &str = "200000";

fn in_child(test: &str) -> bool {
    !ran_as_child(test, "delay", &[("STOKER_EMU_OP_DELAY_US", DELAY_US)])
}

fn stream() -> *mut c_void {
    let mut s = null_mut();
    // SAFETY: a local out-parameter.
    ok(unsafe { (cuda().stream_create)(&mut s, 1) });
    s
}

#[test]
fn reading_before_synchronising_reads_stale_bytes() {
    if !in_child("reading_before_synchronising_reads_stale_bytes") {
        return;
    }
    let c = init();
    bind(0);
    let s = stream();
    let mut d = 0u64;
    let src = vec![7u8; 4096];
    let mut back = vec![0u8; 4096];
    // SAFETY: `d` is 4096 device bytes; host buffers are locals that outlive the syncs.
    unsafe {
        ok((c.mem_alloc)(&mut d, 4096));
        let zeros = vec![0u8; 4096];
        ok((c.memcpy_htod_async)(d, zeros.as_ptr().cast(), 4096, s));
        ok((c.stream_synchronize)(s));
        // From pinned memory: the copy returns before it is done (from pageable memory it
        // would not: the test below).
        let mut pinned: *mut c_void = null_mut();
        ok((c.mem_alloc_host)(&mut pinned, 4096));
        std::ptr::copy_nonoverlapping(src.as_ptr(), pinned.cast::<u8>(), 4096);
        ok((c.memcpy_htod_async)(d, pinned, 4096, s));
        assert_eq!((c.stream_query)(s), NOT_READY);
        // A synchronous copy runs on the null stream, which does not wait for `s`.
        ok((c.memcpy_dtoh)(back.as_mut_ptr().cast(), d, 4096));
        assert!(
            back.iter().all(|&b| b == 0),
            "read the new bytes before syncing"
        );
        ok((c.stream_synchronize)(s));
        ok((c.stream_query)(s));
        ok((c.memcpy_dtoh)(back.as_mut_ptr().cast(), d, 4096));
        assert_eq!(back, src);
        ok((c.mem_free_host)(pinned));
        ok((c.mem_free)(d));
        ok((c.stream_destroy)(s));
    }
}

#[test]
fn an_upload_from_pageable_memory_returns_once_the_stream_ran_it() {
    // "If pageable memory must first be staged to pinned memory, the driver may synchronize
    // with the stream and stage the copy into pinned memory" (driver API, "API
    // synchronization behavior"): the emulator does, so pageable staging costs the caller
    // the stream's queued work, as it may on a GPU.
    if !in_child("an_upload_from_pageable_memory_returns_once_the_stream_ran_it") {
        return;
    }
    let c = init();
    bind(0);
    let s = stream();
    let mut d = 0u64;
    let pageable = [5u8; 64];
    let mut pinned: *mut c_void = null_mut();
    let delay = std::time::Duration::from_micros(DELAY_US.parse().unwrap());
    // SAFETY: `d` is 64 device bytes, `pinned` 64 pinned bytes; all synchronised below.
    unsafe {
        ok((c.mem_alloc)(&mut d, 64));
        ok((c.mem_alloc_host)(&mut pinned, 64));
        let t = std::time::Instant::now();
        ok((c.memcpy_htod_async)(d, pinned, 64, s));
        assert!(t.elapsed() < delay / 2, "from pinned memory: asynchronous");
        assert_eq!((c.stream_query)(s), NOT_READY);
        let t = std::time::Instant::now();
        ok((c.memcpy_htod_async)(d, pageable.as_ptr().cast(), 64, s));
        assert!(
            t.elapsed() >= delay,
            "from pageable memory: after the stream's work"
        );
        ok((c.stream_query)(s));
        ok((c.mem_free_host)(pinned));
        ok((c.mem_free)(d));
        ok((c.stream_destroy)(s));
    }
}

static ORDER: Mutex<Vec<usize>> = Mutex::new(Vec::new());

unsafe extern "C" fn push(data: *mut c_void) {
    ORDER.lock().unwrap().push(data as usize);
}

#[test]
fn a_stream_runs_its_work_in_order_and_events_complete_in_order() {
    if !in_child("a_stream_runs_its_work_in_order_and_events_complete_in_order") {
        return;
    }
    let c = init();
    bind(0);
    let s = stream();
    let mut events = [null_mut(); 3];
    // SAFETY: host functions and events on a live stream; all waited for below.
    unsafe {
        for (i, e) in events.iter_mut().enumerate() {
            ok((c.event_create)(e, 0x2));
            ok((c.launch_host_func)(s, push, i as *mut c_void));
            ok((c.event_record)(*e, s));
        }
        // Nothing ran yet (each operation waits the delay first).
        assert_eq!((c.event_query)(events[0]), NOT_READY);
        ok((c.event_synchronize)(events[1]));
        ok((c.event_query)(events[0]));
        assert_eq!(ORDER.lock().unwrap()[..2], [0, 1]);
        ok((c.stream_synchronize)(s));
        assert_eq!(*ORDER.lock().unwrap(), vec![0, 1, 2]);
        for e in events {
            ok((c.event_destroy)(e));
        }
        ok((c.stream_destroy)(s));
    }
}

#[test]
fn a_stream_waits_for_an_event_of_another_stream() {
    if !in_child("a_stream_waits_for_an_event_of_another_stream") {
        return;
    }
    let c = init();
    bind(0);
    let (a, b) = (stream(), stream());
    let mut d = 0u64;
    let mut e = null_mut();
    let ones = vec![1u8; 256];
    let mut host: *mut c_void = null_mut();
    // SAFETY: pinned host memory and device memory live until the end; all synchronised.
    unsafe {
        ok((c.mem_alloc)(&mut d, 256));
        ok((c.mem_alloc_host)(&mut host, 256));
        std::ptr::write_bytes(host.cast::<u8>(), 9, 256);
        ok((c.event_create)(&mut e, 0x2));
        ok((c.memcpy_htod_async)(d, ones.as_ptr().cast(), 256, a));
        ok((c.event_record)(e, a));
        ok((c.stream_wait_event)(b, e, 0));
        // Into pinned memory: asynchronous, ordered after `a`'s copy by the event.
        ok((c.memcpy_dtoh_async)(host, d, 256, b));
        assert_eq!(
            *host.cast::<u8>(),
            9,
            "the pinned copy ran before the call returned"
        );
        ok((c.stream_synchronize)(b));
        assert!(std::slice::from_raw_parts(host.cast::<u8>(), 256)
            .iter()
            .all(|&x| x == 1));
        ok((c.mem_free_host)(host));
        ok((c.mem_free)(d));
        ok((c.event_destroy)(e));
        ok((c.stream_destroy)(a));
        ok((c.stream_destroy)(b));
    }
}

/// "hEvent may be from a different context or device than hStream", and
/// `CU_EVENT_WAIT_EXTERNAL` "is invalid outside of stream capture" (`cuStreamWaitEvent`).
#[test]
fn a_stream_waits_for_an_event_of_another_device_and_refuses_the_external_flag() {
    if !in_child("a_stream_waits_for_an_event_of_another_device_and_refuses_the_external_flag") {
        return;
    }
    let c = init();
    let mut e = null_mut();
    let mut host: *mut c_void = null_mut();
    let (mut d1, mut d0) = (0u64, 0u64);
    let sevens = vec![7u8; 256];
    // SAFETY: pinned host memory and device memory live until the end; all synchronised.
    unsafe {
        bind(1);
        let s1 = stream();
        ok((c.mem_alloc)(&mut d1, 256));
        ok((c.event_create)(&mut e, 0x2));
        ok((c.memcpy_htod_async)(d1, sevens.as_ptr().cast(), 256, s1));
        ok((c.event_record)(e, s1));
        bind(0);
        let s0 = stream();
        ok((c.mem_alloc)(&mut d0, 256));
        ok((c.mem_alloc_host)(&mut host, 256));
        std::ptr::write_bytes(host.cast::<u8>(), 0, 256);
        assert_eq!(
            (c.stream_wait_event)(s0, e, 1),
            401,
            "CUDA_ERROR_ILLEGAL_STATE"
        );
        ok((c.stream_wait_event)(s0, e, 0));
        ok((c.launch_host_func)(s0, note_done, host));
        assert_eq!(
            *host.cast::<u8>(),
            0,
            "the wait held the host function back"
        );
        ok((c.stream_synchronize)(s0));
        assert_eq!(*host.cast::<u8>(), 1);
        ok((c.mem_free_host)(host));
    }
}

unsafe extern "C" fn note_done(p: *mut c_void) {
    // SAFETY: the test passes 256 bytes of pinned memory.
    unsafe { *p.cast::<u8>() = 1 };
}

#[test]
fn pageable_sources_are_staged_and_pinned_ones_are_read_later() {
    if !in_child("pageable_sources_are_staged_and_pinned_ones_are_read_later") {
        return;
    }
    let c = init();
    bind(0);
    let s = stream();
    let (mut d1, mut d2) = (0u64, 0u64);
    let mut pageable = [1u8; 64];
    let mut pinned: *mut c_void = null_mut();
    let mut back = [0u8; 64];
    // SAFETY: as the test above.
    unsafe {
        ok((c.mem_alloc)(&mut d1, 64));
        ok((c.mem_alloc)(&mut d2, 64));
        ok((c.mem_host_alloc)(&mut pinned, 64, 0));
        std::ptr::write_bytes(pinned.cast::<u8>(), 1, 64);
        ok((c.memcpy_htod_async)(d1, pageable.as_ptr().cast(), 64, s));
        ok((c.memcpy_htod_async)(d2, pinned, 64, s));
        // Changed after the calls returned, before the stream ran them.
        pageable.fill(2);
        std::ptr::write_bytes(pinned.cast::<u8>(), 2, 64);
        ok((c.stream_synchronize)(s));
        ok((c.memcpy_dtoh)(back.as_mut_ptr().cast(), d1, 64));
        assert_eq!(back, [1u8; 64], "pageable memory is staged at the call");
        ok((c.memcpy_dtoh)(back.as_mut_ptr().cast(), d2, 64));
        assert_eq!(back, [2u8; 64], "pinned memory is read when the copy runs");
        // Registered (cuMemHostRegister) memory counts as pinned too.
        let mut registered = vec![3u8; 64];
        ok((c.mem_host_register)(registered.as_mut_ptr().cast(), 64, 0));
        assert_eq!(
            (c.mem_host_register)(registered.as_mut_ptr().cast(), 64, 0),
            712
        );
        ok((c.memcpy_htod_async)(d1, registered.as_ptr().cast(), 64, s));
        registered.fill(4);
        ok((c.stream_synchronize)(s));
        ok((c.memcpy_dtoh)(back.as_mut_ptr().cast(), d1, 64));
        assert_eq!(
            back, [4u8; 64],
            "registered memory is read when the copy runs"
        );
        ok((c.mem_host_unregister)(registered.as_mut_ptr().cast()));
        assert_eq!((c.mem_host_unregister)(registered.as_mut_ptr().cast()), 713);
        ok((c.mem_free_host)(pinned));
        ok((c.mem_free)(d1));
        ok((c.mem_free)(d2));
        ok((c.stream_destroy)(s));
    }
}

#[test]
fn timing_events_measure_the_work_between_them() {
    if !in_child("timing_events_measure_the_work_between_them") {
        return;
    }
    let c = init();
    bind(0);
    let s = stream();
    let (mut a, mut b, mut untimed) = (null_mut(), null_mut(), null_mut());
    let mut ms = 0f32;
    // SAFETY: events and a host function on a live stream, synchronised before reading.
    unsafe {
        ok((c.event_create)(&mut a, 0));
        ok((c.event_create)(&mut b, 0));
        ok((c.event_create)(&mut untimed, 0x2));
        ok((c.event_record)(a, s));
        ok((c.launch_host_func)(s, push, 99 as *mut c_void));
        ok((c.event_record)(b, s));
        assert_eq!((c.event_elapsed_time)(&mut ms, a, b), NOT_READY);
        ok((c.event_synchronize)(b));
        ok((c.event_elapsed_time)(&mut ms, a, b));
        // Two operations of 200 ms each ran between the markers' own runs.
        assert!((350.0..5000.0).contains(&ms), "{ms} ms");
        ok((c.event_record)(untimed, s));
        ok((c.event_synchronize)(untimed));
        assert_eq!(
            (c.event_elapsed_time)(&mut ms, a, untimed),
            400,
            "timing disabled"
        );
    }
}

/// Priorities: the range is [greatest, least] with 0, the default, the least; a priority outside
/// it is clamped ("it will automatically be clamped to the lowest or the highest number in the
/// range", `cuStreamCreateWithPriority`).
#[test]
fn stream_priorities_are_clamped_to_the_range_whose_least_is_the_default() {
    let c = init();
    bind(0);
    let (mut least, mut greatest) = (7, 7);
    let priority = |s: *mut c_void| {
        let mut p = 99;
        // SAFETY: a live stream of the current context; a local out-parameter.
        ok(unsafe { (c.stream_get_priority)(s, &mut p) });
        p
    };
    // SAFETY: local out-parameters.
    unsafe {
        ok((c.ctx_get_stream_priority_range)(&mut least, &mut greatest));
        assert!(greatest < least && least == 0, "[{greatest}, {least}]");
        assert_eq!(priority(stream()), least);
        for (asked, got) in [(-100, greatest), (100, least), (greatest + 1, greatest + 1)] {
            let mut s = null_mut();
            ok((c.stream_create_with_priority)(&mut s, 1, asked));
            assert_eq!(priority(s), got, "asked {asked}");
        }
    }
}
