//! Attaching, what the daemon said at attach, the measured data stall, and detaching.

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::*;
use crate::client::{AttachOptions, Client};
use crate::protocol::{Device, EpochOffset, Position};
use crate::ring::ImageMemory;
use crate::spec::PipelineSpec;

/// Attach parameters. Initialise with `stoker_attach_options_init`, then set fields.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct stoker_attach_options {
    /// `sizeof(stoker_attach_options)` as the caller was compiled.
    pub size: usize,
    /// Daemon socket path; NULL: `$STOKER_SOCKET`; else `/run/stoker/stoker.sock` if a daemon
    /// answers there; else this user's own, `$XDG_RUNTIME_DIR/stoker/stoker.sock` or
    /// `/tmp/stoker-<uid>/stoker.sock`.
    pub socket: *const c_char,
    /// Job key shared by every rank of the job; NULL (world_size 1 only): a key unique to this
    /// process and attach.
    pub job: *const c_char,
    /// This rank, below `world_size`.
    pub rank: u32,
    /// 0 is taken as 1.
    pub world_size: u32,
    /// Registered dataset name or path. Required.
    pub dataset: *const c_char,
    /// The pipeline spec as JSON (see docs/c-abi.md). Required.
    pub spec_json: *const c_char,
    /// The job's seed for shuffling and augmentation; every rank passes the same.
    pub seed: u64,
    /// First batch to receive: `start_step` of `start_epoch`.
    pub start_epoch: u64,
    /// See `start_epoch`.
    pub start_step: u64,
    /// `"cpu"`, `"cuda"`, `"cuda:N"` (ordinal `N` under this process's
    /// `CUDA_VISIBLE_DEVICES`) or a GPU UUID; NULL: `"cpu"`. Any other name is
    /// `STOKER_ERR_DEVICE`, naming it.
    pub device: *const c_char,
    /// Elastic resume (docs/multi-host.md): epoch `offset_epoch` serves only what follows the
    /// first `offset_consumed` samples of its permutation, over this attach's world size.
    /// `offset_consumed` 0: no offset. Every rank of a job passes the same pair.
    pub offset_epoch: u64,
    /// See `offset_epoch`.
    pub offset_consumed: u64,
}

impl Default for stoker_attach_options {
    fn default() -> Self {
        stoker_attach_options {
            size: std::mem::size_of::<stoker_attach_options>(),
            socket: std::ptr::null(),
            job: std::ptr::null(),
            rank: 0,
            world_size: 1,
            dataset: std::ptr::null(),
            spec_json: std::ptr::null(),
            seed: 0,
            start_epoch: 0,
            start_step: 0,
            device: std::ptr::null(),
            offset_epoch: 0,
            offset_consumed: 0,
        }
    }
}

/// What the daemon said when the client attached.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct stoker_attach_info {
    /// Set by the caller to `sizeof(stoker_attach_info)`; only that many bytes are written.
    pub size: usize,
    /// Slots in this rank's ring (how many batches it may hold at once).
    pub slots: u32,
    /// Samples per batch (the spec's batch size).
    pub batch_size: u32,
    /// Batches per epoch for this rank.
    pub steps_per_epoch: u64,
    /// Samples in the dataset.
    pub dataset_len: u64,
    /// Classes in the dataset; labels are `0..classes`.
    pub classes: u64,
    /// Output image `(height, width)`; 3 channels.
    pub height: u32,
    /// See `height`.
    pub width: u32,
    /// Where a client would resume: the (epoch, step) after the last batch received.
    pub next_epoch: u64,
    /// See `next_epoch`.
    pub next_step: u64,
    /// The same place as an elastic resume point: samples of epoch `next_epoch`'s
    /// permutation every rank together consumed before it (pass it as `offset_consumed`, with
    /// `offset_epoch = next_epoch` and start (next_epoch, 0), to resume at any world size).
    pub next_consumed: u64,
    /// Batches per rank of the attach's offset epoch (`steps_per_epoch` without an offset).
    pub offset_epoch_steps: u64,
    /// Where the images are: 0 host memory (the ring's memfd), 1 the client GPU's memory (the
    /// daemon's CUDA backend: the images tensor is on kDLCUDA).
    pub image_memory: u32,
    /// For device images, the CUDA device ordinal as this process numbers devices (under its
    /// `CUDA_VISIBLE_DEVICES`); -1 for host images.
    pub device_id: i32,
    /// Files the dataset's index left out (of no format stoker decodes); the first few are
    /// named by `stoker_client_skipped_name`.
    pub skipped: u64,
}

