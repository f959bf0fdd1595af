//! `stoker decode FILE -o out.ppm`: decode one JPEG at full size and write it as binary PPM.

use crate::cli::Exit;
use std::io::Write;
use std::path::{Path, PathBuf};

use stoker_kernels::reference::RgbImage;

use stoker_daemon::transform::decode::{CpuDecoder, Limits};

/// Arguments of `stoker decode`.
#[derive(Debug, clap::Args)]
pub struct DecodeArgs {
    /// The JPEG file to decode.
    pub file: PathBuf,
    /// Where to write the decoded image (binary PPM, P6).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Runs `stoker decode`; returns the exit code.
pub fn run(args: &DecodeArgs) -> Exit {
    match decode_to_ppm(&args.file, &args.output) {
        Ok((w, h)) => {
            println!(
                "{}: {w}x{h} -> {}",
                args.file.display(),
                args.output.display()
            );
            Exit::Ok
        }
        Err(msg) => {
            eprintln!("stoker decode: {msg}");
            Exit::Failure
        }
    }
}

fn decode_to_ppm(file: &Path, output: &Path) -> Result<(u32, u32), String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut decoder = CpuDecoder::new(Limits::default()).map_err(|e| e.to_string())?;
    let mut img = RgbImage::default();
    decoder
        .decode_full(&bytes, &mut img)
        .map_err(|e| format!("{}: {} ({})", file.display(), e, e.reason()))?;
    write_ppm(output, &img).map_err(|e| format!("{}: {e}", output.display()))?;
    Ok((img.width, img.height))
}

/// Writes `img` as a binary PPM (P6, maxval 255).
pub fn write_ppm(path: &Path, img: &RgbImage) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    write!(f, "P6\n{} {}\n255\n", img.width, img.height)?;
    f.write_all(&img.data)?;
    f.flush()
}
