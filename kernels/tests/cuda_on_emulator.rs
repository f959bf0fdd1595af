//! The CUDA tests that stop at "no GPU" in `cuda_without_gpu.rs`, run on the emulated GPU:
//! `probe()` lists the configured devices; augment.cu compiled by NVRTC and launched through
//! `cuLaunchKernel` equals `reference::augment_reference` for every dtype and layout; a VMM
//! ring made and filled in one process is read by a real child process. What this proves and
//! what only a GPU proves: docs/cuda.md.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use stoker_testkit::emulator;

use std::os::fd::{FromRawFd, OwnedFd};

use emulator::*;
use stoker_kernels::augment::{
    dtype_code, layout_code, pattern_byte, AugmentBatch, AugmentKernels, AugmentSample,
};
use stoker_kernels::reference::{
    augment_reference, test_image, tolerance_units, CropBox, OutputParams,
};
use stoker_nvidia::cuda::vmm::{ring_granularity, DeviceRing};
use stoker_nvidia::cuda::{self, Device, GpuUuid};
use stoker_wire::spec::{DType, Layout, PipelineSpec};
use stoker_wire::VmmPlan;

fn device(i: usize) -> Device {
    use_emulator();
    Device::open(UUIDS[i].parse().unwrap()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn probe_lists_the_emulated_devices_by_uuid() {
    use_emulator();
    let info = cuda::probe().unwrap_or_else(|e| panic!("{e}"));
    let uuids: Vec<String> = info.devices.iter().map(|d| d.uuid.to_string()).collect();
    assert_eq!(uuids, UUIDS);
    for d in &info.devices {
        assert_eq!(d.compute_capability, (9, 0));
        assert_eq!(d.total_memory, 4096 << 20);
        assert!(d.posix_fd_sharing);
        assert!(d.name.contains("Emulated"), "{}", d.name);
    }
    let driver = stoker_nvidia::emulator::emulated_driver().expect("the emulator is recognised");
    assert!(
        driver.ends_with("libstoker_emu_cuda.so"),
        "{}",
        driver.display()
    );
    let missing: GpuUuid = "GPU-00000000-0000-4000-8000-00000000dead".parse().unwrap();
    assert!(matches!(
        Device::open(missing),
        Err(cuda::CudaError::NoSuchDevice(..))
    ));
}

#[test]
fn augment_through_cu_launch_kernel_matches_the_reference() {
    let Some(nvrtc) = nvrtc("augment_through_cu_launch_kernel_matches_the_reference") else {
        return;
    };
    let dev = device(0);
    let kernels = AugmentKernels::load(&dev, &nvrtc, None).unwrap_or_else(|e| panic!("{e}"));
    let stream = dev.stream().unwrap();
    let images = [test_image(97, 61, 1), test_image(40, 75, 2)];
    let mut sources = Vec::new();
    for img in &images {
        let buf = dev.alloc(img.data.len()).unwrap();
        stream.copy_to_device(&buf, 0, &img.data).unwrap();
        sources.push(buf);
    }
    // (image, crop, flip): downscale, upscale, fractional, flipped, touching the edges.
    let cases = [
        (0usize, CropBox::new(0.0, 0.0, 97.0, 61.0), false),
        (0, CropBox::new(10.25, 3.5, 60.5, 40.75), true),
        (1, CropBox::new(2.0, 3.0, 9.0, 7.0), false),
        (1, CropBox::new(0.7, 30.3, 39.3, 44.7), true),
    ];
    let (out_h, out_w) = (23u32, 31u32);
    let mean = [0.485f32, 0.456, 0.406];
    let std = [0.229f32, 0.224, 0.225];
    for dtype in [DType::U8, DType::F16, DType::Bf16, DType::F32] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            for clamp in [false, true] {
                let samples: Vec<AugmentSample> = cases
                    .iter()
                    .map(|&(i, crop, flip)| {
                        let img = &images[i];
                        let pitch = u64::from(img.width) * 3;
                        AugmentSample::new(
                            sources[i].ptr(),
                            pitch,
                            img.width,
                            img.height,
                            crop,
                            flip,
                        )
                    })
                    .collect();
                let sample_buf = dev.alloc(64 * samples.len()).unwrap();
                stream
                    .copy_to_device(&sample_buf, 0, AugmentSample::as_bytes(&samples))
                    .unwrap();
                let image_bytes = (out_h * out_w * 3) as usize * dtype.size();
                let out = dev.alloc(image_bytes * cases.len()).unwrap();
                let batch = AugmentBatch {
                    dst: out.ptr(),
                    samples: sample_buf.ptr(),
                    image_bytes: image_bytes as u64,
                    n: cases.len() as u32,
                    out_w,
                    out_h,
                    dtype: dtype_code(dtype),
                    layout: layout_code(layout),
                    clamp_to_crop: u32::from(clamp),
                    mean,
                    std,
                };
                // SAFETY: every address in `batch` is a live device buffer of the size the
                // kernel touches; all are kept until the stream is synchronised below.
                unsafe { kernels.augment(&stream, &batch) }.unwrap();
                stream.synchronize().unwrap();
                let mut got = vec![0u8; image_bytes * cases.len()];
                out.read(&mut got).unwrap();
                let params = OutputParams {
                    dtype,
                    layout,
                    mean,
                    std,
                    clamp_to_crop: clamp,
                };
                for (k, &(i, crop, flip)) in cases.iter().enumerate() {
                    let want = augment_reference(&images[i], crop, flip, out_h, out_w, &params);
                    let part = &got[k * image_bytes..(k + 1) * image_bytes];
                    let worst = tolerance_units(part, &want, dtype);
                    assert!(
                        worst <= 1.0,
                        "{dtype:?} {layout:?} clamp {clamp} sample {k}: {worst} tolerances off"
                    );
                }
            }
        }
    }
}