/// Where the training loop's time went since the attach (the data stall), as the client
/// measured it: time blocked in `stoker_next` and time between its calls.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct stoker_stall_info {
    /// Set by the caller to `sizeof(stoker_stall_info)`; only that many bytes are written.
    pub size: usize,
    /// Seconds spent inside `stoker_next` waiting for a batch.
    pub wait_s: f64,
    /// Seconds spent between a `stoker_next` returning and the following call.
    pub compute_s: f64,
    /// `wait_s / (wait_s + compute_s)`, 0 before anything was measured.
    pub wait_fraction: f64,
    /// Batches received.
    pub batches: u64,
    /// Samples of those batches the daemon replaced (unreadable or corrupt).
    pub bad_samples: u64,
}
/// Fills `*options` with the defaults (rank 0 of 1, seed 0, from the start, cpu) and sets its
/// `size`.
///
/// # Safety
/// `options` is NULL or points to a writable `stoker_attach_options`.
#[no_mangle]
pub unsafe extern "C" fn stoker_attach_options_init(
    options: *mut stoker_attach_options,
) -> stoker_result {
    entry(|| {
        check_out(options, "options")?;
        // SAFETY: non-NULL and, by the caller's promise, a writable options struct.
        unsafe { options.write(stoker_attach_options::default()) };
        Ok(STOKER_OK)
    })
}

/// Connects to the daemon and attaches; on success `*out` is a client to pass to
/// `stoker_detach` eventually.
///
/// # Safety
/// `options` points to a `stoker_attach_options` of at least its `size` bytes, whose strings
/// are NULL or NUL-terminated; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_attach(
    options: *const stoker_attach_options,
    out: *mut *mut stoker_client,
) -> stoker_result {
    entry(|| {
        check_out(out, "out")?;
        // SAFETY: `out` is non-NULL and writable by the caller's promise.
        unsafe { out.write(std::ptr::null_mut()) };
        if options.is_null() {
            return Err(Failure::invalid("options is NULL"));
        }
        // SAFETY: non-NULL, valid for its size by the caller's promise.
        let o = unsafe { read_versioned(options, "stoker_attach_options") }?;
        // SAFETY: each string is NULL or NUL-terminated by the caller's promise.
        let (socket, job, dataset, spec_json, device) = unsafe {
            (
                opt_str(o.socket, "socket")?,
                opt_str(o.job, "job")?,
                opt_str(o.dataset, "dataset")?,
                opt_str(o.spec_json, "spec_json")?,
                opt_str(o.device, "device")?,
            )
        };
        let dataset = dataset.ok_or_else(|| Failure::invalid("dataset is NULL"))?;
        let spec_json = spec_json.ok_or_else(|| Failure::invalid("spec_json is NULL"))?;
        let spec: PipelineSpec = serde_json::from_str(&spec_json).map_err(|e| Failure {
            code: STOKER_ERR_SPEC,
            message: format!("spec_json is not a pipeline spec: {e}"),
        })?;
        let world_size = o.world_size.max(1);
        let job = match job {
            Some(job) => job,
            None if world_size == 1 => format!(
                "anonymous-{}-{}",
                std::process::id(),
                ANONYMOUS_JOBS.fetch_add(1, Ordering::Relaxed)
            ),
            None => {
                return Err(Failure::invalid(
                    "job is NULL: ranks of a job of world_size > 1 must share a job key",
                ))
            }
        };
        let mut opts = AttachOptions::new(job, dataset, spec);
        opts.rank = o.rank;
        opts.world_size = world_size;
        opts.device = match device {
            Some(name) => name
                .parse()
                .map_err(|e: crate::protocol::UnknownDevice| Failure {
                    code: STOKER_ERR_DEVICE,
                    message: e.to_string(),
                })?,
            None => Device::Cpu,
        };
        opts.seed = o.seed;
        opts.start = Position::at(o.start_epoch, o.start_step);
        opts.offset = (o.offset_consumed > 0).then_some(EpochOffset {
            epoch: o.offset_epoch,
            consumed: o.offset_consumed,
        });
        let client = match socket {
            Some(socket) => Client::attach(Path::new(&socket), opts)?,
            None => Client::attach_default(opts)?,
        };
        let handle = Box::new(stoker_client {
            client: Mutex::new(client),
        });
        // SAFETY: `out` is non-NULL and writable (checked above).
        unsafe { out.write(Box::into_raw(handle)) };
        Ok(STOKER_OK)
    })
}

