//! The `.cu` sources built into this binary, compiled at run time by NVRTC
//! ([`stoker_nvidia::nvrtc`]).

#![forbid(unsafe_code)]

use stoker_nvidia::nvrtc::KernelSource;

/// The fused crop-resize-flip-normalise-convert kernel and the test kernels.
pub const AUGMENT_CU: KernelSource = KernelSource {
    name: "augment.cu",
    source: include_str!("../cu/augment.cu"),
};

/// Every kernel source built into this binary.
pub const ALL_SOURCES: &[KernelSource] = &[AUGMENT_CU];
