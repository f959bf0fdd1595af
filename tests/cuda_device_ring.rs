//! The Rust client's side of device rings, on the emulated GPU, against a daemon stand-in that
//! exports a real `DeviceRing` (VMM allocation, POSIX fd over SCM_RIGHTS) beside the host
//! memfd: the client imports and maps it on the device it attached on, refuses a ring whose
//! size differs from its own plan, reads the images back, and sends RELEASE only after the
//! event it recorded on the consumer's stream has completed, without blocking the thread that
//! dropped the batch. Every stream operation is delayed (`STOKER_EMU_OP_DELAY_US`), so a
//! RELEASE sent before the consumer's work finished would be seen.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use stoker_testkit::emulator;

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stoker::protocol::{Attached, Message, Ready, Release, MAX_MESSAGE_BYTES};
use stoker::socket::SeqPacketListener;
use stoker::VmmPlan;
use stoker::{
    AttachOptions, Client, ClientError, ConsumerStream, ImageMemory, MemfdRing, PipelineSpec,
};
use stoker_nvidia::cuda::vmm::{ring_granularity, DeviceRing};
use stoker_nvidia::cuda::{self, Device, Event, GpuUuid};

/// Every operation on a stream the program created waits this long first.
const DELAY_US: u64 = 300_000;

/// The emulator for this process (each stream operation delayed), and a temp dir holding the
/// path of the stand-in daemon's socket.
fn setup() -> (tempfile::TempDir, PathBuf) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("STOKER_EMU_OP_DELAY_US", DELAY_US.to_string()));
    emulator::use_emulator();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s.sock");
    (dir, socket)
}

fn device(i: usize) -> Device {
    Device::open(emulator::UUIDS[i].parse::<GpuUuid>().unwrap()).unwrap()
}

/// What the stand-in announces and what it wants to see.
struct Script {
    /// Added to the true image ring size in ATTACHED (0: honest).
    size_error: u64,
    /// The event the client's consumer recorded after its work, sent once the batch is handed
    /// out; at RELEASE it must have completed.
    consumer_done: Option<mpsc::Receiver<Event>>,
    /// Where each message received goes, as it arrives.
    received: mpsc::Sender<Message>,
}

/// The daemon side: accepts one client on `path`, expects an attach on emulated GPU 1, makes a
/// 2-slot device ring for `spec`, fills slot 1's images with `byte` (and labels 10..), sends
/// READY (generation 7), and passes on the messages received until DETACH or a hang-up.
fn stand_in(path: &Path, spec: PipelineSpec, script: Script) -> std::thread::JoinHandle<()> {
    let listener = SeqPacketListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let conn = listener.accept().unwrap();
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        let r = conn.recv(&mut buf).unwrap().unwrap();
        let Message::Attach(a) = Message::decode(&buf[..r.len]).unwrap() else {
            panic!("expected ATTACH")
        };
        // The client named "cuda:1"; the wire carries the UUID.
        assert_eq!(a.device.to_string(), emulator::UUIDS[1]);
        let dev = device(1);
        let plan = VmmPlan::new(&spec, 2, ring_granularity(&dev).unwrap()).unwrap();
        let layout = plan.layout;
        let host = MemfdRing::create(c"stand-in", layout).unwrap();
        let ring = DeviceRing::create(&dev, plan.bytes).unwrap();
        let s = layout.slot;
        let images = vec![0xA5u8; 3 * s.image_bytes];
        let stream = dev.stream().unwrap();
        // SAFETY: slot 1's images lie inside the mapped ring; the copy is synchronised below.
        unsafe {
            let at = ring.ptr() + (layout.image_offset(1) + s.images) as u64;
            cuda::result::memcpy_htod_async(cuda::driver().unwrap(), at, &images, stream.raw())
                .unwrap();
            let labels = host.host_ptr(1).add(s.labels).cast::<i64>();
            for i in 0..3 {
                labels.add(i).write(10 + i as i64);
            }
        }
        stream.synchronize().unwrap();
        let attached = Message::Attached(Attached {
            slots: 2,
            slot_bytes: s.slot_bytes as u64,
            ring_bytes: layout.ring_bytes as u64,
            steps_per_epoch: 5,
            dataset_len: 19,
            classes: 3,
            ranks_attached: 1,
            created_job: true,
            daemon_version: "stand-in".into(),
            image_memory: ImageMemory::Device,
            image_ring_bytes: layout.image_ring_bytes as u64 + script.size_error,
            ..Attached::default()
        });
        let vmm_fd = ring.export_fd().unwrap();
        conn.send(&attached.encode().unwrap(), &[host.as_fd(), vmm_fd.as_fd()])
            .unwrap();
        drop(vmm_fd);
        let ready = Message::Ready(Ready {
            slot: 1,
            generation: 7,
            epoch: 0,
            step: 0,
            n: 3,
        });
        let _ = conn.send(&ready.encode().unwrap(), &[]);
        let done = script.consumer_done.map(|rx| rx.recv().unwrap());
        while let Ok(Some(r)) = conn.recv(&mut buf) {
            let m = Message::decode(&buf[..r.len]).unwrap();
            if matches!(m, Message::Release(_)) {
                if let Some(done) = &done {
                    assert!(
                        done.is_complete().unwrap(),
                        "RELEASE arrived before the consumer's work completed"
                    );
                }
            }
            let detach = matches!(m, Message::Detach);
            let _ = script.received.send(m);
            if detach {
                break;
            }
        }
    })
}