/// Fills `*info` (up to `info->size` bytes) with what the daemon said at attach and where the
/// client would resume now.
///
/// # Safety
/// `client` is a live client; `info` points to a `stoker_attach_info` with `size` set.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_info(
    client: *mut stoker_client,
    info: *mut stoker_attach_info,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let c = unsafe { handle(client, "client") }?;
        check_out(info, "info")?;
        let guard = lock(c)?;
        let a = guard.attached();
        let spec = guard.spec();
        let (height, width) = spec.crop.output_size();
        let position = guard.position();
        let value = stoker_attach_info {
            size: 0,
            slots: a.slots,
            batch_size: spec.batch_size,
            steps_per_epoch: a.steps_per_epoch,
            dataset_len: a.dataset_len,
            classes: a.classes,
            height,
            width,
            next_epoch: position.epoch,
            next_step: position.step,
            next_consumed: guard.checkpoint().consumed,
            offset_epoch_steps: guard
                .offset()
                .map_or(a.steps_per_epoch, |o| guard.steps_in(o.epoch)),
            image_memory: match guard.image_memory() {
                ImageMemory::Host => 0,
                ImageMemory::Device => 1,
            },
            device_id: guard.device_ordinal().unwrap_or(-1),
            skipped: a.skipped,
        };
        // SAFETY: non-NULL, valid for its size by the caller's promise.
        unsafe { write_versioned(info, value, "stoker_attach_info") }?;
        Ok(STOKER_OK)
    })
}

/// Copies the name of class `index` (label order; `stoker_attach_info.classes` of them) into
/// `buf` as a NUL-terminated UTF-8 string and sets `*name_len` to its length in bytes (without
/// the NUL). With `buf` NULL only `*name_len` is set. A `buf_len` of `*name_len` or less is
/// STOKER_ERR_INVALID_ARGUMENT with `*name_len` set, so the caller can retry with more room.
/// A dataset without class names (a flat folder, a file list, shards, or more names than an
/// ATTACHED carries) is STOKER_ERR_INVALID_ARGUMENT for every index.
///
/// # Safety
/// `client` is a live client; `name_len` is writable; `buf` is NULL or writable for
/// `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_class_name(
    client: *mut stoker_client,
    index: u64,
    buf: *mut c_char,
    buf_len: usize,
    name_len: *mut usize,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let c = unsafe { handle(client, "client") }?;
        check_out(name_len, "name_len")?;
        let guard = lock(c)?;
        let a = guard.attached();
        let name = usize::try_from(index)
            .ok()
            .and_then(|i| a.class_names.get(i))
            .ok_or_else(|| match a.class_names.len() {
                0 => Failure::invalid(format!(
                    "the daemon sent no class names ({} classes): the dataset has none, or                      more than an ATTACHED carries",
                    a.classes
                )),
                n => Failure::invalid(format!("class {index} is beyond the {n} classes")),
            })?;
        // SAFETY: `name_len` is non-NULL (checked) and `buf` NULL or writable for `buf_len`
        // bytes, by the caller's promise.
        unsafe { copy_name(name, buf, buf_len, name_len) }
    })
}

/// Copies the name of skipped file `index` (a path below the dataset's root; the first few of
/// `stoker_attach_info.skipped`) into `buf` as `stoker_client_class_name` copies a class name.
/// An index past the names the daemon sent is STOKER_ERR_INVALID_ARGUMENT.
///
/// # Safety
/// `client` is a live client; `name_len` is writable; `buf` is NULL or writable for
/// `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_skipped_name(
    client: *mut stoker_client,
    index: u64,
    buf: *mut c_char,
    buf_len: usize,
    name_len: *mut usize,
) -> stoker_result {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        copy_listed_name(client, index, (buf, buf_len, name_len), |c| {
            let a = c.attached();
            (
                a.skipped_first.clone(),
                format!("({} skipped)", a.skipped),
                "skipped file",
            )
        })
    }
}

