//! Contract 3: device memory within the configured size; pinned host memory; VMM with 2 MiB
//! granularity, POSIX-fd export only when asked for, no access before `cuMemSetAccess`, the
//! same pages in another process, and the driver's reference counting.

mod support;

use std::ffi::{c_int, c_void};
use std::os::unix::process::ExitStatusExt;

use support::*;

#[test]
fn device_memory_is_bounded_by_the_configured_size() {
    let c = init();
    on_own_thread(move || {
        bind(2); // 16 MiB
        let (mut a, mut b) = (0u64, 0u64);
        // SAFETY: local out-parameters; every allocation is freed.
        unsafe {
            assert_eq!((c.mem_alloc)(&mut a, 17 * MIB), OUT_OF_MEMORY);
            ok((c.mem_alloc)(&mut a, 10 * MIB));
            assert_eq!((c.mem_alloc)(&mut b, 10 * MIB), OUT_OF_MEMORY);
            assert_eq!(
                (c.mem_free)(a + 256),
                INVALID_VALUE,
                "not an allocation's start"
            );
            ok((c.mem_free)(a));
            ok((c.mem_alloc)(&mut b, 10 * MIB));
            // A copy past the end of an allocation is refused, not done.
            let host = vec![0u8; 512];
            let end = b + 10 * MIB as u64 - 256;
            assert_eq!(
                (c.memcpy_htod_async)(end, host.as_ptr().cast(), 512, std::ptr::null_mut()),
                INVALID_VALUE
            );
            ok((c.mem_free)(b));
            assert_eq!((c.mem_free)(b), INVALID_VALUE, "freed twice");
        }
    });
}

#[test]
fn pinned_host_memory_is_allocated_and_freed() {
    let c = init();
    on_own_thread(move || {
        bind(0);
        let before = live();
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: local out-parameters; the memory is written within its size.
        unsafe {
            ok((c.mem_host_alloc)(&mut p, 3 * MIB, 0));
            std::ptr::write_bytes(p.cast::<u8>(), 0xab, 3 * MIB);
            assert_eq!(live().pinned_allocations, before.pinned_allocations + 1);
            ok((c.mem_free_host)(p));
            assert_eq!((c.mem_free_host)(p), INVALID_VALUE);
        }
    });
}

struct Mapped {
    handle: u64,
    ptr: u64,
    size: usize,
}

/// Creates (or imports from `fd`) an allocation of `size` on device 0 and maps it; access is
/// granted when `access`.
fn map(size: usize, fd: Option<c_int>, access: bool) -> Mapped {
    let c = cuda();
    let mut handle = 0u64;
    let mut ptr = 0u64;
    // SAFETY: local out-parameters; the range is reserved before it is mapped.
    unsafe {
        match fd {
            None => ok((c.mem_create)(&mut handle, size, &Prop::device(0, true), 0)),
            Some(fd) => ok((c.mem_import)(&mut handle, fd as isize as *mut c_void, 1)),
        }
        ok((c.mem_address_reserve)(&mut ptr, size, 0, 0, 0));
        assert_eq!(ptr % (2 * MIB as u64), 0);
        ok((c.mem_map)(ptr, size, 0, handle, 0));
        if access {
            ok((c.mem_set_access)(ptr, size, &rw(0), 1));
        }
    }
    Mapped { handle, ptr, size }
}

fn unmap(m: &Mapped) {
    let c = cuda();
    // SAFETY: the mapping, reservation and handle are ours and idle.
    unsafe {
        ok((c.mem_unmap)(m.ptr, m.size));
        ok((c.mem_address_free)(m.ptr, m.size));
        ok((c.mem_release)(m.handle));
    }
}

