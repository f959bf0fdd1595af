//! stoker's nvJPEG binding (`stoker_nvidia::nvjpeg`) on the emulated GPU: batched decode on
//! the (emulated) hardware engines, the decoupled GPU-hybrid path, ROI, against stoker's CPU
//! decoder upsampling chroma as nvJPEG does on the shared photos (PSNR >= 40 dB each), and the edge corpus sorted into
//! hardware, hybrid and refused by nvJPEG's rules. Skips loudly without `../shared/data`.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use stoker_testkit::edge_manifest;
use stoker_testkit::emulator;

use std::path::{Path, PathBuf};

use emulator::*;
use stoker_kernels::reference::{psnr, RgbImage};
use stoker_nvidia::cuda::{Device, DeviceBuffer, Stream};
use stoker_nvidia::nvjpeg::{DeviceImage, NvjpegDecoder, NvjpegLib, Roi};
use stoker_pipeline::transform::decode::routing::{self, is_progressive, Route};
use stoker_pipeline::transform::decode::{CpuDecoder, Limits};

fn shared_data() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    if dir.join("edge/MANIFEST.tsv").is_file() && dir.join("photos").is_dir() {
        return Some(dir);
    }
    eprintln!("SKIPPED gpu_emulator_nvjpeg: no {}", dir.display());
    None
}

fn decoder() -> (Device, NvjpegDecoder, Stream) {
    use_emulator();
    let dev = Device::open(UUIDS[0].parse().unwrap()).unwrap_or_else(|e| panic!("{e}"));
    let lib = NvjpegLib::global().unwrap_or_else(|e| panic!("{e}"));
    let d = NvjpegDecoder::new(&dev, lib, 8).unwrap_or_else(|e| panic!("{e}"));
    let s = dev.stream().unwrap();
    (dev, d, s)
}

/// Which path decoded these bytes, as the emulator recorded it (1 hardware, 2 hybrid).
fn recorded_path(jpeg: &[u8]) -> i32 {
    type PathFn = unsafe extern "C" fn(*const u8, usize) -> i32;
    let lib = std::env::var_os("STOKER_NVJPEG").unwrap();
    // SAFETY: the emulated nvJPEG, already loaded by this process; the signature is its own.
    unsafe {
        let l = libloading::Library::new(lib).unwrap();
        let f: PathFn = *l.get(b"stoker_emu_nvjpeg_path").unwrap();
        f(jpeg.as_ptr(), jpeg.len())
    }
}

/// The CPU decoder's image, cut to `roi`.
fn cpu_reference(cpu: &mut CpuDecoder, jpeg: &[u8], roi: Option<Roi>) -> Option<Vec<u8>> {
    let mut img = RgbImage::default();
    cpu.decode_full(jpeg, &mut img).ok()?;
    let r = roi.unwrap_or(Roi {
        x: 0,
        y: 0,
        width: img.width,
        height: img.height,
    });
    let mut out = Vec::with_capacity((r.width * r.height * 3) as usize);
    for y in r.y..r.y + r.height {
        let start = ((y * img.width + r.x) * 3) as usize;
        out.extend_from_slice(&img.data[start..start + (r.width * 3) as usize]);
    }
    Some(out)
}

/// One image to decode: its bytes, ROI and output buffer.
struct Job {
    name: String,
    jpeg: Vec<u8>,
    roi: Option<Roi>,
    out: DeviceBuffer,
    width: u32,
    height: u32,
}

fn job(dev: &Device, d: &NvjpegDecoder, name: String, jpeg: Vec<u8>, i: usize) -> Job {
    let info = d.info(&jpeg).unwrap_or_else(|e| panic!("{name}: {e}"));
    // Every other image with a region of interest off the centre.
    let roi = (i % 2 == 1 && info.width > 8 && info.height > 8).then_some(Roi {
        x: info.width / 5,
        y: info.height / 7,
        width: info.width / 2,
        height: info.height / 2,
    });
    let (width, height) = roi.map_or((info.width, info.height), |r| (r.width, r.height));
    let out = dev.alloc(width as usize * height as usize * 3).unwrap();
    Job {
        name,
        jpeg,
        roi,
        out,
        width,
        height,
    }
}

