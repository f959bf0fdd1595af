//! `stoker decode FILE -o out.ppm`: decode one image of any format stoker decodes (by its
//! content) at full size and write it as binary PPM.

#![forbid(unsafe_code)]

use crate::cli::Exit;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use stoker_kernels::image::RgbImage;

use stoker_pipeline::source::local::fsopen::open_input;
use stoker_pipeline::transform::decode::{CpuDecoder, DecodeError, Limits};

/// Arguments of `stoker decode`.
#[derive(Debug, clap::Args)]
pub struct DecodeArgs {
    /// The image to decode: JPEG, PNG, WebP, BMP, TIFF or PPM/PGM, told by its content.
    pub(crate) file: PathBuf,
    /// Where to write the decoded image (binary PPM, P6).
    #[arg(short, long)]
    pub(crate) output: PathBuf,
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

/// Why `stoker decode` failed.
#[derive(Debug, thiserror::Error)]
enum DecodeFileError {
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Decoder(DecodeError),
    #[error("{}: {source} ({})", .path.display(), .source.reason())]
    Decode { path: PathBuf, source: DecodeError },
    #[error("{}: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn decode_to_ppm(file: &Path, output: &Path) -> Result<(u32, u32), DecodeFileError> {
    let mut bytes = Vec::new();
    open_input(file)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| DecodeFileError::Read {
            path: file.to_owned(),
            source,
        })?;
    let mut decoder = CpuDecoder::new(Limits::default()).map_err(DecodeFileError::Decoder)?;
    let mut img = RgbImage::default();
    decoder
        .decode_full(&bytes, &mut img)
        .map_err(|source| DecodeFileError::Decode {
            path: file.to_owned(),
            source,
        })?;
    write_ppm(output, &img).map_err(|source| DecodeFileError::Write {
        path: output.to_owned(),
        source,
    })?;
    Ok((img.width, img.height))
}

/// Writes `img` as a binary PPM (P6, maxval 255).
pub(crate) fn write_ppm(path: &Path, img: &RgbImage) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    write!(f, "P6\n{} {}\n255\n", img.width, img.height)?;
    f.write_all(&img.data)?;
    f.flush()
}