/// Copies the name of bad sample `index` (a file the daemon could not read or decode for this
/// client's job, as a path below the dataset's root; the first few, in the order met, as the
/// daemon last told them) into `buf` as `stoker_client_class_name` copies a class name. An
/// index past the names told so far is STOKER_ERR_INVALID_ARGUMENT.
///
/// # Safety
/// `client` is a live client; `name_len` is writable; `buf` is NULL or writable for
/// `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_bad_sample_name(
    client: *mut stoker_client,
    index: u64,
    buf: *mut c_char,
    buf_len: usize,
    name_len: *mut usize,
) -> stoker_result {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        copy_listed_name(client, index, (buf, buf_len, name_len), |c| {
            let bad = c.bad_samples();
            (
                bad.first.clone(),
                format!("({} bad in the job so far)", bad.count),
                "bad sample",
            )
        })
    }
}

/// Name `index` of a list of names `list` takes from the client (the names, how many there
/// are in all, and what one is called), copied as [`copy_name`] copies; an index past the
/// names is STOKER_ERR_INVALID_ARGUMENT, worded "WHAT INDEX is beyond the N named (ALL)".
///
/// # Safety
/// `client` is a live client or NULL; `name_len` is writable; `buf` is NULL or writable for
/// `buf_len` bytes.
unsafe fn copy_listed_name(
    client: *mut stoker_client,
    index: u64,
    (buf, buf_len, name_len): (*mut c_char, usize, *mut usize),
    list: impl FnOnce(&Client) -> (Vec<String>, String, &'static str),
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let c = unsafe { handle(client, "client") }?;
        check_out(name_len, "name_len")?;
        let (names, all, what) = list(&*lock(c)?);
        let name = usize::try_from(index)
            .ok()
            .and_then(|i| names.get(i))
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "{what} {index} is beyond the {} named {all}",
                    names.len()
                ))
            })?;
        // SAFETY: `name_len` is non-NULL (checked) and `buf` NULL or writable for `buf_len`
        // bytes, by the caller's promise.
        unsafe { copy_name(name, buf, buf_len, name_len) }
    })
}

/// Writes `name`'s length to `*name_len` and, unless `buf` is NULL, `name` and a NUL into
/// `buf` (refused when `buf_len` leaves no room for both).
///
/// # Safety
/// `name_len` is non-NULL and writable; `buf` is NULL or writable for `buf_len` bytes.
unsafe fn copy_name(
    name: &str,
    buf: *mut c_char,
    buf_len: usize,
    name_len: *mut usize,
) -> Result<stoker_result, Failure> {
    // SAFETY: non-NULL and writable, by this function's contract.
    unsafe { name_len.write(name.len()) };
    if buf.is_null() {
        return Ok(STOKER_OK);
    }
    if buf_len <= name.len() {
        return Err(Failure::invalid(format!(
            "buffer of {buf_len} bytes is too small for a name of {} bytes and its NUL",
            name.len()
        )));
    }
    // SAFETY: `buf` is writable for `buf_len` > name.len() bytes, by this function's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(name.as_ptr(), buf.cast::<u8>(), name.len());
        buf.add(name.len()).write(0);
    }
    Ok(STOKER_OK)
}

/// Fills `*info` (up to `info->size` bytes) with the data stall measured since the attach.
/// The client also reports it to the daemon, which shows it per rank (`stoker status`).
///
/// # Safety
/// `client` is a live client; `info` points to a `stoker_stall_info` with `size` set.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_stall(
    client: *mut stoker_client,
    info: *mut stoker_stall_info,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let c = unsafe { handle(client, "client") }?;
        check_out(info, "info")?;
        let stall = lock(c)?.stall();
        let value = stoker_stall_info {
            size: 0,
            wait_s: stall.wait.as_secs_f64(),
            compute_s: stall.compute.as_secs_f64(),
            wait_fraction: stall.wait_fraction(),
            batches: stall.batches,
            bad_samples: stall.bad_samples,
        };
        // SAFETY: non-NULL, valid for its size by the caller's promise.
        unsafe { write_versioned(info, value, "stoker_stall_info") }?;
        Ok(STOKER_OK)
    })
}

pub(super) fn lock(c: &stoker_client) -> Result<std::sync::MutexGuard<'_, Client>, Failure> {
    c.client.lock().map_err(|_| Failure {
        code: STOKER_ERR_INTERNAL,
        message: "client is unusable: an earlier call panicked while holding it".into(),
    })
}

/// Detaches and frees the client. Batches and tensors still held stay readable; their
/// releases go nowhere. NULL is ignored.
///
/// # Safety
/// `client` is NULL or a live client that no other thread is using, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn stoker_detach(client: *mut stoker_client) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if !client.is_null() {
            // SAFETY: a live handle from `stoker_attach`, detached once.
            drop(unsafe { Box::from_raw(client) });
        }
    }));
}