#[test]
fn vmm_sizes_are_multiples_of_the_granularity() {
    let c = init();
    on_own_thread(move || {
        bind(0);
        let mut g = 0usize;
        let mut h = 0u64;
        let mut p = 0u64;
        // SAFETY: local out-parameters.
        unsafe {
            ok((c.granularity)(&mut g, &Prop::device(0, true), 1));
            assert_eq!(g, 2 * MIB);
            assert_eq!(
                (c.mem_create)(&mut h, MIB, &Prop::device(0, true), 0),
                INVALID_VALUE
            );
            assert_eq!(
                (c.mem_address_reserve)(&mut p, 3 * MIB, 0, 0, 0),
                INVALID_VALUE
            );
            assert_eq!(
                (c.mem_create)(&mut h, 2 * MIB, &Prop::device(7, true), 0),
                101
            );
        }
        let m = map(4 * MIB, None, false);
        // SAFETY: as above.
        unsafe {
            assert_eq!((c.mem_set_access)(m.ptr, MIB, &rw(0), 1), INVALID_VALUE);
            assert_eq!(
                (c.mem_map)(m.ptr, 4 * MIB, 0, m.handle, 0),
                INVALID_VALUE,
                "mapped twice"
            );
        }
        unmap(&m);
    });
}

#[test]
fn only_allocations_asking_for_posix_fds_export_them() {
    let c = init();
    on_own_thread(move || {
        bind(0);
        let mut h = 0u64;
        let mut fd: c_int = -1;
        // SAFETY: local out-parameters.
        unsafe {
            ok((c.mem_create)(&mut h, 2 * MIB, &Prop::device(0, false), 0));
            assert_eq!(
                (c.mem_export)((&mut fd as *mut c_int).cast(), h, 1, 0),
                INVALID_VALUE
            );
            ok((c.mem_release)(h));
            // A descriptor that is not the emulator's memory does not import.
            let file = std::fs::File::open("/proc/self/exe").unwrap();
            let raw = std::os::fd::AsRawFd::as_raw_fd(&file);
            assert_eq!(
                (c.mem_import)(&mut h, raw as isize as *mut c_void, 1),
                INVALID_VALUE
            );
        }
    });
}

#[test]
fn touching_memory_before_set_access_faults() {
    if child_role().as_deref() == Some("touch") {
        bind(0);
        let m = map(2 * MIB, None, false);
        println!("mapped, touching");
        // SAFETY: deliberately not: the page is mapped PROT_NONE and this read must fault.
        let v = unsafe { std::ptr::read_volatile(m.ptr as *const u8) };
        println!("read {v} without a fault");
        return;
    }
    let out = child("touching_memory_before_set_access_faults", "touch", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("mapped, touching"), "{stdout}");
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{stdout}");
    // With access granted the same read works.
    init();
    std::thread::spawn(|| {
        bind(0);
        let m = map(2 * MIB, None, true);
        // SAFETY: mapped and granted read-write.
        unsafe {
            std::ptr::write_volatile(m.ptr as *mut u8, 5);
            assert_eq!(std::ptr::read_volatile(m.ptr as *const u8), 5);
        }
        unmap(&m);
    })
    .join()
    .unwrap();
}

const RING: usize = 4 * MIB;

#[test]
fn another_process_maps_the_same_pages() {
    if child_role().as_deref() == Some("importer") {
        let fd: c_int = std::env::var("STOKER_EMU_TEST_FD")
            .unwrap()
            .parse()
            .unwrap();
        let c = init();
        bind(0);
        let m = map(RING, Some(fd), true);
        let mut got = vec![0u8; RING];
        // SAFETY: the mapping is RING bytes, granted read-write.
        unsafe {
            ok((c.memcpy_dtoh)(got.as_mut_ptr().cast(), m.ptr, RING));
            let bad = got
                .iter()
                .enumerate()
                .filter(|(i, &b)| b != pattern_byte(*i as u64, 7))
                .count();
            assert_eq!(bad, 0, "bytes differ from what the parent wrote");
            // Answer in the last page.
            let reply = vec![0x5au8; 4096];
            ok((c.memcpy_htod_async)(
                m.ptr + (RING - 4096) as u64,
                reply.as_ptr().cast(),
                4096,
                std::ptr::null_mut(),
            ));
            ok((c.ctx_synchronize)());
        }
        unmap(&m);
        println!("importer done");
        return;
    }
    // Alone in a process of its own, so the live counts are this test's.
    if ran_as_child("another_process_maps_the_same_pages", "exporter", &[]) {
        return;
    }
    let c = init();
    on_own_thread(move || {
        bind(0);
        let before = live();
        let m = map(RING, None, true);
        let data: Vec<u8> = (0..RING as u64).map(|i| pattern_byte(i, 7)).collect();
        let mut fd: c_int = -1;
        // SAFETY: the mapping is RING bytes; `fd` is a new descriptor we own.
        unsafe {
            ok((c.memcpy_htod_async)(
                m.ptr,
                data.as_ptr().cast(),
                RING,
                std::ptr::null_mut(),
            ));
            ok((c.ctx_synchronize)());
            ok((c.mem_export)(
                (&mut fd as *mut c_int).cast(),
                m.handle,
                1,
                0,
            ));
            // Let the child inherit it.
            assert_eq!(libc::fcntl(fd, libc::F_SETFD, 0), 0);
        }
        let out = child(
            "another_process_maps_the_same_pages",
            "importer",
            &[("STOKER_EMU_TEST_FD", &fd.to_string())],
        );
        child_ok(&out);
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(fd) };
        let mut tail = vec![0u8; 4096];
        // Released while still mapped: the mapping keeps the memory.
        // SAFETY: the mapping is live until unmapped below.
        unsafe {
            ok((c.mem_release)(m.handle));
            ok((c.memcpy_dtoh)(
                tail.as_mut_ptr().cast(),
                m.ptr + (RING - 4096) as u64,
                4096,
            ));
            assert!(
                tail.iter().all(|&b| b == 0x5a),
                "the child's write is not visible"
            );
            assert_eq!(live().vmm_allocations, before.vmm_allocations + 1);
            ok((c.mem_unmap)(m.ptr, RING));
            ok((c.mem_address_free)(m.ptr, RING));
        }
        let after = live();
        assert_eq!(after.vmm_allocations, before.vmm_allocations);
        assert_eq!(after.vmm_mappings, before.vmm_mappings);
        assert_eq!(after.reservations, before.reservations);
    });
}