/// The CPU decoder upsampling chroma by replication, as nvJPEG does (docs/cuda.md, "First GPU
/// run").
fn plain_cpu_decoder() -> CpuDecoder {
    let mut cpu = CpuDecoder::new(Limits::default()).unwrap();
    cpu.set_fast_upsample(true).unwrap();
    cpu
}

fn check(job: &Job, cpu: &mut CpuDecoder) {
    let mut got = vec![0u8; job.width as usize * job.height as usize * 3];
    job.out.read(&mut got).unwrap();
    let want = cpu_reference(cpu, &job.jpeg, job.roi)
        .unwrap_or_else(|| panic!("{}: the CPU decoder refused what nvJPEG took", job.name));
    let p = psnr(&got, &want);
    assert!(p >= 40.0, "{}: PSNR {p:.1} dB", job.name);
}

#[test]
fn photos_decode_on_the_hardware_path_as_the_cpu_decoder_does() {
    let Some(data) = shared_data() else { return };
    let (dev, mut d, stream) = decoder();
    assert!(d.has_hardware());
    assert_eq!(d.hardware_info(), (7, 1));
    let mut cpu = plain_cpu_decoder();
    let mut names: Vec<PathBuf> = std::fs::read_dir(data.join("photos"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let (mut hardware, mut hybrid) = (0, 0);
    for chunk in names.chunks(d.hardware_batch()) {
        let jobs: Vec<Job> = chunk
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                job(&dev, &d, name, std::fs::read(p).unwrap(), i)
            })
            .collect();
        let (hw, rest): (Vec<&Job>, Vec<&Job>) = jobs
            .iter()
            .partition(|j| d.hardware_supports(&j.jpeg, j.roi).unwrap());
        if !hw.is_empty() {
            let jpegs: Vec<&[u8]> = hw.iter().map(|j| j.jpeg.as_slice()).collect();
            let rois: Vec<Option<Roi>> = hw.iter().map(|j| j.roi).collect();
            let outs: Vec<DeviceImage> = hw
                .iter()
                .map(|j| DeviceImage {
                    ptr: j.out.ptr(),
                    pitch: (j.width * 3) as usize,
                })
                .collect();
            // SAFETY: each output buffer holds height * pitch bytes and lives until the
            // stream is synchronised below; each image was accepted with its ROI.
            unsafe { d.decode_hardware_batch(&stream, &jpegs, &rois, &outs) }.unwrap();
        }
        for j in &rest {
            assert!(
                d.hybrid_supports(&j.jpeg, j.roi, is_progressive(&j.jpeg))
                    .unwrap(),
                "{}",
                j.name
            );
            let out = DeviceImage {
                ptr: j.out.ptr(),
                pitch: (j.width * 3) as usize,
            };
            // SAFETY: as above.
            unsafe { d.decode_hybrid(&stream, &j.jpeg, j.roi, is_progressive(&j.jpeg), out) }
                .unwrap();
        }
        stream.synchronize().unwrap();
        for j in &jobs {
            check(j, &mut cpu);
        }
        for j in &hw {
            assert_eq!(recorded_path(&j.jpeg), 1, "{}", j.name);
        }
        for j in &rest {
            assert_eq!(recorded_path(&j.jpeg), 2, "{}", j.name);
        }
        hardware += hw.len();
        hybrid += rest.len();
    }
    eprintln!("photos: {hardware} on the hardware path, {hybrid} hybrid");
    assert!(hardware > 0 && hardware + hybrid == names.len());
}

