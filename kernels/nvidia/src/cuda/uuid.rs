//! A GPU's UUID: the only way stoker names a device.

use std::fmt;
use std::str::FromStr;

use super::CudaError;

/// A GPU's UUID, the only way stoker names a device (`CUDA_VISIBLE_DEVICES` renumbers ordinals).
/// Formats as nvidia-smi does: `GPU-` and lowercase 8-4-4-4-12 hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuUuid(pub [u8; 16]);

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(f, "GPU-")?;
        for (i, byte) in b.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                write!(f, "-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for GpuUuid {
    type Err = CudaError;

    /// Accepts `GPU-` + 8-4-4-4-12 hex digits, either case; the `GPU-` prefix is required so a
    /// MIG UUID or an ordinal is never taken for a GPU.
    fn from_str(s: &str) -> Result<GpuUuid, CudaError> {
        let bad = || CudaError::BadUuid(s.to_string());
        let rest = s
            .strip_prefix("GPU-")
            .or_else(|| s.strip_prefix("gpu-"))
            .ok_or_else(bad)?;
        let groups: Vec<&str> = rest.split('-').collect();
        if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
            return Err(bad());
        }
        let hex: String = groups.concat();
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(GpuUuid(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip_in_nvidia_smi_form() {
        let s = "GPU-5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
        let u: GpuUuid = s.parse().unwrap();
        assert_eq!(u.0[0], 0x5e);
        assert_eq!(u.0[15], 0xf6);
        assert_eq!(u.to_string(), s);
        let upper: GpuUuid = "GPU-5E2F0D8A-1B2C-4D3E-8F90-A1B2C3D4E5F6".parse().unwrap();
        assert_eq!(upper, u);
    }

    #[test]
    fn bad_uuids_are_rejected() {
        for s in [
            "0",
            "5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
            "MIG-5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
            "GPU-5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f",
            "GPU-5e2f0d8a1b2c-4d3e-8f90-a1b2c3d4e5f6-",
            "GPU-zz2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
            "GPU-é2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
        ] {
            assert!(
                matches!(s.parse::<GpuUuid>(), Err(CudaError::BadUuid(_))),
                "{s}"
            );
        }
    }
}