#[test]
fn live_allocations_are_written_to_the_stats_file() {
    if child_role().as_deref() == Some("stats") {
        let c = init();
        bind(0);
        let dir = std::path::PathBuf::from(std::env::var("STOKER_EMU_STATS_DIR").unwrap());
        let file = dir.join(format!("{}.json", std::process::id()));
        let read = || std::fs::read_to_string(&file).unwrap();
        let mut p = 0u64;
        // SAFETY: a local out-parameter; the allocation is freed.
        unsafe { ok((c.mem_alloc)(&mut p, 3 * 4096)) };
        let text = read();
        assert!(text.contains("\"device_allocations\": 1,"), "{text}");
        assert!(text.contains("\"device_bytes\": 12288,"), "{text}");
        // Uploads counted by their source's memory.
        let (mut s, mut pinned) = (std::ptr::null_mut(), std::ptr::null_mut());
        let pageable = [1u8; 16];
        // SAFETY: local out-parameters; `p` holds 16 bytes, `pinned` is freed.
        unsafe {
            ok((c.stream_create)(&mut s, 1));
            ok((c.mem_alloc_host)(&mut pinned, 16));
            ok((c.memcpy_htod_async)(p, pageable.as_ptr().cast(), 16, s));
            ok((c.memcpy_htod_async)(p, pinned, 16, s));
            ok((c.memcpy_htod_async)(p, pinned, 16, s));
            ok((c.stream_synchronize)(s));
            ok((c.mem_free_host)(pinned));
            ok((c.stream_destroy)(s));
        }
        let text = read();
        assert!(text.contains("\"async_uploads_pageable\": 1,"), "{text}");
        assert!(text.contains("\"async_uploads_pinned\": 2,"), "{text}");
        // Each device's primary context flags, as last set (none here).
        assert!(text.contains("\"primary_ctx_flags\": [0, 0"), "{text}");
        let m = map(2 * MIB, None, true);
        assert!(read().contains("\"vmm_mappings\": 1,"), "{}", read());
        unmap(&m);
        // SAFETY: ours, freed once.
        unsafe { ok((c.mem_free)(p)) };
        let text = read();
        for key in [
            "device_allocations",
            "vmm_allocations",
            "vmm_mappings",
            "reservations",
        ] {
            assert!(text.contains(&format!("\"{key}\": 0")), "{key}: {text}");
        }
        return;
    }
    let dir = std::env::temp_dir().join(format!("stoker-emu-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = child(
        "live_allocations_are_written_to_the_stats_file",
        "stats",
        &[("STOKER_EMU_STATS_DIR", dir.to_str().unwrap())],
    );
    std::fs::remove_dir_all(&dir).unwrap();
    child_ok(&out);
}