/// Where the edge file goes by the engine's rule (`stoker_pipeline::transform::decode::routing::route`):
/// "hardware", "hybrid" or "refused" (the CPU decoder's).
fn route(d: &mut NvjpegDecoder, jpeg: &[u8]) -> &'static str {
    if d.info(jpeg).is_err() {
        return "refused";
    }
    match routing::route(d, jpeg, None, true).route {
        Route::Hardware => "hardware",
        Route::Hybrid => "hybrid",
        Route::Cpu => "refused",
    }
}

#[test]
fn edge_files_are_sorted_into_hardware_hybrid_and_refused() {
    let Some(data) = shared_data() else { return };
    let edge = data.join("edge");
    let (dev, mut d, stream) = decoder();
    let mut cpu = plain_cpu_decoder();
    let mut table = std::collections::BTreeMap::<&str, Vec<String>>::new();
    for (name, _) in edge_manifest::read(&edge) {
        let jpeg = std::fs::read(edge.join(&name)).unwrap();
        let kind = name.split("__").next().unwrap().to_string();
        let r = route(&mut d, &jpeg);
        // What a real nvJPEG got wrong goes to the CPU whatever its kind.
        let observed = routing::header::parse(&jpeg)
            .and_then(|h| routing::header_refusal(&h))
            .is_some();
        let rule = match kind.as_str() {
            _ if observed => Some("refused"),
            "baseline" => Some("hardware"),
            "prog" => Some("hybrid"),
            "12bit" | "arith" | "lossless" | "cmyk" | "notjpeg" => Some("refused"),
            _ => None,
        };
        if let Some(rule) = rule {
            assert_eq!(r, rule, "{name}");
        }
        table.entry(r).or_default().push(name.clone());
        let pixels = d
            .info(&jpeg)
            .map_or(0, |i| u64::from(i.width) * u64::from(i.height));
        if r == "refused" || pixels > Limits::default().max_pixels {
            continue;
        }
        // What a path takes, it decodes as the CPU decoder does, or refuses as a bad image
        // where the CPU decoder refuses too.
        let j = job(&dev, &d, name.clone(), jpeg, 0);
        let out = DeviceImage {
            ptr: j.out.ptr(),
            pitch: (j.width * 3) as usize,
        };
        // SAFETY: the buffer holds height * pitch bytes until the stream is synchronised.
        let decoded = unsafe {
            if r == "hardware" {
                d.decode_hardware_batch(&stream, &[&j.jpeg], &[None], &[out])
            } else {
                d.decode_hybrid(&stream, &j.jpeg, None, is_progressive(&j.jpeg), out)
            }
        };
        stream.synchronize().unwrap();
        match (decoded, cpu_reference(&mut cpu, &j.jpeg, None)) {
            (Ok(()), Some(_)) => check(&j, &mut cpu),
            (Err(e), None) => assert!(e.is_bad_image(), "{name}: {e}"),
            (Ok(()), None) => {
                eprintln!("{name}: nvJPEG emulator decoded what the CPU decoder's limits refuse")
            }
            (Err(e), Some(_)) => panic!("{name}: the CPU decoder took it, nvJPEG failed: {e}"),
        }
    }
    for (route, files) in &table {
        eprintln!("{route}: {} files", files.len());
    }
    assert!(table.len() == 3, "every route is exercised: {table:?}");
}

/// SOI and a baseline frame header of `width` x `height` with three components sampled
/// `sampling` ((h, v) each): enough for `nvjpegGetImageInfo`.
fn frame_header(width: u16, height: u16, sampling: [(u8, u8); 3]) -> Vec<u8> {
    let mut b = vec![0xff, 0xd8, 0xff, 0xc0, 0, 17, 8];
    b.extend_from_slice(&height.to_be_bytes());
    b.extend_from_slice(&width.to_be_bytes());
    b.push(3);
    for (id, (h, v)) in sampling.into_iter().enumerate() {
        b.extend_from_slice(&[id as u8 + 1, (h << 4) | v, 0]);
    }
    b
}

