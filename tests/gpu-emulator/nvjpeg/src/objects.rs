//! nvJPEG's opaque objects (handles, states, streams, parameters, decoders, buffers) and the
//! record of which path decoded each image.
//!
//! # Design
//! Objects live in one registry keyed by the handle value handed out, so a handle of the wrong
//! kind or one already destroyed is `NVJPEG_STATUS_INVALID_PARAMETER`, never a wild pointer.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::decode::{OutputFormat, Planes, Roi};
use crate::header::{Header, Path, Stage};
use crate::status::{self, Status};

pub(crate) use crate::header::{
    BACKEND_DEFAULT, BACKEND_GPU_HYBRID, BACKEND_HARDWARE, BACKEND_HYBRID,
};

/// The decoder a backend's JPEGs go to.
pub(crate) fn decode_path(backend: c_int) -> Path {
    if backend == BACKEND_HARDWARE {
        Path::Hardware
    } else {
        Path::Hybrid
    }
}

pub(crate) struct HandleObj {
    pub(crate) backend: c_int,
    /// The device current when it was made: "The nvJPEG states and handles are bound to the
    /// device that was set as current during their creation."
    pub(crate) device: c_int,
    /// Made with `NVJPEG_FLAGS_BITSTREAM_STRICT`.
    pub(crate) strict: bool,
    pub(crate) engines: u32,
    pub(crate) cores: u32,
}

/// The decoupled API's progress through one image.
pub(crate) enum Phase {
    Idle,
    Host(Planes),
    Transferred(Planes),
}

pub(crate) struct StateObj {
    /// `nvjpegDecodeBatchedInitialize`: (batch size, output format); `None` before it and after
    /// a failed batched decode, which must be followed by another Initialize.
    pub(crate) batch: Option<(usize, OutputFormat)>,
    /// Batched decodes with this state enqueued on a stream and not yet run there.
    pub(crate) pending: Arc<AtomicUsize>,
    /// The attached pinned buffer's count of transfers still pending on a stream.
    pub(crate) pinned: Option<Arc<AtomicUsize>>,
    pub(crate) device: bool,
    pub(crate) phase: Phase,
    /// The decoupled phase that fails for the image in progress, and how
    /// ([`crate::header::hybrid_failure`]).
    pub(crate) doomed: Option<(Stage, Status)>,
    /// The thread that first decoded with it: states "should be instantiated separately for
    /// each thread".
    pub(crate) thread: Option<std::thread::ThreadId>,
}

impl StateObj {
    /// Whether a batched decode with this state is still waiting for its stream.
    pub(crate) fn busy(&self) -> bool {
        self.pending.load(Ordering::Acquire) > 0
    }
}

pub(crate) struct StreamObj {
    pub(crate) data: Vec<u8>,
    pub(crate) header: Header,
}

#[derive(Clone, Copy)]
pub(crate) struct ParamsObj {
    pub(crate) format: OutputFormat,
    pub(crate) roi: Option<Roi>,
}

pub(crate) enum Object {
    Handle(HandleObj),
    State(StateObj),
    Stream(Option<StreamObj>),
    Params(ParamsObj),
    Decoder(c_int),
    /// A pinned buffer: its transfers (`nvjpegDecodeJpegTransferToDevice`) still pending on a
    /// stream, which read it.
    Pinned(Arc<AtomicUsize>),
    Device,
}

#[derive(Default)]
pub(crate) struct Registry {
    next: usize,
    pub(crate) objects: HashMap<usize, Object>,
    /// FNV-1a of an image's bytes -> the path that last decoded it.
    pub(crate) paths: HashMap<u64, Path>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

pub(crate) struct Reg(MutexGuard<'static, Option<Registry>>);

impl std::ops::Deref for Reg {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        self.0.as_ref().expect("made in reg()")
    }
}
impl std::ops::DerefMut for Reg {
    fn deref_mut(&mut self) -> &mut Registry {
        self.0.as_mut().expect("made in reg()")
    }
}

pub(crate) fn reg() -> Reg {
    let mut g = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(Registry::default);
    Reg(g)
}

/// Handles look like pointers but are never dereferenced.
const BASE: usize = 0x6e76_0000_0000;

impl Registry {
    pub(crate) fn insert(&mut self, o: Object) -> *mut c_void {
        self.next += 1;
        let h = BASE + self.next * 16;
        self.objects.insert(h, o);
        h as *mut c_void
    }