fn options(spec: PipelineSpec) -> AttachOptions {
    let mut o = AttachOptions::new("job-d", "/data", spec);
    o.device = "cuda:1".parse().unwrap();
    o
}

#[test]
fn a_device_ring_is_mapped_and_released_after_the_consumers_event() {
    let (_dir, path) = setup();
    let spec = PipelineSpec::train(4, 8);
    let (tx, rx) = mpsc::channel();
    let (received, messages) = mpsc::channel();
    let daemon = stand_in(
        &path,
        spec.clone(),
        Script {
            size_error: 0,
            consumer_done: Some(rx),
            received,
        },
    );
    // A framework's thread has GPU 0 current; attaching on GPU 1 must leave it so.
    let _gpu0 = device(0);
    let current = || cuda::result::ctx_get_current(cuda::driver().unwrap()).unwrap();
    let before = current();
    assert!(!before.is_null());
    let mut client = Client::attach(&path, options(spec)).unwrap();
    assert_eq!(
        current(),
        before,
        "attach changed the thread's current context"
    );
    assert_eq!(client.image_memory(), ImageMemory::Device);
    assert_eq!(client.device_ordinal(), Some(1));
    assert_eq!(
        client.device_uuid().unwrap().to_string(),
        emulator::UUIDS[1]
    );
    let batch = client.next_batch().unwrap().unwrap();
    assert_eq!(batch.image_memory(), ImageMemory::Device);
    assert_eq!(batch.labels(), &[10, 11, 12]);
    let slice = batch.device_images().unwrap();
    assert_eq!(slice.ordinal, 1);
    assert_eq!(slice.bytes, 3 * 8 * 8 * 3 * 4);
    assert_eq!(slice.ptr % 256, 0);
    let mut host = vec![0u8; batch.images_len()];
    batch.copy_images_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&b| b == 0xA5));
    assert_eq!(
        current(),
        before,
        "the copy changed the thread's current context"
    );
    let mut short = vec![0u8; 5];
    assert!(matches!(
        batch.copy_images_to_host(&mut short),
        Err(ClientError::Invalid(_))
    ));

    // The consumer: work on its own (delayed) stream that writes the slot, then the batch is
    // dropped with that stream recorded. The drop must not wait for the GPU.
    let dev = device(1);
    let stream = dev.stream().unwrap();
    // From pinned memory, so the copy stays queued on the delayed stream (from pageable memory
    // the driver may run it before returning).
    let mut zeros = cuda::PinnedHostBuffer::new(&dev, slice.bytes).unwrap();
    zeros.as_mut_slice().fill(0);
    // SAFETY: the slot's images are mapped in this process while `batch` holds the lease, and
    // the release waits for this copy (the point of the test); `zeros` outlives the stream's
    // work (synchronised before the end of the test).
    unsafe {
        cuda::result::memcpy_htod_async(
            cuda::driver().unwrap(),
            slice.ptr,
            zeros.as_slice(),
            stream.raw(),
        )
        .unwrap()
    };
    let done = dev.event(false).unwrap();
    done.record(&stream).unwrap();
    tx.send(done).unwrap();
    batch.record_stream(ConsumerStream(stream.raw() as usize));
    let bound = current();
    let t = Instant::now();
    drop(batch);
    let dropped_in = t.elapsed();
    assert_eq!(
        current(),
        bound,
        "the release changed the thread's current context"
    );
    assert!(
        dropped_in < Duration::from_micros(DELAY_US / 2),
        "dropping a device batch blocked for {dropped_in:?}"
    );
    // The stand-in checks, when RELEASE arrives, that the consumer's work had completed.
    let first = messages.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(
        first,
        Message::Release(Release {
            slot: 1,
            generation: 7
        })
    );
    drop(client);
    daemon.join().unwrap();
    assert_eq!(
        messages.try_iter().collect::<Vec<_>>(),
        vec![Message::Detach]
    );
    drop(stream);
}

#[test]
fn a_device_ring_of_another_size_is_refused_with_the_sizes() {
    let (_dir, path) = setup();
    let spec = PipelineSpec::train(4, 8);
    let daemon = stand_in(
        &path,
        spec.clone(),
        Script {
            size_error: 2 << 20,
            consumer_done: None,
            received: mpsc::channel().0,
        },
    );
    let err = Client::attach(&path, options(spec)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ClientError::Device(_)), "{text}");
    assert!(text.contains(emulator::UUIDS[1]), "{text}");
    assert!(text.contains("ring size"), "{text}");
    daemon.join().unwrap();
}

