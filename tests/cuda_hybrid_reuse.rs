//! `NvjpegDecoder::decode_hybrid` called for several images in a row on one stream, without
//! a synchronise between them (as `stoker selftest --gpu` and `stoker bench` decode a route's
//! images): each image's host phase writes the decoupled state's pinned buffer, which the last
//! image's transfer reads on the stream, so the decoder must wait for that transfer first. The
//! emulated stream here takes 20 ms per operation, and the emulated nvJPEG refuses a pinned
//! buffer written while its transfer is pending (rule 79). Its own binary: the delay is the
//! process's.

use stoker_nvidia::cuda::Device;
use stoker_nvidia::nvjpeg::{DeviceImage, NvjpegDecoder, NvjpegLib};
use stoker_pipeline::transform::decode::{EncodeOptions, JpegEncoder, Subsampling};
use stoker_testkit::{emulator, synthetic_rgb};

#[test]
fn hybrid_decodes_in_a_row_wait_for_the_last_transfer_not_the_caller() {
    // Read when the emulated driver starts, before anything in this process opens it.
    std::env::set_var("STOKER_EMU_OP_DELAY_US", "20000");
    emulator::use_emulator();
    let dev = Device::open(emulator::UUIDS[0].parse().unwrap()).unwrap();
    let lib = NvjpegLib::global().unwrap();
    let mut d = NvjpegDecoder::new(&dev, lib, 8).unwrap();
    let stream = dev.stream().unwrap();
    let mut enc = JpegEncoder::new().unwrap();
    let opts = EncodeOptions {
        subsampling: Subsampling::S444,
        progressive: true,
        ..EncodeOptions::default()
    };
    let (w, h) = (48u32, 32u32);
    let out = dev.alloc((w * h * 3) as usize * 3).unwrap();
    for i in 0..3u32 {
        let jpeg = enc
            .encode_rgb(&synthetic_rgb(w, h, i), w, h, &opts)
            .unwrap();
        let image = DeviceImage {
            ptr: out.ptr() + u64::from(i * w * h * 3),
            pitch: (w * 3) as usize,
        };
        // SAFETY: `out` holds three images of height * pitch bytes and outlives the stream's
        // work (synchronised below).
        let r = unsafe { d.decode_hybrid(&stream, &jpeg, None, true, image) };
        assert!(r.is_ok(), "image {i}: {r:?}");
    }
    stream.synchronize().unwrap();
}