const SEED: u32 = 0x5eed;

fn ring_plan(dev: &Device) -> VmmPlan {
    let spec = PipelineSpec::train(8, 64);
    VmmPlan::new(&spec, 3, ring_granularity(dev).unwrap()).unwrap()
}

/// Counts bytes of the ring that differ from the pattern with the kernel, and reads them all
/// back to the host as well.
fn check_ring(dev: &Device, kernels: &AugmentKernels, ring: &DeviceRing) -> (u32, usize) {
    let stream = dev.stream().unwrap();
    let counter = dev.alloc(4).unwrap();
    stream.copy_to_device(&counter, 0, &[0; 4]).unwrap();
    // SAFETY: the ring and the counter are live device memory until the sync below.
    unsafe {
        kernels
            .check_pattern_raw(&stream, ring.ptr(), ring.len() as u64, SEED, counter.ptr())
            .unwrap();
    }
    stream.synchronize().unwrap();
    let mut n = [0u8; 4];
    counter.read(&mut n).unwrap();
    let mut bytes = vec![0u8; ring.len()];
    // SAFETY: the ring is `len` bytes of mapped device memory.
    unsafe { cuda::result::memcpy_dtoh(cuda::driver().unwrap(), &mut bytes, ring.ptr()) }.unwrap();
    let wrong = bytes
        .iter()
        .enumerate()
        .filter(|(i, &b)| b != pattern_byte(*i as u64, SEED))
        .count();
    (u32::from_ne_bytes(n), wrong)
}

#[test]
fn a_vmm_ring_written_here_is_read_by_a_child_process() {
    let test = "a_vmm_ring_written_here_is_read_by_a_child_process";
    let Some(nvrtc) = nvrtc(test) else { return };
    let dev = device(1);
    let kernels = AugmentKernels::load(&dev, &nvrtc, None).unwrap();
    let plan = ring_plan(&dev);
    if child_role().as_deref() == Some("reader") {
        let fd: i32 = std::env::var("STOKER_TEST_RING_FD")
            .unwrap()
            .parse()
            .unwrap();
        // SAFETY: the parent passed us this descriptor; nothing else owns it here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ring = DeviceRing::import(&dev, &fd, plan.bytes).unwrap_or_else(|e| panic!("{e}"));
        drop(fd);
        assert_eq!(check_ring(&dev, &kernels, &ring), (0, 0));
        println!("reader: {} bytes as written", ring.len());
        return;
    }
    let ring = DeviceRing::create(&dev, plan.bytes).unwrap();
    let stream = dev.stream().unwrap();
    // SAFETY: the ring is live until the end of the test; the stream is synchronised.
    unsafe { kernels.fill_pattern_raw(&stream, ring.ptr(), ring.len() as u64, SEED) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(check_ring(&dev, &kernels, &ring), (0, 0));
    let fd = ring.export_fd().unwrap();
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: clears close-on-exec on our own descriptor so the child inherits it.
    assert_eq!(unsafe { libc::fcntl(raw, libc::F_SETFD, 0) }, 0);
    let out = run_child(test, "reader", &[("STOKER_TEST_RING_FD", raw.to_string())]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("bytes as written"));
}

/// CPU-seconds this thread has used.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Waiting for the device costs no core (issue: "no spinning waits"): a stream's and an
/// event's `synchronize` on 400 ms of (delayed) device work sleep instead of busy-waiting,
/// which the emulated driver does, as NVIDIA documents, unless told to block.
#[test]
fn waiting_for_the_device_sleeps_instead_of_spinning() {
    let test = "waiting_for_the_device_sleeps_instead_of_spinning";
    if child_role().as_deref() != Some("waiter") {
        let out = run_child(
            test,
            "waiter",
            &[("STOKER_EMU_OP_DELAY_US", "400000".into())],
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("waited: stream, event"), "{text}");
        return;
    }
    let dev = device(0);
    let stream = dev.stream().unwrap();
    let buf = dev.alloc(4096).unwrap();
    let event = dev.event(false).unwrap();
    let waits: [(&str, &dyn Fn()); 2] = [
        ("stream", &|| stream.synchronize().unwrap()),
        ("event", &|| {
            event.record(&stream).unwrap();
            event.synchronize().unwrap();
        }),
    ];
    for (what, wait) in waits {
        stream.copy_to_device(&buf, 0, &[7u8; 4096]).unwrap();
        let (cpu, at) = (thread_cpu_s(), std::time::Instant::now());
        wait();
        let (cpu, wall) = (thread_cpu_s() - cpu, at.elapsed().as_secs_f64());
        assert!(
            wall >= 0.3,
            "{what}: returned after {wall:.2} s, before the work ran"
        );
        assert!(
            cpu < 0.1 * wall,
            "{what} synchronize spun: {cpu:.2} CPU-s in {wall:.2} s of waiting"
        );
    }
    println!("waited: stream, event");
}

/// stoker's streams sit at their device's least priority, so a training job's kernels on any
/// higher-priority stream go first.
#[test]
fn streams_are_made_at_the_least_priority() {
    let dev = device(0);
    let (least, greatest) = dev.stream_priority_range().unwrap();
    assert!(greatest < least, "[{greatest}, {least}]");
    assert_eq!(dev.stream().unwrap().priority().unwrap(), least);
}