#[test]
fn a_device_that_is_not_there_is_named() {
    let _ = setup();
    let opts = {
        let mut o = options(PipelineSpec::train(2, 8));
        o.device = "cuda:7".parse().unwrap();
        o
    };
    let err = Client::attach(Path::new("/nonexistent/s.sock"), opts).unwrap_err();
    assert_eq!(
        err.to_string(),
        "device cuda:7: only 2 CUDA device(s) visible"
    );
}

/// The same through the C ABI: the images tensor is kDLCUDA with the client's ordinal and the
/// slot's device address, the copy-to-host call reads the bytes, and the slot goes back only
/// after the stream named with `stoker_batch_record_stream` finished its work, once the batch
/// handle is released and the tensor deleted.
#[test]
fn the_c_abi_hands_out_cuda_tensors_and_fences_their_release() {
    use stoker::capi::*;
    use stoker::dlpack::{DLManagedTensorVersioned, KDL_CUDA};
    let (_dir, path) = setup();
    let (tx, rx) = mpsc::channel();
    let (received, messages) = mpsc::channel();
    let daemon = stand_in(
        &path,
        PipelineSpec::train(4, 8),
        Script {
            size_error: 0,
            consumer_done: Some(rx),
            received,
        },
    );
    let socket = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let spec = serde_json::to_string(&PipelineSpec::train(4, 8)).unwrap();
    let spec = std::ffi::CString::new(spec).unwrap();
    let o = stoker_attach_options {
        socket: socket.as_ptr(),
        job: c"job-d".as_ptr(),
        dataset: c"/data".as_ptr(),
        device: c"cuda:1".as_ptr(),
        spec_json: spec.as_ptr(),
        ..Default::default()
    };
    let mut client = std::ptr::null_mut();
    let mut batch = std::ptr::null_mut();
    let mut info = stoker_attach_info {
        size: std::mem::size_of::<stoker_attach_info>(),
        ..Default::default()
    };
    let mut header = stoker_batch_header::default();
    let mut tensor: *mut DLManagedTensorVersioned = std::ptr::null_mut();
    // SAFETY: every pointer is live and writable; handles are used while live, released once.
    unsafe {
        assert_eq!(stoker_attach(&o, &mut client), stoker_result::STOKER_OK);
        assert_eq!(
            stoker_client_info(client, &mut info),
            stoker_result::STOKER_OK
        );
        assert_eq!((info.image_memory, info.device_id), (1, 1));
        assert_eq!(stoker_next(client, &mut batch), stoker_result::STOKER_OK);
        assert_eq!(
            stoker_batch_info(batch, &mut header),
            stoker_result::STOKER_OK
        );
        assert_eq!(
            (header.images_device_type, header.images_device_id),
            (KDL_CUDA, 1)
        );
        assert_eq!(header.images_bytes, 3 * 8 * 8 * 3 * 4);
        assert_eq!(
            stoker_batch_images(batch, &mut tensor),
            stoker_result::STOKER_OK
        );
        let t = &(*tensor).dl_tensor;
        assert_eq!((t.device.device_type, t.device.device_id), (KDL_CUDA, 1));
        assert_eq!(t.data as u64, header.images);
        let mut host = vec![0u8; header.images_bytes as usize];
        let r = stoker_batch_copy_images_to_host(batch, host.as_mut_ptr().cast(), host.len());
        assert_eq!(r, stoker_result::STOKER_OK);
        assert!(host.iter().all(|&b| b == 0xA5));
        let r = stoker_batch_copy_images_to_host(batch, host.as_mut_ptr().cast(), 7);
        assert_eq!(r, stoker_result::STOKER_ERR_INVALID_ARGUMENT);

        let dev = device(1);
        let stream = dev.stream().unwrap();
        // Pinned, so the copy stays queued on the delayed stream.
        let mut zeros = cuda::PinnedHostBuffer::new(&dev, header.images_bytes as usize).unwrap();
        zeros.as_mut_slice().fill(0);
        cuda::result::memcpy_htod_async(
            cuda::driver().unwrap(),
            header.images,
            zeros.as_slice(),
            stream.raw(),
        )
        .unwrap();
        let done = dev.event(false).unwrap();
        done.record(&stream).unwrap();
        tx.send(done).unwrap();
        let r = stoker_batch_record_stream(batch, stream.raw() as usize);
        assert_eq!(r, stoker_result::STOKER_OK);
        stoker_batch_release(batch);
        // The tensor still holds the lease: nothing is released yet.
        assert!(messages.recv_timeout(Duration::from_millis(100)).is_err());
        stoker_dlpack_delete(tensor);
        let first = messages.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(matches!(first, Message::Release(_)), "{first:?}");
        stoker_detach(client);
        drop(stream);
    }
    daemon.join().unwrap();
}