#[test]
fn info_sizes_outputs_from_the_largest_component() {
    let (_dev, d, _stream) = decoder();
    // Chroma (Cb) sampled finer than luma: component 0 is half the image's size.
    let finer = frame_header(100, 60, [(1, 1), (2, 2), (1, 1)]);
    let info = d.info(&finer).unwrap();
    assert_eq!((info.width, info.height, info.components), (100, 60, 3));
    // Ordinary 4:2:0: luma is the largest.
    let usual = frame_header(101, 61, [(2, 2), (1, 1), (1, 1)]);
    let info = d.info(&usual).unwrap();
    assert_eq!((info.width, info.height), (101, 61));
    // Not a JPEG: a bad-image error naming the call.
    let e = d.info(b"not a jpeg").unwrap_err();
    assert!(e.is_bad_image(), "{e}");
    assert!(e.to_string().contains("nvjpegGetImageInfo"), "{e}");
}

/// A decoder opened on an emulated GPU set up by `config` (JSON) and `faults`, in this
/// (child) process.
fn open_with(config: Option<&str>, faults: Option<&str>) -> Result<NvjpegDecoder, String> {
    use_emulator();
    if let Some(c) = config {
        std::env::set_var("STOKER_EMU_CONFIG", c);
    }
    if let Some(f) = faults {
        std::env::set_var("STOKER_EMU_FAULTS", f);
    }
    let dev = Device::open(UUIDS[0].parse().unwrap()).map_err(|e| e.to_string())?;
    let lib = NvjpegLib::global().map_err(|e| e.to_string())?;
    NvjpegDecoder::new(&dev, lib, 8).map_err(|e| e.to_string())
}

#[test]
fn only_arch_mismatch_or_a_zero_sized_engine_means_no_hardware_decoder() {
    let test = "only_arch_mismatch_or_a_zero_sized_engine_means_no_hardware_decoder";
    let device = |engines: u32, cores: u32| {
        format!(
            r#"{{"devices": [{{"uuid": "{}", "jpeg_engines": {engines}, "jpeg_cores_per_engine": {cores}}}]}}"#,
            UUIDS[0]
        )
    };
    match emulator::child_role().as_deref() {
        Some("arch-mismatch") => {
            // No engines: nvjpegCreateEx(HARDWARE) is ARCH_MISMATCH, the default backend serves.
            let d = open_with(Some(&device(0, 1)), None).unwrap();
            assert!(!d.has_hardware());
        }
        Some("no-cores") => {
            // A hardware handle reporting 0 cores has no hardware decoder.
            let mut d = open_with(Some(&device(2, 0)), None).unwrap();
            assert!(!d.has_hardware(), "engines x cores {:?}", d.hardware_info());
            assert_eq!(d.hardware_info(), (0, 0));
            let jpeg = stoker_testkit::encode_jpeg(&vec![128; 32 * 16 * 3], 32, 16, 90);
            let r = routing::route(&mut d, &jpeg, None, true);
            assert_eq!(r.route, Route::Hybrid);
        }
        Some("failed") => {
            // nvjpegCreateEx(HARDWARE) failing otherwise (the emulated library cannot read the
            // current device: EXECUTION_FAILED) is an error, not a quiet fall-back.
            let fault = "cuCtxGetDevice:1:CUDA_ERROR_INVALID_CONTEXT";
            let e = open_with(None, Some(fault))
                .map(|d| format!("opened, hardware {}", d.has_hardware()))
                .unwrap_err();
            assert!(e.contains("NVJPEG_STATUS_EXECUTION_FAILED"), "{e}");
        }
        _ => {
            for role in ["arch-mismatch", "no-cores", "failed"] {
                let out = emulator::run_child(test, role, &[]);
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success() && stdout.contains("1 passed"),
                    "{role}:\n{stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}