    pub(crate) fn remove(
        &mut self,
        h: *mut c_void,
        same_kind: fn(&Object) -> bool,
    ) -> Result<(), Status> {
        match self.objects.get(&(h as usize)) {
            Some(o) if same_kind(o) => {
                self.objects.remove(&(h as usize));
                Ok(())
            }
            _ => Err(status::INVALID_PARAMETER),
        }
    }

    pub(crate) fn get(&mut self, h: *mut c_void) -> Result<&mut Object, Status> {
        self.objects
            .get_mut(&(h as usize))
            .ok_or(status::INVALID_PARAMETER)
    }

    pub(crate) fn handle(&mut self, h: *mut c_void) -> Result<&mut HandleObj, Status> {
        match self.get(h)? {
            Object::Handle(x) => Ok(x),
            _ => Err(status::INVALID_PARAMETER),
        }
    }

    pub(crate) fn state(&mut self, h: *mut c_void) -> Result<&mut StateObj, Status> {
        match self.get(h)? {
            Object::State(x) => Ok(x),
            _ => Err(status::INVALID_PARAMETER),
        }
    }

    /// A stream that was parsed (`nvjpegJpegStreamParse[Header]`).
    pub(crate) fn stream(&mut self, h: *mut c_void) -> Result<&StreamObj, Status> {
        match self.get(h)? {
            Object::Stream(Some(x)) => Ok(x),
            _ => Err(status::INVALID_PARAMETER),
        }
    }

    pub(crate) fn params(&mut self, h: *mut c_void) -> Result<&mut ParamsObj, Status> {
        match self.get(h)? {
            Object::Params(x) => Ok(x),
            _ => Err(status::INVALID_PARAMETER),
        }
    }

    pub(crate) fn decoder(&mut self, h: *mut c_void) -> Result<c_int, Status> {
        match self.get(h)? {
            Object::Decoder(b) => Ok(*b),
            _ => Err(status::INVALID_PARAMETER),
        }
    }

    /// Refuses `call` with handle `h` made for another device than the current one: "Using
    /// these states and handles with another device set as current is undefined".
    pub(crate) fn on_device(&mut self, h: *mut c_void, call: &str) -> Result<(), Status> {
        let made_on = self.handle(h)?.device;
        let (current, _, _) = crate::cuda::current_device()?;
        if made_on == current {
            return Ok(());
        }
        undefined(
            call,
            &format!("a handle made on device {made_on} used with device {current} current"),
        )
    }

    /// [`Registry::on_device`], and refuses a decoding call with a state another thread
    /// decoded with first: states "should be instantiated separately for each thread" (made
    /// and pre-allocated on one thread, a state may be handed to the thread that decodes).
    pub(crate) fn bound(
        &mut self,
        h: *mut c_void,
        state: *mut c_void,
        call: &str,
    ) -> Result<&mut StateObj, Status> {
        self.on_device(h, call)?;
        let me = std::thread::current().id();
        let s = self.state(state)?;
        if s.thread.is_some_and(|t| t != me) {
            undefined(call, "a JPEG state decoded with by a second thread")?;
        }
        s.thread = Some(me);
        Ok(s)
    }

    pub(crate) fn record(&mut self, jpeg: &[u8], path: Path) {
        self.paths.insert(fnv1a(jpeg), path);
    }
}

pub(crate) fn undefined(call: &str, why: &str) -> Result<(), Status> {
    eprintln!("stoker nvJPEG emulator: {call}: {why}; undefined on a real library");
    Err(status::INVALID_PARAMETER)
}

pub(crate) fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}
